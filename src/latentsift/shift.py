"""Shift guard: is a candidate pool like what the bank (or a saved sifter) was built from?

The README's finding is that the state scores mostly encode which agent wrote a trajectory; a bank
applied to an agent or scaffold it never saw can do worse than random, silently. Per pool:

- metadata: the candidates' agents and scaffolds absent from what the bank/sifter has seen
  (``scaffold_of``: ``meta["scaffold"]`` when the importer recorded one, else the trajectory's
  source format, i.e. the scaffold's log format);
- state space: each candidate's trajectory vector (the mean of its distance states over the bank's
  channels, in the bank's transform) and its distance to the nearest bank trajectory, against the
  bank's own leave-one-instance-out nearest distances (each bank trajectory to the nearest bank
  trajectory of another instance, i.e. what a new task of a known agent looks like). The pool is
  out of distribution when the median of its candidates' distances exceeds the ``quantile`` of that
  reference distribution.

``on_shift``: "warn" (report it, filter as usual), "keep-all" (Stage 1 skipped for that pool: every
candidate goes on to the next stage) or "error" (refuse; nothing is written).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy.spatial.distance import cdist

from ._validation import LatentSiftError, check_choice
from .states import CHANNEL_ID, TrajectoryStates

ON_SHIFT = ("warn", "keep-all", "error")
QUANTILE = 0.95


def scaffold_of(traj) -> str:
    """The scaffold of a trajectory: ``meta['scaffold']`` when recorded, else its source format."""
    return str(traj.meta.get("scaffold") or traj.source_format or traj.agent or "")


def trajectory_vector(states: TrajectoryStates, bank) -> np.ndarray | None:
    """Mean distance state of one trajectory over the bank's channels, in the bank's transform."""
    z = states.distance_states(bank.layer)
    ch = np.asarray(states.channel)
    parts = [bank._transform(z[ch == CHANNEL_ID[c]], c) for c in bank.channels if (ch == CHANNEL_ID[c]).any()]
    if not parts:
        return None
    return np.concatenate(parts).mean(axis=0)


def bank_vectors(bank) -> tuple[list[str], np.ndarray]:
    """(traj_ids, (n, d) mean transformed state per bank trajectory), from the bank's own rows."""
    n, d = len(bank.traj_ids_), bank.d_model_
    sums = np.zeros((n, d), dtype=np.float64)
    counts = np.zeros(n, dtype=np.int64)
    for k in ("pos", "neg"):
        for c in bank.channels:
            rows, own = getattr(bank, f"{k}_")[c], getattr(bank, f"{k}_owner_")[c]
            np.add.at(sums, own, rows)
            np.add.at(counts, own, 1)
    keep = counts > 0
    ids = [t for t, m in zip(bank.traj_ids_, keep) if m]
    return ids, (sums[keep] / counts[keep, None]).astype(np.float32)


def loo_distances(ids: Sequence[str], vecs: np.ndarray, instances: Mapping[str, str]) -> np.ndarray:
    """Each bank trajectory's distance to the nearest bank trajectory of another instance."""
    dist = cdist(vecs, vecs)
    inst = np.array([instances[t] for t in ids])
    dist[inst[:, None] == inst[None, :]] = np.inf
    out = dist.min(axis=1)
    return out[np.isfinite(out)]


@dataclass
class Reference:
    """What the guard compares pools with (saved with a sifter; computed from a bank otherwise)."""

    agents: list[str] | None          # None: not recorded (a bare bank): the metadata check is skipped
    scaffolds: list[str] | None
    loo_quantile: float               # threshold on a pool's median nearest-bank distance (NaN: no check)
    loo_median: float
    n_loo: int
    quantile: float = QUANTILE

    def __post_init__(self):
        # JSON stores NaN as null: no reference distribution (a bank of one instance)
        self.loo_quantile = float("nan") if self.loo_quantile is None else float(self.loo_quantile)
        self.loo_median = float("nan") if self.loo_median is None else float(self.loo_median)

    @classmethod
    def from_bank(cls, bank, *, agents=None, scaffolds=None, quantile: float = QUANTILE) -> "Reference":
        ids, vecs = bank_vectors(bank)
        loo = loo_distances(ids, vecs, bank.instances_)
        q = float(np.quantile(loo, quantile)) if len(loo) else float("nan")
        med = float(np.median(loo)) if len(loo) else float("nan")
        return cls(agents=None if agents is None else sorted(agents),
                   scaffolds=None if scaffolds is None else sorted(scaffolds),
                   loo_quantile=q, loo_median=med, n_loo=int(len(loo)), quantile=quantile)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PoolShift:
    instance_id: str
    shifted: bool
    reasons: list[str]
    unseen_agents: list[str]
    unseen_scaffolds: list[str]
    median_nearest_bank_distance: float | None
    threshold: float | None
    nearest_bank_distance: dict[str, float] = field(default_factory=dict)
    action: str = "none"

    def to_dict(self) -> dict:
        return asdict(self)


def check_pools(pools, states: Mapping[str, TrajectoryStates], bank, reference: Reference) -> list[PoolShift]:
    """One ``PoolShift`` per pool (sorted by instance): the decision and the numbers behind it."""
    ids, vecs = bank_vectors(bank)
    out = []
    thr = reference.loo_quantile
    for p in sorted(pools, key=lambda p: p.instance_id):
        agents = sorted({c.agent for c in p.candidates})
        scaffolds = sorted({scaffold_of(c) for c in p.candidates})
        unseen_a = [] if reference.agents is None else [a for a in agents if a not in reference.agents]
        unseen_s = [] if reference.scaffolds is None else [s for s in scaffolds if s not in reference.scaffolds]
        near = {}
        for c in p.candidates:
            v = trajectory_vector(states[c.traj_id], bank)
            if v is not None:
                near[c.traj_id] = float(cdist(v[None, :], vecs).min())
        med = float(np.median(list(near.values()))) if near else None
        reasons = []
        if unseen_a:
            reasons.append(f"agent(s) {unseen_a} absent from the bank (seen: {reference.agents})")
        if unseen_s:
            reasons.append(f"scaffold(s) {unseen_s} absent from the bank (seen: {reference.scaffolds})")
        if med is not None and np.isfinite(thr) and med > thr:
            reasons.append(f"median nearest-bank distance {med:.4g} > {thr:.4g} (the {reference.quantile:.0%} "
                           f"quantile of the bank's leave-one-instance-out distances, median {reference.loo_median:.4g})")
        out.append(PoolShift(p.instance_id, bool(reasons), reasons, unseen_a, unseen_s, med,
                             None if not np.isfinite(thr) else thr, near))
    return out


def apply_on_shift(results, shifts: Sequence[PoolShift], on_shift: str) -> list[str]:
    """Apply ``on_shift`` to the filter's ``PoolResult`` list in place; returns warning lines.

    "keep-all": every candidate of a shifted pool is retained (Stage 1 skipped; scores kept for
    inspection). "error": raises before anything is written. "warn": results unchanged.
    """
    check_choice(on_shift, "on_shift", "filter", ON_SHIFT)
    bad = [s for s in shifts if s.shifted]
    if bad and on_shift == "error":
        lines = "; ".join(f"{s.instance_id}: {', '.join(s.reasons)}" for s in bad[:5])
        raise LatentSiftError(f"{len(bad)} of {len(shifts)} pools are out of the bank's distribution ({lines}). "
                              "Refit on trajectories of this agent, or pass --on-shift warn|keep-all.")
    by = {r.instance_id: r for r in results}
    for s in bad:
        s.action = "stage 1 skipped: every candidate kept" if on_shift == "keep-all" else "warned"
        if on_shift == "keep-all":
            r = by[s.instance_id]
            for c in r.candidates:
                c.retained = True
            r.n_keep = len(r.candidates)
    return [f"{s.instance_id}: " + "; ".join(s.reasons) for s in bad]


def guard(results, pools, states: Mapping[str, TrajectoryStates], bank, reference: Reference,
          on_shift: str) -> tuple[dict, list[str]]:
    """The shift guard on a filter's results: check every pool, apply ``on_shift``, and return the
    ``shift`` section of the filter output (the decision and its numbers per pool) and warning lines."""
    shifts = check_pools(pools, states, bank, reference)
    warnings = apply_on_shift(results, shifts, on_shift)
    return ({"on_shift": on_shift, "reference": reference.to_dict(), "n_shifted": sum(s.shifted for s in shifts),
             "pools": [s.to_dict() for s in shifts]}, warnings)
