"""Offline evaluation of early pruning (``latentsift.sift.prune``) on the protocol's folds.

Per policy, schedule and threshold: generation tokens saved (model-written tokens the stopped
candidates would still have produced, from the recorded trajectories), observation tokens saved
(separate column), retention of a resolved candidate among the survivors, Best@K of the cascade on
the survivors, with 95% bootstrap intervals over instances; thresholds chosen in-bank only
(cross-fitted on the inner split of each bank fold, ``bank.inner_folds``).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._core.io import atomic_write_json
from .._core.validation import LatentSiftError, check_choice, param_error
from ..bank.bank import inner_folds, iter_folds
from ..cascade.cascade import run_cascade
from ..metrics.bootstrap import bootstrap_indices, mean_ci, ratio_ci
from ..sift.prune import (LENGTH_POLICIES, POLICIES, SCHEDULES, STATE_POLICIES, TARGET_RETENTION, THRESHOLDS, PoolRun,
                          StepTokens, check_schedule, check_threshold, cut_length, prune_policies, prune_policy,
                          simulate_pool, step_tokens, tokens_saved)
from ..sift.keep import PAPER_KEEP
from ..trajectories.trajectory import Pool, Trajectory, group_pools
from ..states.states import TrajectoryStates
from .folds import group_noun
from .settings import digest


def _fold_runs(name, pools, states, fingerprint, tokens, schedules, thresholds, *, bank_trajs, bank, scorer,
               seed, cache=None, fallbacks: list | None = None) -> dict[tuple, dict[str, PoolRun]]:
    """(schedule, threshold) -> instance -> PoolRun for one policy on one fold's pools."""
    pol = prune_policy(name, pools, states, fingerprint, tokens, bank_trajs=bank_trajs, bank=bank, scorer=scorer,
                       seed=seed, cache=cache)
    n_steps = {c.traj_id: tokens[c.traj_id].n_steps for p in pools for c in p.candidates}
    out: dict[tuple, dict[str, PoolRun]] = {}
    for kind, cps in schedules.items():
        if pol.schedules is not None and kind not in pol.schedules:
            continue
        cuts = [{t: cut_length(tokens[t], kind, v) for t in n_steps} for v in cps]
        preps = [pol.prepare(kind, v, cut) for v, cut in zip(cps, cuts)]
        for th in thresholds:
            runs = {}
            for p in pools:
                def rank_at(j, alive, p=p):
                    f, prep = preps[j]
                    return f.rank_subset(prep[p.instance_id], alive)
                runs[p.instance_id] = simulate_pool([c.traj_id for c in p.candidates], n_steps, cuts, rank_at, th,
                                                    seed=seed, instance_id=p.instance_id)
            out[(kind, th)] = runs
    if pol.fallbacks and fallbacks is not None:
        fallbacks.extend(pol.fallbacks)
    return out


def _metrics(runs: Mapping[str, PoolRun], pools_by: Mapping[str, Pool], tokens, cascade, seed) -> dict[str, np.ndarray]:
    """Per-instance columns (instances in sorted order)."""
    insts = sorted(runs)
    gen_s, obs_s, gen_t, obs_t, solv, kept, best = [], [], [], [], [], [], []
    for i in insts:
        r = runs[i]
        g, o = tokens_saved(r, tokens)
        ids = [c.traj_id for c in pools_by[i].candidates]
        gen_s.append(g)
        obs_s.append(o)
        gen_t.append(sum(int(tokens[t].gen.sum()) for t in ids))
        obs_t.append(sum(int(tokens[t].obs.sum()) for t in ids))
        lab = {c.traj_id: int(c.label) for c in pools_by[i].candidates}
        solv.append(float(any(lab.values())))
        kept.append(float(any(lab[t] for t in r.survivors)))
        if cascade is not None:
            best.append(run_cascade(r.survivors, cascade["stage1"], cascade["records"],
                                    final_verifier=cascade["final_verifier"], instance_id=i, seed=seed).value)
    return {"gen_saved": np.array(gen_s, float), "obs_saved": np.array(obs_s, float),
            "gen_total": np.array(gen_t, float), "obs_total": np.array(obs_t, float),
            "solvable": np.array(solv), "kept": np.array(kept), "best": np.array(best) if best else None,
            "n_stopped": np.array([len(runs[i].stopped) for i in insts], float)}


def _summary(m: dict, boot: np.ndarray) -> dict:
    row = {"gen_saved": ratio_ci(m["gen_saved"], m["gen_total"], boot),
           "obs_saved": ratio_ci(m["obs_saved"], m["obs_total"], boot),
           "retention": ratio_ci(m["kept"] * m["solvable"], m["solvable"], boot),
           "stopped_per_pool": float(m["n_stopped"].mean()) if len(m["n_stopped"]) else 0.0,
           "gen_saved_per_pool": float(m["gen_saved"].mean()) if len(m["gen_saved"]) else 0.0}
    row["best_at_k"] = mean_ci(m["best"], boot) if m["best"] is not None else None
    return row


def _choose(runs_by: Mapping[tuple, Mapping[str, PoolRun]], pools_by, tokens, kind, thresholds, target) -> float:
    """In-bank choice: the threshold with the most model-written tokens saved whose retention >= target
    (the smallest threshold when none reaches it)."""
    best, best_saved = min(thresholds), -1.0
    for th in thresholds:
        m = _metrics(runs_by[(kind, th)], pools_by, tokens, None, 0)
        ret = (m["kept"] * m["solvable"]).sum() / max(m["solvable"].sum(), 1)
        saved = m["gen_saved"].sum() / max(m["gen_total"].sum(), 1)
        if ret >= target and saved > best_saved:
            best, best_saved = th, saved
    return float(best)


def _inner_runs(k: int, bank_trajs: list[Trajectory], group, fit, policies, states, fingerprint, tokens, schedules,
                thresholds, *, seed: int, fallbacks: list[str], log) -> dict[str, dict[tuple, dict[str, PoolRun]]]:
    """The runs on fold ``k``'s inner split of its bank (the in-bank threshold is chosen on them):
    policy -> (schedule, threshold) -> instance -> run."""
    inner_runs: dict[str, dict[tuple, dict[str, PoolRun]]] = {p: {} for p in policies}
    for ifold in inner_folds(bank_trajs, group, seed=seed):
        j, ib, ie_pools = ifold.k, ifold.bank_trajs, ifold.eval_pools
        try:
            ibank, iscorer = fit(f"fold-{k}-inner-{j}", ib)
        except LatentSiftError as e:  # e.g. an inner bank with one class only (tiny runs)
            log(f"[prune] fold {k} inner {j}: skipped ({e})")
            continue
        cache: dict = {}
        for name in policies:
            for key, rr in _fold_runs(name, ie_pools, states, fingerprint, tokens, schedules, thresholds,
                                      bank_trajs=ib, bank=ibank, scorer=iscorer, seed=seed,
                                      cache=cache, fallbacks=fallbacks).items():
                inner_runs[name].setdefault(key, {}).update(rr)
    return inner_runs


def evaluate_pruning(trajs: Sequence[Trajectory], states: Mapping[str, TrajectoryStates], fingerprint,
                     folds: Sequence[tuple[Sequence[str], Sequence[str]]], tokens: Mapping[str, StepTokens], *,
                     fit: Callable[[str, list[Trajectory]], tuple], policies: Sequence[str] = POLICIES,
                     schedules: Mapping[str, Sequence] | None = None, thresholds: Sequence[float] = THRESHOLDS,
                     cascade: Mapping[str, Any] | None = None, target_retention: float = TARGET_RETENTION,
                     inner: bool = True, n_boot: int = 1000, seed: int = 0,
                     log: Callable[[str], None] = lambda m: None,
                     group: Callable[[Trajectory], str] | None = None, group_name: str = "repository") -> dict:
    """Offline pruning on recorded pools, by prefix truncation of the stored states.

    ``folds``: (bank repos, evaluation repos) pairs; ``fit(name, bank_trajs) -> (Bank, LinearScorer)``
    fits (or loads) a fold's bank and scorer (name ``"fold-<k>"`` or ``"fold-<k>-inner-<j>"``).
    ``cascade``: ``{"stage1": filter, "records": ..., "final_verifier": ...}`` for Best@K of the
    cascade on the survivors (omitted: no Best@K column). Thresholds are reported one by one and as
    ``"in-bank"``: per fold, the threshold chosen on the bank alone (cross-fitted over the inner
    repository split of the bank; most tokens saved with retention >= ``target_retention``).
    ``group(traj)``: the fold group the ``folds`` name (default the repository; the protocol's
    ``group_of`` when it groups by instance or agent), also used for the inner split; ``group_name``: that
    group as a word (the report's 'inner <group> split').
    Returns a JSON-able dict (``rows``: one per policy, schedule, threshold).
    """
    schedules = {k: check_schedule(k, v, "evaluate_pruning") for k, v in (schedules or SCHEDULES).items()}
    thresholds = tuple(check_threshold(t, "evaluate_pruning") for t in thresholds)
    for p in policies:
        check_choice(p, "policies", "evaluate_pruning", prune_policies())
    if not 0.0 <= target_retention <= 1.0:
        raise param_error("target_retention", "evaluate_pruning", "a float in [0, 1]", target_retention)
    missing = [t.traj_id for t in trajs if t.traj_id not in tokens]
    if missing:
        raise LatentSiftError(f"evaluate_pruning: no token counts for {len(missing)} trajectories, e.g. {missing[0]!r}.")
    t0 = time.perf_counter()
    group = group or (lambda t: t.repo)
    pools = group_pools(trajs)
    pools_by = {p.instance_id: p for p in pools}
    runs: dict[str, dict[tuple, dict[str, PoolRun]]] = {p: {} for p in policies}
    chosen: dict[str, dict[str, list]] = {p: {} for p in policies}
    fallbacks: list[str] = []  # prefix-bank checkpoints that fell back to the whole-trajectory bank
    for fold in iter_folds(trajs, folds, group, pools=pools):
        k, bank_trajs, eval_pools = fold.k, fold.bank_trajs, fold.eval_pools
        bank, scorer = fit(f"fold-{k}", bank_trajs)
        inner_runs: dict[str, dict[tuple, dict[str, PoolRun]]] = {p: {} for p in policies}
        if inner and len({group(t) for t in bank_trajs}) < 2:
            log(f"[prune] fold {k}: one bank group, no inner split; the smallest threshold is used")
        elif inner:
            inner_runs = _inner_runs(k, bank_trajs, group, fit, policies, states, fingerprint, tokens, schedules,
                                     thresholds, seed=seed, fallbacks=fallbacks, log=log)
        cache: dict = {}
        for name in policies:
            fr = _fold_runs(name, eval_pools, states, fingerprint, tokens, schedules, thresholds,
                            bank_trajs=bank_trajs, bank=bank, scorer=scorer, seed=seed, cache=cache,
                            fallbacks=fallbacks)
            for key, rr in fr.items():
                runs[name].setdefault(key, {}).update(rr)
            for kind in dict.fromkeys(kd for kd, _ in fr):
                th = (_choose(inner_runs[name], pools_by, tokens, kind, thresholds, target_retention)
                      if inner_runs[name] else min(thresholds))
                chosen[name].setdefault(kind, []).append({"fold": k, "threshold": th})
                runs[name].setdefault((kind, "in-bank"), {}).update(fr[(kind, th)])
    insts = sorted({i for r in runs.values() for rr in r.values() for i in rr})
    if not insts:
        raise LatentSiftError("evaluate_pruning: no fold has evaluation pools.")
    boot = bootstrap_indices(len(insts), n_boot, np.random.default_rng(seed))
    rows = []
    for name in policies:
        for (kind, th), rr in runs[name].items():
            m = _metrics({i: rr[i] for i in insts}, pools_by, tokens, cascade, seed)
            rows.append({"policy": name, "schedule": kind, "checkpoints": list(schedules[kind]),
                         "threshold": th, **_summary(m, boot)})
    none = _metrics({i: PoolRun(i, {}, [c.traj_id for c in pools_by[i].candidates]) for i in insts}, pools_by,
                    tokens, cascade, seed)
    rows.append({"policy": "no pruning", "schedule": "-", "checkpoints": [], "threshold": None, **_summary(none, boot)})
    out = {"rows": rows, "chosen_thresholds": chosen, "n_instances": len(insts),
           "n_solvable": int(none["solvable"].sum()), "k": sorted({len(pools_by[i].candidates) for i in insts}),
           "min_alive_rule": f"{PAPER_KEEP.describe()} alive (running or finished) candidates", "inner_split": group_name,
           "target_retention": target_retention, "n_boot": n_boot, "seed": seed,
           "prefix_bank_fallbacks": len(fallbacks),
           "gen_tokens_total": float(none["gen_total"].sum()), "obs_tokens_total": float(none["obs_total"].sum())}
    out["verdict"] = verdict(out)
    log(f"[prune] {len(insts)} pools, {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
    return out


def verdict(result: Mapping) -> dict:
    """Does state-based pruning beat the length rules? Compared on the in-bank thresholds per schedule:
    a state policy beats the length rules when it saves more model-written tokens at retention at
    least as high, or keeps more at savings at least as high, than the best length rule (point
    estimates); 'clearly' when its retention interval lies above the length rule's point estimate."""
    rows = [r for r in result["rows"] if r["threshold"] == "in-bank"]
    per = {}
    for kind in sorted({r["schedule"] for r in rows}):
        rs = {r["policy"]: r for r in rows if r["schedule"] == kind}
        st = [rs[p] for p in STATE_POLICIES if p in rs]
        ln = [rs[p] for p in LENGTH_POLICIES if p in rs]
        if not st or not ln:
            continue

        def key(r):
            return (np.nan_to_num(r["retention"]["mean"], nan=-1), r["gen_saved"]["mean"])
        bs, bl = max(st, key=key), max(ln, key=key)
        rs_, rl = bs["retention"]["mean"], bl["retention"]["mean"]
        gs, gl = bs["gen_saved"]["mean"], bl["gen_saved"]["mean"]
        if rs_ is None or rl is None or not (math.isfinite(rs_) and math.isfinite(rl)):
            continue  # no evaluated pool with a resolved candidate: retention undefined
        beats = bool((rs_ >= rl and gs > gl) or (rs_ > rl and gs >= gl))
        loses = bool((rl >= rs_ and gl > gs) or (rl > rs_ and gl >= gs))
        per[kind] = {"state": bs["policy"], "length": bl["policy"], "state_retention": rs_, "length_retention": rl,
                     "state_gen_saved": gs, "length_gen_saved": gl, "beats": beats, "loses": loses}
    if not per:
        return {"per_schedule": per, "beats": None,
                "sentence": "No comparison of state-based and length-based pruning is possible here (no policy of "
                            "each kind, or no pool with a resolved candidate)."}
    parts = []
    for kind, v in per.items():
        word = "beats" if v["beats"] else ("does not beat" if v["loses"] else "trades off against")
        parts.append(f"on the {kind} schedule, the best state-based policy ({v['state']}) {word} the best "
                     f"length rule ({v['length']}): retention {v['state_retention']:.1%} vs "
                     f"{v['length_retention']:.1%}, model-written tokens saved {v['state_gen_saved']:.1%} vs "
                     f"{v['length_gen_saved']:.1%}")
    overall = all(v["beats"] for v in per.values())
    head = ("State-based pruning beats the length-based pruning rules on these pools" if overall else
            "State-based pruning does not consistently beat the length-based pruning rules on these pools")
    return {"per_schedule": per, "beats": overall,
            "sentence": head + " (thresholds chosen in-bank): " + "; ".join(parts) + "."}


# ---------------------------------------------------------------------------------- the protocol's entry
def cached_step_tokens(path: str | Path, trajs: Sequence[Trajectory], tokenizer, fingerprint) -> dict[str, StepTokens]:
    """``step_tokens`` cached in the JSON file ``path``, keyed by the trajectory ids AND the model's
    fingerprint (the counts depend on the tokenizer: another model never reuses them)."""
    path = Path(path)
    key = digest({"ids": sorted(t.traj_id for t in trajs), "fp": fingerprint.digest})
    if path.is_file():
        d = json.loads(path.read_text())
        if d.get("key") == key:
            return {t: StepTokens(np.array(v[0], np.int64), np.array(v[1], np.int64)) for t, v in d["tokens"].items()}
    tokens = step_tokens(trajs, tokenizer)
    atomic_write_json(path, {"key": key, "tokens": {t: [v.gen.tolist(), v.obs.tolist()] for t, v in tokens.items()}})
    return tokens


def reproduce_pruning(run, trajs: Sequence[Trajectory], store, tokenizer, folds, *, cascade=None,
                      policies: Sequence[str] = POLICIES, thresholds: Sequence[float] = THRESHOLDS,
                      schedules: Mapping[str, Sequence] | None = None) -> dict:
    """The pruning evaluation of ``latentsift reproduce`` (``run``: the ``protocol.Run``): token counts
    cached in OUT/prune/tokens.json, outer banks and scorers reused from the folds' cache, inner ones
    cached under OUT/folds/fold-<k>/prune-inner-<j>."""
    s = run.settings
    tokens = cached_step_tokens(run.out / "prune" / "tokens.json", trajs, tokenizer, store.fingerprint)
    states = store.load([t.traj_id for t in trajs])
    fp = store.fingerprint

    def fit(name, bank_trajs):
        k, _, j = name.removeprefix("fold-").partition("-inner-")
        return run.fit_fold(int(k), bank_trajs, states, fp, {}, "paper" if not j else f"prune-inner-{j}")

    return evaluate_pruning(trajs, states, fp, folds, tokens, fit=fit, policies=policies, thresholds=thresholds,
                            schedules=schedules, cascade=cascade, n_boot=s.n_boot, seed=s.seed, log=run.log,
                            group=run.group, group_name=group_noun(s.group_by, 1))
