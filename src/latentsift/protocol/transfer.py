"""The transfer matrix: which agents' trajectories make a bank that works on another agent's pools.

Evaluation sets (``eval_sets``): the pools of each agent alone where it wrote two or more candidates
per instance, the pools of several agents where no agent did (e.g. the Verified pairs, one
candidate per agent and instance) and the mixed pools of several agents where pools hold K >= 4
candidates (for retention). Every bank leaves out each agent with candidates in the evaluated
pools (leave-the-evaluated-agents-out), and every bank is disjoint from the pools it scores by the fold
group (``group_by``: repository, the default, or instance, for one repository or none, e.g. two policies
on the same tasks): the evaluated groups are split into ``n_folds`` folds (``bank.split_by_repo``) and
the pools of a fold are scored by banks and scorers built from the other groups only.

Bank configurations per evaluation set: ``all`` (every other agent pooled), ``nearest`` (per pool,
the single-agent sub-bank with the smallest median nearest-bank distance of the pool's candidates,
``library.nearest_choice``), and each single other agent (``agent:<name>``); next to the baselines
shortest-in-characters, fewest steps and random. Scores: the paper's distance branch (s_dist) and
the paper's method (s_dist fused with the learned branch, when ``scorer_epochs`` > 0).

Metrics: within-pool AUC over mixed pools with the 95% bootstrap interval over instances and the
paired difference to shortest-in-characters (``diagnostics.diagnostics_table``); retention (a
resolved candidate survives Stage 1 among seeded draws of K candidates that hold one) where pools
hold K >= 4, with its bootstrap interval (``evaluate.mean_ci``). Two-candidate pools keep both
candidates at Stage 1 (max(3, floor(K/2))), so they are measured by AUC only.

The shift guard's flags (``shift_eval.pool_flags``) of the ``all`` bank on the pools it scores: the share
of pools the distance check flags (threshold at the ``1 - FALSE_ALARM`` quantile of the bank's own pools
left out by repository, or by instance when folds are by instance) and the name check flags (an agent
absent from the bank: always, for another agent's pools), with bootstrap intervals over pools.

    OUT/summary.json   settings, evaluation sets, per set and configuration: AUC (+ interval), retention
    OUT/report.md      the tables and the bank-choice verdict
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from .._core.threads import blas_fixed
from .._core.words import VERDICT_BANK
from .._core.validation import LatentSiftError, check_choice, check_positive_int
from ..bank.bank import Bank, split_by_repo
from ..metrics.diagnostics import auc_difference_ci, interval_outcome
from ..metrics.score_table import diagnostics_table
from ..metrics.bootstrap import bootstrap_indices, draw_subsets, instance_seed, mean_ci
from ..deploy.library import SubBank, fit_sub_bank, load_runs, nearest_choice, pool_distances
from ..deploy.shift import FALSE_ALARM, REFERENCE_KIND, Reference, scaffold_of
from ..sift.retain import MIN_KEEP
from ..sift.rules import REFERENCE, filter_entry, make_baseline, rule_keys
from ..sift.sift import LatentSift, Stage1Filter
from ..states.states import TrajectoryStates
from ..trajectories.trajectory import Pool, Trajectory, group_pools
from .folds import group_noun, group_of
from .shift_eval import flag_rate, pool_flags

def baseline_names() -> tuple[str, ...]:
    """The rule filters of the matrix: those computed from the trajectories alone, in the tables' order (the
    premise's free references, built in premise runs only, are not among them; read when the matrix is made:
    listing them loads the plugins, which importing the command line must not)."""
    return tuple(filter_entry(k).name for k in rule_keys()
                 if not filter_entry(k).tokenizer and not filter_entry(k).premise_only)


RETENTION_MIN_K = MIN_KEEP + 1  # retention is reported where pools hold K >= 4 (smaller pools keep max(3, .) = all)
TRANSFER_GROUP_BY = ("repo", "instance")  # by agent would be the evaluated agents themselves


@dataclass
class TransferSettings:
    """Settings of the transfer matrix (recorded in summary.json)."""

    pools: list[str]
    states: list[str]
    out: str
    n_folds: int = 4
    ks: tuple[int, ...] = (4, 6)
    n_draws: int = 50
    n_boot: int = 1000
    seed: int = 0
    scorer_epochs: int = 40
    group_by: str = "repo"

    def __post_init__(self):
        for name in ("n_folds", "n_draws", "n_boot"):
            check_positive_int(getattr(self, name), name, "transfer")
        check_choice(self.group_by, "group_by", "transfer", TRANSFER_GROUP_BY)
        if self.scorer_epochs < 0:
            raise LatentSiftError(f"transfer: scorer_epochs must be >= 0 (0 = distance branch only). "
                                  f"Got {self.scorer_epochs}.")
        self.ks = tuple(check_positive_int(k, "ks", "transfer") for k in self.ks)


@dataclass
class EvalSet:
    """Pools scored together and the agents whose trajectories their banks must leave out."""

    name: str
    agents: list[str]
    pools: list[Pool]

    def describe(self) -> dict:
        ks = sorted({len(p.candidates) for p in self.pools})
        mixed = sum(len({c.label for c in p.candidates}) == 2 for p in self.pools)
        return {"name": self.name, "agents": self.agents, "n_pools": len(self.pools), "k": ks,
                "n_mixed_pools": mixed, "repos": sorted({p.candidates[0].repo for p in self.pools})}


def eval_sets(trajs: Sequence[Trajectory], sources: Mapping[str, int] | None = None) -> list[EvalSet]:
    """Per agent, its own pools where it wrote >= 2 candidates per instance; per group of agents that
    share instances, their joint pools when no single agent's pools have 2 candidates (pairs) or
    when the joint pools reach K >= RETENTION_MIN_K (mixed pools, for retention). ``sources``
    (traj_id -> pools file index): joint pools are formed within one pools file (an instance in two
    datasets stays two pools)."""
    by_agent: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_agent.setdefault(t.agent, []).append(t)
    out, single = [], set()
    for a, ts in sorted(by_agent.items()):
        ps = [p for p in group_pools(ts) if len(p.candidates) >= 2]
        if ps:
            out.append(EvalSet(f"{a} pools", [a], ps))
            single.add(a)
    # joint pools: agents connected by sharing pools of the same source (same set of runs per instance)
    joint: dict[tuple[str, ...], list[Pool]] = {}
    by_source: dict[int, list[Trajectory]] = {}
    for t in trajs:
        by_source.setdefault(0 if sources is None else sources[t.traj_id], []).append(t)
    for p in (p for _, ts in sorted(by_source.items()) for p in group_pools(ts)):
        agents = tuple(sorted({c.agent for c in p.candidates}))
        if len(agents) >= 2:
            joint.setdefault(agents, []).append(p)
    for agents, ps in sorted(joint.items()):
        kmax = max(len(p.candidates) for p in ps)
        if not set(agents) <= single or kmax >= RETENTION_MIN_K:
            out.append(EvalSet(" + ".join(agents) + " pools", list(agents), ps))
    return out


# ---------------------------------------------------------------------- one configuration on one set
def _fit_latentsift(trajs: Sequence[Trajectory], states, fp, s: TransferSettings, name: str) -> LatentSift:
    if s.scorer_epochs == 0:
        bank = Bank.from_trajectories(trajs, states, fp)
        return LatentSift(bank, None, branches="distance", seed=s.seed, n_evidence=0)
    sub = fit_sub_bank(name, trajs, states, fp, scorer_epochs=s.scorer_epochs, seed=s.seed)
    return LatentSift(sub.bank, sub.scorer, seed=s.seed, n_evidence=0)


def _usable(trajs: Sequence[Trajectory]) -> bool:
    n_pos = sum(int(t.label) for t in trajs)
    return 0 < n_pos < len(trajs)


class _Scored:
    """Per evaluated pool: the filter that scores it and its prepared quantities."""

    def __init__(self):
        self.filters: dict[str, Stage1Filter] = {}
        self.prepared: dict = {}

    def add(self, filt: Stage1Filter, pools: Sequence[Pool], states, fp) -> None:
        if not pools:
            return
        prep = filt.prepare_many(pools, states, fingerprint=fp)
        for iid, p in prep.items():
            self.filters[iid], self.prepared[iid] = filt, p

    def scores(self, branch: str | None = None) -> dict[str, float]:
        """traj_id -> s over the whole pool (``branch="distance"``: s_dist of a fused filter)."""
        out = {}
        for iid, p in self.prepared.items():
            f = self.filters[iid]
            rk = f._rank(p, np.arange(len(p.traj_ids)))
            v = rk["s_dist"] if branch == "distance" and "s_dist" in rk else rk["s"]
            out |= {t: float(x) for t, x in zip(p.traj_ids, v)}
        return out


def _retention(scored: _Scored, pools: Sequence[Pool], k: int, s: TransferSettings) -> dict | None:
    """Mean over instances of P(a resolved candidate is retained | the draw of K holds one), with CI."""
    vals, ids = [], []
    for p in sorted(pools, key=lambda p: p.instance_id):
        if len(p.candidates) < k or p.instance_id not in scored.prepared:
            continue
        prep = scored.prepared[p.instance_id]
        lab = {c.traj_id: int(c.label) for c in p.candidates}
        tids = prep.traj_ids
        subs, _ = draw_subsets(len(tids), k, s.n_draws, instance_seed(s.seed, k, p.instance_id))
        hits = []
        for sub in subs:
            ids_k = [tids[i] for i in sub]
            if not any(lab[t] for t in ids_k):
                continue
            kept = scored.filters[p.instance_id].retained_subset(prep, ids_k)
            hits.append(float(any(lab[t] for t in kept)))
        if hits:
            vals.append(float(np.mean(hits)))
            ids.append(p.instance_id)
    if not vals:
        return None
    boot = bootstrap_indices(len(vals), s.n_boot, np.random.default_rng(s.seed))
    return {**mean_ci(np.array(vals), boot), "n_instances": len(vals)}


def evaluate_set(es: EvalSet, trajs: Sequence[Trajectory], states: Mapping[str, TrajectoryStates], fp,
                 s: TransferSettings, log: Callable[[str], None] = lambda m: None) -> dict:
    """Every bank configuration and baseline on one evaluation set (repository folds, see module doc)."""
    others = sorted({t.agent for t in trajs} - set(es.agents))
    eval_ids = {c.traj_id for p in es.pools for c in p.candidates}
    groups = {c.traj_id: group_of(c, s.group_by) for p in es.pools for c in p.candidates}
    n_groups = len(set(groups.values()))
    if n_groups < 2:
        raise LatentSiftError(f"transfer: the pools of {es.name} come from one {group_noun(s.group_by, 1)}; folds "
                              f"need two or more (use --group-by instance for one repository).")
    if s.n_folds > n_groups:   # said, not silently fewer
        log(f"[transfer] {es.name}: --folds {s.n_folds} is more than its {n_groups} {group_noun(s.group_by)}; "
            f"{n_groups} folds (one {group_noun(s.group_by, 1)} each).")
    folds = split_by_repo(groups, n_folds=min(s.n_folds, n_groups), seed=s.seed)
    configs = ["all", "nearest"] + [f"agent:{a}" for a in others]
    scored = {c: _Scored() for c in configs}
    choices: dict[str, dict] = {}
    kind = "instance" if s.group_by == "instance" else REFERENCE_KIND
    flags: list[dict] = []
    for k, (_, fold_repos) in enumerate(folds):
        fold_repos = set(fold_repos)
        pools = [p for p in es.pools if group_of(p.candidates[0], s.group_by) in fold_repos]
        bank_trajs = [t for t in trajs if t.agent in others and group_of(t, s.group_by) not in fold_repos
                      and t.traj_id not in eval_ids]
        log(f"[transfer] {es.name}: fold {k + 1}/{len(folds)} ({len(pools)} pools; bank {len(bank_trajs)} "
            f"trajectories of {others})")
        if _usable(bank_trajs):
            filt = _fit_latentsift(bank_trajs, states, fp, s, "all")
            scored["all"].add(filt, pools, states, fp)
            if pools:  # the shift guard on the same bank: would it flag these pools?
                scaffolds = sorted({scaffold_of(t) for t in bank_trajs})
                ref = Reference.from_bank(filt.bank, agents=others, scaffolds=scaffolds, kind=kind)
                flags += [dict(v, kind_used=ref.kind) for v in pool_flags(pools, states, filt.bank, ref).values()]
        singles = {}
        for a in others:
            ts = [t for t in bank_trajs if t.agent == a]
            if _usable(ts):
                singles[f"agent:{a}"] = _fit_latentsift(ts, states, fp, s, f"agent:{a}")
                scored[f"agent:{a}"].add(singles[f"agent:{a}"], pools, states, fp)
        if singles and pools:
            subs = [SubBank(n, [], [], f.bank, f.scorer, Reference.from_bank(f.bank), 0) for n, f in singles.items()]
            dist = pool_distances(pools, states, subs)
            pick = nearest_choice(dist)
            for n, f in singles.items():
                scored["nearest"].add(f, [p for p in pools if pick[p.instance_id] == n], states, fp)
            choices |= {i: {"chosen": pick[i], "distances": dist[i]} for i in pick}
    base = {}
    for b in baseline_names():
        sc = _Scored()
        sc.add(make_baseline(b, seed=s.seed), es.pools, None, None)
        base[b] = sc
    cands = sorted((c for p in es.pools for c in p.candidates), key=lambda c: c.traj_id)
    table = {"instance_id": np.array([c.instance_id for c in cands]), "traj_id": np.array([c.traj_id for c in cands]),
             "agent": np.array([c.agent for c in cands]), "label": np.array([int(c.label) for c in cands]),
             "n_chars": np.array([c.n_chars for c in cands], dtype=float),
             "n_steps": np.array([c.n_steps for c in cands], dtype=float)}
    score_cols = {}
    branches = ["distance"] + (["paper"] if s.scorer_epochs > 0 else [])
    for c in configs:
        for br in branches:
            sc = scored[c].scores("distance" if br == "distance" else None)
            if sc:
                score_cols[f"{c} / {br}"] = np.array([sc.get(t, np.nan) for t in table["traj_id"]])
    for b, sc in base.items():
        if filter_entry(b).key != REFERENCE:  # the reference is added by diagnostics_table
            v = sc.scores()
            score_cols[b] = np.array([v[t] for t in table["traj_id"]])
    diag = diagnostics_table(table, score_cols, reference=REFERENCE, n_boot=s.n_boot, seed=s.seed)
    paired = {}  # nearest minus all, paired over the set's instances (the bank-choice verdict's interval)
    for br in branches:
        a, n = score_cols.get(f"all / {br}"), score_cols.get(f"nearest / {br}")
        if a is not None and n is not None:
            d = auc_difference_ci(table, n, a, n_boot=s.n_boot, seed=s.seed).as_dict()
            paired[br] = d | {"outcome": interval_outcome(d)}
    auc = {name: {"auc": d["auc"], f"vs_{REFERENCE}": d.get("vs_reference")} for name, d in diag["scores"].items()}
    retention = {}
    kmax = max(len(p.candidates) for p in es.pools)
    for k in [k for k in s.ks if RETENTION_MIN_K <= k <= kmax]:
        row = {c: _retention(scored[c], es.pools, k, s) for c in configs}
        row |= {b: _retention(base[b], es.pools, k, s) for b in base}
        retention[str(k)] = row
    n_chosen: dict[str, int] = {}
    for v in choices.values():
        n_chosen[v["chosen"]] = n_chosen.get(v["chosen"], 0) + 1
    guard = {"bank": "all", "reference_kind": kind, "kind_used": sorted({f["kind_used"] for f in flags}),
             "false_alarm_setting": FALSE_ALARM,
             **{c: flag_rate([f[c] for f in flags], n_boot=s.n_boot, seed=s.seed) for c in ("distance", "name")}}
    return {"set": es.describe(), "bank_agents": others, "folds": [sorted(f[1]) for f in folds],
            "auc": auc, "retention": retention, "shift_guard": guard,
            "nearest": {"n_chosen": n_chosen, "pools": choices}, "nearest_minus_all": paired}


# ---------------------------------------------------------------------- the matrix
@blas_fixed
def transfer_summary(pools_paths: Sequence[str | Path], states_dirs: Sequence[str | Path], out: str | Path, *,
                     log: Callable[[str], None] = print, **settings) -> dict:
    """The transfer matrix over every evaluation set, as the summary ``latentsift transfer`` writes to ``out``
    (recorded in its settings; the command's job, ``latentsift._jobs.transfer``, writes the files)."""
    s = TransferSettings(pools=[str(p) for p in pools_paths], states=[str(d) for d in states_dirs], out=str(out),
                         **settings)
    sources: dict[str, int] = {}
    trajs, union = load_runs(pools_paths, states_dirs, "transfer", sources=sources)
    all_agents = {t.agent for t in trajs}
    sets = [es for es in eval_sets(trajs, sources) if all_agents - set(es.agents)]  # a bank needs another agent
    if not sets:
        raise LatentSiftError("transfer: no pools of two or more candidates with another agent to bank from; "
                              "a transfer matrix needs two or more agents.")
    t0 = time.perf_counter()
    log(f"[transfer] {len(trajs)} trajectories of agents {sorted({t.agent for t in trajs})}; loading states")
    states = union.load([t.traj_id for t in trajs])
    results = [evaluate_set(es, trajs, states, union.fingerprint, s, log) for es in sets]
    summary = {"format": "latentsift-transfer", "version": 1, "settings": asdict(s) | {"ks": list(s.ks)},
               "fingerprint": union.fingerprint.to_dict(),
               "agents": {a: {"n_trajectories": sum(t.agent == a for t in trajs),
                              "n_resolved": sum(int(t.label) for t in trajs if t.agent == a),
                              "repos": len({t.repo for t in trajs if t.agent == a})}
                          for a in sorted({t.agent for t in trajs})},
               "sets": results, "verdict": verdict(results), "seconds": round(time.perf_counter() - t0, 1)}
    return summary


def verdict(results: Sequence[dict]) -> dict:
    """Does choosing the nearest sub-bank beat the all-agent bank on the held-out sets (AUC, paper's method
    where present, else the distance branch)? Counts sets where nearest's AUC is higher / lower."""
    rows = []
    for r in results:
        br = "paper" if "all / paper" in r["auc"] else "distance"
        a, n = r["auc"].get(f"all / {br}"), r["auc"].get(f"nearest / {br}")
        if a and n and a["auc"]["auc"] is not None and n["auc"]["auc"] is not None:
            rows.append({"set": r["set"]["name"], "branch": br, "all": a["auc"]["auc"], "nearest": n["auc"]["auc"]})
    wins = sum(x["nearest"] > x["all"] for x in rows)
    paired = []  # the same branch as the point verdict: the paper's method where present, else the distance branch
    for r in results:
        nm = r.get("nearest_minus_all") or {}
        br = "paper" if "paper" in nm else "distance"
        if br in nm:
            paired.append({"set": r["set"]["name"], "branch": br, **nm[br]})
    outcomes = {p["outcome"] for p in paired}
    return {"sets": rows, "nearest_higher": wins, "all_higher": sum(x["nearest"] < x["all"] for x in rows),
            VERDICT_BANK: "nearest" if rows and wins == len(rows) else "all",
            "rule": "nearest becomes the default only if its AUC is higher on every held-out set",
            "paired": paired,
            "paired_verdict": ("nearest" if outcomes == {"higher"} else "all" if outcomes == {"lower"} else
                               "undetermined" if paired else "unavailable"),
            "paired_rule": "paired AUC difference nearest - all per held-out set (bootstrap over its instances): "
                           "'nearest' when every interval lies above 0, 'all' when every one lies below 0, "
                           "else undetermined"}
