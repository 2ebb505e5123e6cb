"""The shift guard's error rates inside the protocol (``crossval`` / ``reproduce``).

- false alarms: per outer fold, the share of evaluation pools the guard flags when the bank is the
  other folds (pools like the bank's: same agents), for the distance check and the name check
  (unseen agent or scaffold) separately, with a bootstrap interval over pools;
- detection: in the agent-transfer setting (bank of agent A's trajectories of the bank folds), the
  share of the held-out pools of another agent B alone (B's candidates only) that are flagged;
- the trade-off: the flag rate on those pools when the threshold is the in-bank reference quantile
  q instead of ``1 - false_alarm`` (one curve per reference kind and check).

Both reference kinds (``shift.REFERENCE_KINDS``) are reported; the threshold is chosen in-bank for
the stated ``false_alarm`` rate (``shift.Reference.from_bank``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .evaluate import CI_LEVEL, bootstrap_indices, mean_ci
from .shift import FALSE_ALARM, REFERENCE_KINDS, Reference, check_pools, scaffold_of
from .trajectory import Pool, group_pools

TRADEOFF_QUANTILES = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99, 1.0)


def pool_flags(pools, states, bank, reference: Reference) -> dict[str, dict]:
    """instance -> {"median": the pool's median nearest-bank distance, "distance": flagged by the
    distance check, "name": flagged by the name check (unseen agent or scaffold)}."""
    out = {}
    for s in check_pools(pools, states, bank, reference):
        med = s.median_nearest_bank_distance
        out[s.instance_id] = {"median": med,
                              "distance": bool(med is not None and np.isfinite(reference.loo_quantile)
                                               and med > reference.loo_quantile),
                              "name": bool(s.unseen_agents or s.unseen_scaffolds)}
    return out


def flag_rate(flags: Sequence[bool], *, n_boot: int, seed: int, level: float = CI_LEVEL) -> dict:
    """Share of pools flagged, with its bootstrap percentile interval over pools (None when no pool)."""
    v = np.asarray(flags, dtype=np.float64)
    if not len(v):
        return {"rate": None, "lo": None, "hi": None, "n_pools": 0}
    ci = mean_ci(v, bootstrap_indices(len(v), n_boot, np.random.default_rng(seed)), level)
    return {"rate": ci["mean"], "lo": ci["lo"], "hi": ci["hi"], "n_pools": int(len(v))}


def tradeoff(medians: Sequence[float | None], reference_medians: Sequence[float],
             quantiles: Sequence[float] = TRADEOFF_QUANTILES) -> np.ndarray:
    """(n_quantiles, n_pools) flags of pools with ``medians`` when the threshold is each ``quantile`` of
    ``reference_medians`` (no reference or no median: not flagged, as the guard does)."""
    m = np.asarray([np.nan if x is None else x for x in medians], dtype=np.float64)
    ref = np.asarray(reference_medians, dtype=np.float64)
    if not len(ref):
        return np.zeros((len(quantiles), len(m)), dtype=bool)
    thr = np.quantile(ref, quantiles)
    return np.nan_to_num(m, nan=-np.inf)[None, :] > thr[:, None]


def _nan_to_none(x) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(x, dtype=np.float64)]


def _summarise(rows: list[dict], n_boot: int, seed: int, quantiles) -> dict:
    """Pooled rates (over folds) per reference kind and check, with intervals, and the trade-off."""
    out = {}
    for kind in REFERENCE_KINDS:
        flags = [f for r in rows for f in r["flags"][kind].values()]
        out[kind] = {
            "distance": flag_rate([f["distance"] for f in flags], n_boot=n_boot, seed=seed),
            "name": flag_rate([f["name"] for f in flags], n_boot=n_boot, seed=seed),
            "tradeoff": _nan_to_none(np.concatenate(
                [tradeoff([f["median"] for f in r["flags"][kind].values()], r["reference"][kind], quantiles)
                 for r in rows], axis=1).mean(axis=1)) if rows else [],
            "thresholds": [r["threshold"][kind] for r in rows],
        }
    return out


def _fold_rows(pools, states, bank, agents, scaffolds, false_alarm, n_boot, seed) -> dict:
    """Flags of ``pools`` against ``bank`` for both reference kinds, with the per-fold rates."""
    row = {"flags": {}, "reference": {}, "threshold": {}, "kind_used": {}, "rates": {}}
    for kind in REFERENCE_KINDS:
        ref = Reference.from_bank(bank, agents=agents, scaffolds=scaffolds, kind=kind, false_alarm=false_alarm)
        fl = pool_flags(pools, states, bank, ref)
        row["flags"][kind] = fl
        row["reference"][kind] = ref.pool_medians or []
        row["threshold"][kind] = None if not np.isfinite(ref.loo_quantile) else ref.loo_quantile
        row["kind_used"][kind] = ref.kind
        row["rates"][kind] = {c: flag_rate([f[c] for f in fl.values()], n_boot=n_boot, seed=seed)
                              for c in ("distance", "name")}
    return row


def protocol_guard(run, trajs, folds, states, fingerprint, *, false_alarm: float = FALSE_ALARM,
                   n_boot: int = 1000, seed: int = 0, agent_transfer: bool = True,
                   quantiles: Sequence[float] = TRADEOFF_QUANTILES) -> dict:
    """The ``shift_guard`` section of summary.json: false alarms per fold and pooled, detection per
    (bank agent, pool agent) pair, trade-off curves. Uses the folds' cached banks (``run.fit_fold``)."""
    pools = group_pools(trajs)
    false_rows, per_fold = [], []
    for k, (bank_groups, eval_groups) in enumerate(folds):
        bank_set, eval_set = set(bank_groups), set(eval_groups)
        bank_trajs = [t for t in trajs if run.group(t) in bank_set]
        eval_pools = [p for p in pools if run.group(p.candidates[0]) in eval_set]
        if not eval_pools:
            continue
        bank, _ = run.fit_fold(k, bank_trajs, states, fingerprint, {}, "paper")
        row = _fold_rows(eval_pools, states, bank, sorted({t.agent for t in bank_trajs}),
                         sorted({scaffold_of(t) for t in bank_trajs}), false_alarm, n_boot, seed)
        false_rows.append(row)
        per_fold.append({"fold": k, "n_pools": len(eval_pools), "threshold": row["threshold"],
                         "reference_kind_used": row["kind_used"], "false_alarm": row["rates"]})
    out = {"false_alarm_setting": false_alarm, "reference_kinds": list(REFERENCE_KINDS),
           "quantiles": list(quantiles),
           "rule": "flagged = the pool's median nearest-bank distance above the threshold (distance check), or an "
                   "agent/scaffold absent from the bank (name check); threshold = the 1 - false_alarm quantile of "
                   "the bank's own pools scored against the rest of the bank, leaving out their repository or "
                   "instance (reference kind); intervals: bootstrap over pools",
           "false_alarms": {"per_fold": per_fold, "pooled": _summarise(false_rows, n_boot, seed, quantiles)},
           "detection": {}, "detection_unavailable": {}}
    agents = sorted({t.agent for t in trajs})
    if not agent_transfer or len(agents) < 2:
        out["detection_note"] = "needs the agent-transfer runs and two agents or more"
        return out
    for a in agents:
        slug = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in a)
        for b in agents:
            if b == a:
                continue
            rows = []
            for k, (bank_groups, eval_groups) in enumerate(folds):
                bank_set, eval_set = set(bank_groups), set(eval_groups)
                bank_trajs = [t for t in trajs if run.group(t) in bank_set and t.agent == a]
                n_pos = sum(t.label == 1 for t in bank_trajs)
                if n_pos == 0 or n_pos == len(bank_trajs):
                    rows = []
                    out["detection_unavailable"][f"{a} -> {b}"] = (
                        f"fold {k}: {a}'s bank trajectories ({len(bank_trajs)}) have {n_pos} resolved; a bank "
                        "needs both classes")
                    break
                other = [Pool(p.instance_id, [c for c in p.candidates if c.agent == b]) for p in pools
                         if run.group(p.candidates[0]) in eval_set]
                other = [p for p in other if p.candidates]
                if not other:
                    continue
                bank, _ = run.fit_fold(k, bank_trajs, states, fingerprint, {}, f"agent-{slug}")
                rows.append(_fold_rows(other, states, bank, [a], sorted({scaffold_of(t) for t in bank_trajs}),
                                       false_alarm, n_boot, seed))
            if rows:
                out["detection"][f"{a} -> {b}"] = {"bank_agent": a, "pool_agent": b,
                                                   **_summarise(rows, n_boot, seed, quantiles)}
    return out
