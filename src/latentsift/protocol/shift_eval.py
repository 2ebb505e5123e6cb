"""The shift guard's error rates: the measures that ``protocol.guard.protocol_guard`` takes per fold.

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

from ..metrics.bootstrap import CI_LEVEL, bootstrap_indices, mean_ci
from ..deploy.shift import REFERENCE_KINDS, Reference, check_pools

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


def summarise_rows(rows: list[dict], n_boot: int, seed: int, quantiles) -> dict:
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


def fold_rows(pools, states, bank, agents, scaffolds, false_alarm, n_boot, seed) -> dict:
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
