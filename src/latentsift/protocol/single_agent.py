"""Single-agent pools (summary.json ``single_agent``): each instance's pool split by agent.

The paper's Best@K and a team's deployment draw K candidates from *one* policy; the shared pools mix
agents, so a score can win by telling the agents apart. Here every pool is split into one sub-pool
per agent (``<instance>@<agent>``, sub-pools of two candidates or more), and the same Stage-1
filters (the same folds' banks and scorers; a filter scores a sub-pool as it scores a draw) go through
the same cascade: retention, Best@K, within-pool AUC (over same-agent pairs only, by construction)
and paired differences against the reference rule (``rules.REFERENCE``), ``stack:length`` and ``random``
(``decide.REFERENCES``), all paired over sub-pools.

The shift guard on the same single-agent banks (agent A's trajectories of the bank folds, as in the
agent-transfer table): false alarms on the held-out sub-pools of A itself, detection on the other
agents' sub-pools (``guard.protocol_guard``'s detection, the same banks).

Note: with K = 3 candidates per agent (the Lite pools) Stage 1 keeps max(3, floor(K/2)) = 3, i.e.
everything: retention and Best@K then cannot differ between Stage-1 filters, and the within-pool
AUC is the measure that can.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from ..cascade.cascade import PoolSpec
from ..metrics.evaluate import EvaluateSettings, evaluate_run
from ..deploy.shift import scaffold_of
from .shift_eval import TRADEOFF_QUANTILES, fold_rows, summarise_rows
from ..trajectories.trajectory import Pool, Trajectory, group_pools
from .decide import REF_LENGTH_RULE, REF_RANDOM, auc_comparisons, ledger_difference
from .tables import candidate_table, retention_differences
from .transfer_agents import agent_slug

SEP = "@"


def sub_pool_id(instance_id: str, agent: str) -> str:
    """The id of an instance's sub-pool of one agent."""
    return f"{instance_id}{SEP}{agent}"


def split_pools_by_agent(pools: Sequence[PoolSpec], agent_of: Mapping[str, str], *, min_size: int = 2
                         ) -> tuple[list[PoolSpec], dict[str, str]]:
    """(sub-pools, sub-pool id -> instance id): each pool split by the agent of its candidates.

    Sub-pools with fewer than ``min_size`` candidates are left out (no within-pool comparison);
    candidates keep their pool order; sub-pools are sorted by id.
    """
    subs, base = [], {}
    for p in pools:
        by: dict[str, list[str]] = {}
        for t in p.traj_ids:
            by.setdefault(agent_of[t], []).append(t)
        for a, ids in by.items():
            if len(ids) >= min_size:
                sid = sub_pool_id(p.instance_id, a)
                subs.append(PoolSpec(sid, tuple(ids), p.testgen_tokens))
                base[sid] = p.instance_id
    subs.sort(key=lambda p: p.instance_id)
    return subs, base


class SubPoolScorer:
    """A draw scorer of the full pools, called with sub-pool ids (the sub-pool scored as a draw)."""

    def __init__(self, scorer, base: Mapping[str, str]):
        self.scorer, self.base = scorer, base

    def __call__(self, instance_id: str, traj_ids: Sequence[str]) -> Mapping[str, float]:
        return self.scorer(self.base[instance_id], traj_ids)


def sub_pool_scores(filters: Mapping, subs: Sequence[PoolSpec]) -> dict[str, dict[str, float]]:
    """name -> traj_id -> score, each sub-pool scored whole (callables) or read from the table."""
    out: dict[str, dict[str, float]] = {}
    for name, f in filters.items():
        sc: dict[str, float] = {}
        for p in subs:
            if callable(f):
                sc.update(f(p.instance_id, list(p.traj_ids)))
            else:
                for t in p.traj_ids:
                    v = getattr(f[t], "score", f[t])
                    sc[t] = np.nan if v is None else float(v)
        out[name] = sc
    return out


def candidate_table_of(subs: Sequence[PoolSpec], trajs: Sequence[Trajectory]) -> dict[str, np.ndarray]:
    """``tables.candidate_table`` of the sub-pools' candidates, with instance_id = the sub-pool id."""
    sub_of = {t: p.instance_id for p in subs for t in p.traj_ids}
    table = candidate_table([t for t in trajs if t.traj_id in sub_of])
    table["instance_id"] = np.array([sub_of[t] for t in table["traj_id"].tolist()])
    return table


def single_agent_pools(pools: Sequence[PoolSpec], records, filters: Mapping, trajs: Sequence[Trajectory], *,
                       ks: Sequence[int], final_verifier, reference: str | None, n_draws: int, n_boot: int,
                       seed: int, missing: Mapping[str, str] | None = None) -> dict:
    """The ``single_agent`` section: the cascade, AUCs and paired differences on the sub-pools.

    ``missing``: filter -> why it is absent from ``filters`` (a missing reference is named, never replaced).
    With one agent every pool is that agent's: the section is a note (the main tables are its tables)."""
    agent_of = {t.traj_id: t.agent for t in trajs}
    agents = sorted(set(agent_of.values()))
    if len(agents) == 1:
        return {"note": f"one agent ({agents[0]}) wrote every candidate: every pool is a single-agent pool, so the "
                        "main tables are the single-agent tables"}
    subs, base = split_pools_by_agent(pools, agent_of)
    if not subs:
        return {"note": "no agent wrote two or more candidates of one instance: no single-agent pools"}
    sizes = [p.n for p in subs]
    use_ks = sorted({min(k, max(sizes)) for k in ks})  # the run's Ks capped at the largest sub-pool
    wrapped = {n: (SubPoolScorer(f, base) if callable(f) else f) for n, f in filters.items()}
    sub_records = {t: dataclasses.replace(records[t], instance_id=p.instance_id) for p in subs for t in p.traj_ids}
    evaluation = EvaluateSettings(ks=use_ks, n_draws=n_draws, seed=seed, n_boot=n_boot, reference=reference,
                                  small_pools="drop")
    summary = evaluate_run(subs, wrapped, sub_records, evaluation, final_verifier=final_verifier)
    d = summary.data
    table = candidate_table_of(subs, trajs)
    ids = table["traj_id"].tolist()
    raw = sub_pool_scores(wrapped, subs)
    scores = {n: np.array([sc[t] for t in ids], dtype=float) for n, sc in raw.items()}
    out = {"rule": "each pool split by agent into sub-pools '<instance>@<agent>' of two candidates or more; the "
                   "folds' banks and scorers score a sub-pool as they score a draw; intervals paired over sub-pools",
           "pools": d["pools"], "ks": use_ks,
           "stage1_keeps_all": [k for k in use_ks if k <= d["settings"]["min_keep"]],
           "retention": d["retention"], "best_at_k": d["best_at_k"], "tokens": d["tokens"],
           "retention_difference": {r: retention_differences(summary.ledger, r, use_ks, n_boot=n_boot, seed=seed)
                                    for r in (REF_LENGTH_RULE, REF_RANDOM)},
           "best_difference": {r: ledger_difference(summary.ledger, "best", r, n_boot=n_boot, seed=seed)
                               for r in (REF_LENGTH_RULE, REF_RANDOM)},
           "auc": auc_comparisons(table, scores, n_boot=n_boot, seed=seed, missing=missing),
           "per_agent": {}}
    for a in sorted(set(table["agent"].tolist())):
        keep = table["agent"] == a
        sub_table = {c: v[keep] for c, v in table.items()}
        if len(set(sub_table["instance_id"].tolist())) >= 2:
            out["per_agent"][a] = auc_comparisons(sub_table, {n: v[keep] for n, v in scores.items()},
                                                  n_boot=n_boot, seed=seed, missing=missing)
    return out


def single_agent_guard(run, trajs, folds, states, fingerprint, detection: Mapping[str, dict], *,
                       false_alarm: float, n_boot: int, seed: int,
                       quantiles: Sequence[float] = TRADEOFF_QUANTILES) -> dict:
    """False alarms of each single-agent bank on held-out sub-pools of its own agent, beside its detection.

    The banks are the agent-transfer banks (``run.fit_fold`` under ``agent-<slug>``, the ones
    ``protocol_guard``'s detection uses); ``detection``: that section (``"A -> B"`` keys).
    """
    pools = group_pools(trajs)
    agents = sorted({t.agent for t in trajs})
    out: dict = {"rule": "bank = one agent's trajectories of the bank folds; false alarms = flagged share of the "
                         "held-out pools of that agent alone; detection = flagged share of the other agents' "
                         "held-out pools (the same banks and folds)", "banks": {}, "unavailable": {}}
    for a in agents:
        rows = []
        for fold in run.iter_folds(trajs, folds, pools=pools, bank_filter=lambda t, a=a: t.agent == a):
            n_pos = sum(t.label == 1 for t in fold.bank_trajs)
            if n_pos == 0 or n_pos == len(fold.bank_trajs):
                rows = []
                out["unavailable"][a] = f"fold {fold.k}: {a}'s bank has {n_pos} resolved of {len(fold.bank_trajs)}"
                break
            own = [Pool(p.instance_id, [c for c in p.candidates if c.agent == a]) for p in fold.eval_pools]
            own = [p for p in own if p.candidates]
            if not own:
                continue
            bank, _ = run.fit_fold(fold.k, fold.bank_trajs, states, fingerprint, {}, f"agent-{agent_slug(a)}")
            rows.append(fold_rows(own, states, bank, [a], sorted({scaffold_of(t) for t in fold.bank_trajs}),
                                  false_alarm, n_boot, seed))
        if rows:
            out["banks"][a] = {"false_alarms": summarise_rows(rows, n_boot, seed, quantiles),
                               "detection": {k.split(" -> ", 1)[1]: v for k, v in detection.items()
                                             if v.get("bank_agent") == a}}
    return out
