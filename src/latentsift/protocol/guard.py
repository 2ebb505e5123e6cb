"""The shift guard's error rates on the protocol's folds (the ``shift_guard`` section of summary.json):
false alarms per outer fold, detection in the agent-transfer setting and the threshold trade-off, each
measured with ``latentsift.protocol.shift_eval`` (its docstring defines them).
"""
from __future__ import annotations

from typing import Sequence

from ..deploy.shift import FALSE_ALARM, REFERENCE_KINDS, scaffold_of
from .shift_eval import TRADEOFF_QUANTILES, fold_rows, summarise_rows
from ..trajectories.trajectory import Pool, group_pools
from .transfer_agents import agent_slug


def protocol_guard(run, trajs, folds, states, fingerprint, *, false_alarm: float = FALSE_ALARM,
                   n_boot: int = 1000, seed: int = 0, agent_transfer: bool = True,
                   quantiles: Sequence[float] = TRADEOFF_QUANTILES) -> dict:
    """The ``shift_guard`` section of summary.json: false alarms per fold and pooled, detection per
    (bank agent, pool agent) pair, trade-off curves. Uses the folds' cached banks (``run.fit_fold``)."""
    pools = group_pools(trajs)
    false_rows, per_fold = [], []
    for fold in run.iter_folds(trajs, folds, pools=pools):
        bank, _ = run.fit_fold(fold.k, fold.bank_trajs, states, fingerprint, {}, "paper")
        row = fold_rows(fold.eval_pools, states, bank, sorted({t.agent for t in fold.bank_trajs}),
                        sorted({scaffold_of(t) for t in fold.bank_trajs}), false_alarm, n_boot, seed)
        false_rows.append(row)
        per_fold.append({"fold": fold.k, "n_pools": len(fold.eval_pools), "threshold": row["threshold"],
                         "reference_kind_used": row["kind_used"], "false_alarm": row["rates"]})
    out = {"false_alarm_setting": false_alarm, "reference_kinds": list(REFERENCE_KINDS),
           "quantiles": list(quantiles),
           "rule": "flagged = the pool's median nearest-bank distance above the threshold (distance check), or an "
                   "agent/scaffold absent from the bank (name check); threshold = the 1 - false_alarm quantile of "
                   "the bank's own pools scored against the rest of the bank, leaving out their repository or "
                   "instance (reference kind); intervals: bootstrap over pools",
           "false_alarms": {"per_fold": per_fold, "pooled": summarise_rows(false_rows, n_boot, seed, quantiles)},
           "detection": {}, "detection_unavailable": {}}
    agents = sorted({t.agent for t in trajs})
    if not agent_transfer or len(agents) < 2:
        out["detection_note"] = "needs the agent-transfer runs and two agents or more"
        return out
    for a in agents:
        for b in agents:
            if b == a:
                continue
            rows = []
            for fold in run.iter_folds(trajs, folds, pools=pools, bank_filter=lambda t, a=a: t.agent == a):
                n_pos = sum(t.label == 1 for t in fold.bank_trajs)
                if n_pos == 0 or n_pos == len(fold.bank_trajs):
                    rows = []
                    out["detection_unavailable"][f"{a} -> {b}"] = (
                        f"fold {fold.k}: {a}'s bank trajectories ({len(fold.bank_trajs)}) have {n_pos} resolved; "
                        "a bank needs both classes")
                    break
                other = [Pool(p.instance_id, [c for c in p.candidates if c.agent == b]) for p in fold.eval_pools]
                other = [p for p in other if p.candidates]
                if not other:
                    continue
                bank, _ = run.fit_fold(fold.k, fold.bank_trajs, states, fingerprint, {}, f"agent-{agent_slug(a)}")
                rows.append(fold_rows(other, states, bank, [a], sorted({scaffold_of(t) for t in fold.bank_trajs}),
                                      false_alarm, n_boot, seed))
            if rows:
                out["detection"][f"{a} -> {b}"] = {"bank_agent": a, "pool_agent": b,
                                                   **summarise_rows(rows, n_boot, seed, quantiles)}
    return out
