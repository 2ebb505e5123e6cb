"""Shift guard: is a candidate pool like what the bank (or a saved sifter) was built from?

The finding of docs/studies/findings.md is that the state scores mostly encode which agent wrote a trajectory; a bank
applied to an agent or scaffold it never saw can do worse than random, silently. Per pool:

- metadata: the candidates' agents and scaffolds absent from what the bank/sifter has seen
  (``scaffold_of``: ``meta["scaffold"]`` when the user named one at import, else the trajectory's
  agent as the importer read it from the record; never the file format);
- state space: each candidate's trajectory vector (the mean of its distance states over the bank's
  channels, in the bank's transform) and its distance to the nearest bank trajectory, against the
  bank's own leave-one-instance-out nearest distances (each bank trajectory to the nearest bank
  trajectory of another instance, i.e. what a new task of a known agent looks like). The pool is
  out of distribution when the median of its candidates' distances exceeds the ``quantile`` of that
  reference distribution.
- reference (``Reference.from_bank(bank, kind=..., false_alarm=...)``): each bank pool (the bank's
  trajectories of one instance) is scored as a new pool against the rest of the bank, leaving out
  its whole repository (``kind="repository"``, the default: what the repository-disjoint protocol
  assumes, so a pool of a repository the bank never saw is not flagged for that alone) or only its
  instance (``kind="instance"``; also the fallback for a bank of one repository, which has no
  leave-one-repository-out reference). The threshold is
  the ``1 - false_alarm`` quantile of those in-bank pool medians: the guard flags about
  ``false_alarm`` of pools like the bank's.

``on_shift``: "warn" (report it, filter as usual), "keep-all" (Stage 1 skipped for that pool: every
candidate goes on to the next stage) or "error" (refuse; nothing is written).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .._core.validation import LatentSiftError, check_choice
from ..states.states import CHANNEL_ID, TrajectoryStates

ON_SHIFT = ("warn", "keep-all", "error")
REFERENCE_KINDS = ("repository", "instance")
REFERENCE_KIND = "repository"     # leave-one-repository-out in-bank reference pools
FALSE_ALARM = 0.05                # stated false-alarm rate on pools like the bank's: threshold quantile 1 - 0.05


def check_false_alarm(rate: float, name: str, owner: str) -> float:
    """The one range check of the guard's stated false-alarm rate: a number in (0, 1)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate < 1.0:
        raise LatentSiftError(f"The '{name}' parameter of {owner} must be a rate in (0, 1). Got {rate!r} instead.")
    return float(rate)


def scaffold_of(traj) -> str:
    """The scaffold of a trajectory, from the data: ``meta['scaffold']`` when the user named one
    (``latentsift import --scaffold``), else its agent (the importer's reading of the record, e.g.
    an R2E-Gym record's ``agent_args.scaffold``). Never the file format: AutoCodeRover and
    mini-swe-agent runs share the R2E-Gym format and are two scaffolds."""
    return str(traj.meta.get("scaffold") or traj.agent or "")


def _cdist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances between the rows of ``a`` and ``b`` (scipy's ``cdist``, imported on first use:
    scipy takes ~0.3 s to import, and the command line starts without it)."""
    from scipy.spatial.distance import cdist
    return cdist(a, b)


def trajectory_vector(states: TrajectoryStates, bank) -> np.ndarray | None:
    """Mean distance state of one trajectory over the bank's channels, in the bank's transform."""
    z = states.distance_states(bank.layer)
    ch = np.asarray(states.channel)
    parts = [bank.transform(z[ch == CHANNEL_ID[c]], c) for c in bank.channels if (ch == CHANNEL_ID[c]).any()]
    if not parts:
        return None
    return np.concatenate(parts).mean(axis=0)


def ordered_row_sums(rows: np.ndarray, owner: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) float64 sums of ``rows`` per owner and the (n,) row counts: each owner's rows added one
    at a time in their order from 0.0, the bits of ``np.add.at(sums, owner, rows)``, which takes a
    Python-speed path for 2-D rows (~5x slower on a bank). One vectorised add per row rank: the j-th
    row of every owner at once (no owner appears twice in one add)."""
    counts = np.bincount(owner, minlength=n)
    sums = np.zeros((n, rows.shape[1]), dtype=np.float64)
    if len(owner) == 0:
        return sums, counts
    order = np.argsort(owner, kind="stable")
    ranked = owner[order]
    rank = np.empty(len(owner), dtype=np.int64)
    rank[order] = np.arange(len(owner)) - np.searchsorted(ranked, ranked, side="left")
    by_rank = np.argsort(rank, kind="stable")
    per_rank = np.bincount(rank)
    ends = np.cumsum(per_rank)
    for a, z in zip(ends - per_rank, ends):
        sel = by_rank[a:z]
        sums[owner[sel]] += rows[sel]
    return sums, counts


def bank_vectors(bank) -> tuple[list[str], np.ndarray]:
    """(traj_ids, (n, d) mean transformed state per bank trajectory), from the bank's own rows."""
    n = len(bank.traj_ids_)
    parts = [(getattr(bank, f"{k}_")[c], getattr(bank, f"{k}_owner_")[c]) for k in ("pos", "neg")
             for c in bank.channels]
    rows = np.concatenate([r for r, _ in parts]).reshape(-1, bank.d_model_)
    own = np.concatenate([o for _, o in parts]).astype(np.int64)
    sums, counts = ordered_row_sums(rows, own, n)
    keep = counts > 0
    ids = [t for t, m in zip(bank.traj_ids_, keep) if m]
    return ids, (sums[keep] / counts[keep, None]).astype(np.float32)


def loo_distances(ids: Sequence[str], vecs: np.ndarray, instances: Mapping[str, str]) -> np.ndarray:
    """Each bank trajectory's distance to the nearest bank trajectory of another instance."""
    dist = _cdist(vecs, vecs)
    inst = np.array([instances[t] for t in ids])
    dist[inst[:, None] == inst[None, :]] = np.inf
    out = dist.min(axis=1)
    return out[np.isfinite(out)]


def nearest_other_group(ids: Sequence[str], vecs: np.ndarray, groups: Mapping[str, str]) -> np.ndarray:
    """Each bank trajectory's distance to the nearest bank trajectory of another group (inf: none)."""
    dist = _cdist(vecs, vecs)
    g = np.array([groups[t] for t in ids])
    dist[g[:, None] == g[None, :]] = np.inf
    return dist.min(axis=1)


def reference_pool_medians(ids: Sequence[str], vecs: np.ndarray, instances: Mapping[str, str],
                           groups: Mapping[str, str]) -> np.ndarray:
    """Per bank instance (sorted): the median of its trajectories' nearest-other-group distances,
    i.e. the guard's pool statistic for that bank pool scored as a new pool (NaN-free; instances
    with no other group are left out)."""
    near = nearest_other_group(ids, vecs, groups)
    inst = np.array([instances[t] for t in ids])
    out = []
    for i in sorted(set(inst.tolist())):
        d = near[(inst == i) & np.isfinite(near)]
        if len(d):
            out.append(float(np.median(d)))
    return np.asarray(out, dtype=np.float64)


@dataclass
class Reference:
    """What the guard compares pools with (saved with a sifter; computed from a bank otherwise)."""

    agents: list[str] | None          # None: not recorded (a bare bank): the metadata check is skipped
    scaffolds: list[str] | None
    loo_quantile: float               # threshold on a pool's median nearest-bank distance (NaN: no check)
    loo_median: float
    n_loo: int
    quantile: float = 1.0 - FALSE_ALARM  # the threshold's quantile: always 1 - false_alarm
    kind: str = "instance"            # absent from sifters saved before the setting: they used instance
    false_alarm: float | None = None  # the stated rate the threshold was chosen for (None: old sifters)
    pool_medians: list[float] | None = None  # in-bank reference pool statistics (the trade-off curve)

    def __post_init__(self):
        # JSON stores NaN as null: no reference distribution (a bank of one instance)
        self.loo_quantile = float("nan") if self.loo_quantile is None else float(self.loo_quantile)
        self.loo_median = float("nan") if self.loo_median is None else float(self.loo_median)

    @classmethod
    def from_bank(cls, bank, *, agents=None, scaffolds=None, kind: str = REFERENCE_KIND,
                  false_alarm: float = FALSE_ALARM) -> "Reference":
        """The reference of ``bank``: in-bank pools left out by ``kind`` ("repository"/"instance"),
        threshold at their ``1 - false_alarm`` quantile (module docstring)."""
        check_choice(kind, "kind", "Reference.from_bank", REFERENCE_KINDS)
        false_alarm = check_false_alarm(false_alarm, "false_alarm", "Reference.from_bank")
        ids, vecs = bank_vectors(bank)
        if kind == "repository" and len({bank.repos_[t] for t in ids}) < 2:
            kind = "instance"  # one repository: no leave-one-repository-out reference exists
        groups = bank.repos_ if kind == "repository" else bank.instances_
        med = reference_pool_medians(ids, vecs, bank.instances_, groups)
        q = float(np.quantile(med, 1.0 - false_alarm)) if len(med) else float("nan")
        return cls(agents=None if agents is None else sorted(agents),
                   scaffolds=None if scaffolds is None else sorted(scaffolds),
                   loo_quantile=q, loo_median=float(np.median(med)) if len(med) else float("nan"),
                   n_loo=int(len(med)), quantile=1.0 - false_alarm, kind=kind, false_alarm=false_alarm,
                   pool_medians=[float(x) for x in med])

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
                near[c.traj_id] = float(_cdist(v[None, :], vecs).min())
        med = float(np.median(list(near.values()))) if near else None
        reasons = []
        if unseen_a:
            reasons.append(f"agent(s) {unseen_a} absent from the bank (seen: {reference.agents})")
        if unseen_s:
            reasons.append(f"scaffold(s) {unseen_s} absent from the bank (seen: {reference.scaffolds})")
        if med is not None and np.isfinite(thr) and med > thr:
            reasons.append(f"median nearest-bank distance {med:.4g} > {thr:.4g} (the {reference.quantile:.0%} "
                           f"quantile of the bank's leave-one-{reference.kind}-out distances, median "
                           f"{reference.loo_median:.4g})")
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
