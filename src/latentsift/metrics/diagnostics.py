"""Selection diagnostics for Stage-1 scores: does a score carry signal beyond length and agent?

All functions take a per-candidate table as parallel 1-D arrays (one entry per candidate):
``instance_id`` (str), ``traj_id`` (str, unique), ``agent`` (str), ``label`` (0/1, 1 = resolved),
``n_chars`` (int), ``n_steps`` (int), and a ``score`` (float, **higher = better**).

Conventions
-----------
- **Missing scores.** NaN means missing and counts as the lowest possible score (as in
  :mod:`latentsift.sift.rank` and :mod:`latentsift.sift.retain`): a missing score loses to every present one,
  two missing scores tie. ``inf`` is rejected.
- **Within-pool AUC** (headline: *pair-weighted*). Over every pair (p, q) of candidates of the same
  instance with ``label[p] = 1`` and ``label[q] = 0``: ``AUC = mean(1[s_p > s_q] + 1/2 1[s_p = s_q])``.
  Only mixed pools (at least one resolved and one unresolved candidate) have pairs; single-candidate
  and all-same-label pools contribute nothing. ``weighting="instances"`` gives the per-instance-
  weighted variant instead: the mean over mixed instances of each instance's own AUC (every mixed
  pool counts once, however many pairs it has). With no pair at all the AUC is NaN and ``n_pairs = 0``.
- **Within-instance Spearman.** Each variable is turned into within-instance normalised ranks
  (paper appendix, "Within-instance rank normalization"; ties get mean ranks, NaN lowest); the
  Pearson correlation of those ranks is
  taken over the candidates of instances that have >= 2 candidates and in which *neither* variable
  is constant (such instances carry no within-instance information about the association; with 2+
  candidates the normalised ranks of every instance have mean 1/2, so pooling them is a pure
  within-instance correlation). Instances weigh by their number of candidates.
- **Paired bootstrap.** Instances are drawn with replacement (``n_boot`` resamples, generator
  ``np.random.default_rng(seed)``); each resample is a vector of instance multiplicities, and every
  metric is computed on the same multiplicities for both arms, so the difference is paired. The
  interval is the ``level`` percentile interval of the resampled differences; resamples in which
  the difference is undefined (e.g. no mixed instance drawn) are left out and counted
  (``n_boot - n_valid``). A score compared with itself gives exactly 0 with a zero-width interval.

Cost: the list of same-instance (resolved, unresolved) pairs is built once per table
(O(number of pairs)) and reused; bootstrap resamples weigh per-instance sums by multiplicities, so
one resample costs one (n_instances,) dot product per score.

``score_table.diagnostics_table`` gathers every diagnostic of every score into one JSON table (the
``selection`` section of summary.json) from the measures defined here.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from .bootstrap import CI_LEVEL, N_BOOT, bootstrap_weights
from ..sift.rank import grouped_ranks_by_code
from .._core.validation import LatentSiftError, check_choice, check_scores, param_error

WEIGHTINGS = ("pairs", "instances")

__all__ = ["AUC", "Spearman", "PairedDifference", "within_pool_auc", "same_agent_auc", "per_agent_auc",
           "spearman_with", "paired_bootstrap", "auc_difference_ci", "retention_difference_ci",
           "interval_outcome", "N_BOOT", "CI_LEVEL"]


class AUC(NamedTuple):
    """Within-pool AUC, the number of (resolved, unresolved) pairs and of mixed instances behind it."""

    auc: float
    n_pairs: int
    n_instances: int


class Spearman(NamedTuple):
    """Rank correlation, the number of candidates and (within-instance version) instances used."""

    rho: float
    n: int
    n_instances: int | None


@dataclass(frozen=True)
class PairedDifference:
    """metric(A) - metric(B) with its paired-bootstrap percentile interval."""

    estimate: float     # metric(A) - metric(B) on the full sample
    lo: float
    hi: float
    a: float            # metric(A) on the full sample
    b: float            # metric(B) on the full sample
    level: float
    n_boot: int
    n_valid: int        # resamples in which the difference was defined
    n_instances: int    # instances resampled

    def as_dict(self) -> dict:
        return {k: _json_num(v) for k, v in asdict(self).items()}


# ----------------------------------------------------------------------------- validation

def _check_1d(x: Any, name: str, owner: str, n: int | None) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise param_error(name, owner, "a 1-D sequence", f"an array of shape {arr.shape}")
    if arr.shape[0] == 0:
        raise param_error(name, owner, "a non-empty sequence (one entry per candidate)", "an empty sequence")
    if n is not None and arr.shape[0] != n:
        raise LatentSiftError(f"The '{name}' parameter of {owner} must have one entry per candidate "
                              f"({n}). Got {arr.shape[0]} instead.")
    return arr


def _check_ids(x: Any, name: str, owner: str, n: int | None = None) -> np.ndarray:
    arr = _check_1d(x, name, owner, n)
    if arr.dtype.kind not in "UO" or not all(isinstance(v, str) and v for v in arr.tolist()):
        bad = next((v for v in arr.tolist() if not (isinstance(v, str) and v)), arr[0])
        raise param_error(name, owner, "a sequence of non-empty strings", bad)
    return arr.astype(str)


def _check_labels(x: Any, name: str, owner: str, n: int) -> np.ndarray:
    arr = _check_1d(x, name, owner, n)
    if arr.dtype.kind == "b":
        return arr.astype(np.int8)
    if arr.dtype.kind not in "iuf":
        raise param_error(name, owner, "a sequence of 0/1 labels", f"values of type {arr.dtype}")
    bad = ~np.isin(arr, (0, 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise param_error(name, owner, "0/1 labels", f"{arr[i].item()!r} at index {i}")
    return arr.astype(np.int8)


def _check_counts(x: Any, name: str, owner: str, n: int) -> np.ndarray:
    arr = _check_1d(x, name, owner, n)
    if arr.dtype.kind not in "iuf":
        raise param_error(name, owner, "a sequence of non-negative integers", f"values of type {arr.dtype}")
    bad = ~np.isfinite(arr.astype(np.float64)) | (arr < 0) | (arr != np.round(arr))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise param_error(name, owner, "non-negative integers", f"{arr[i].item()!r} at index {i}")
    return arr.astype(np.int64)


def _check_score(x: Any, name: str, owner: str, n: int) -> np.ndarray:
    arr = _check_1d(x, name, owner, n)
    return check_scores(arr, name, owner, allow_nan=True)


def _check_level(level: Any, owner: str) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)) or not 0 < level < 1:
        raise param_error("level", owner, "a number strictly between 0 and 1", level)
    return float(level)


def _check_seed(seed: Any, owner: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise param_error("seed", owner, "a non-negative int", seed)
    return int(seed)


def _check_n_boot(n_boot: Any, owner: str) -> int:
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 2:
        raise param_error("n_boot", owner, "an int >= 2", n_boot)
    return int(n_boot)


# ----------------------------------------------------------------------------- pairs and AUC

@dataclass(frozen=True)
class _Pairs:
    """Every same-instance (resolved, unresolved) pair of a table, built once and reused."""

    pos: np.ndarray        # (n_pairs,) index of the resolved candidate
    neg: np.ndarray        # (n_pairs,) index of the unresolved candidate
    inst: np.ndarray       # (n_pairs,) instance code of the pair
    n_inst: int            # number of instances in the table (codes 0..n_inst-1)
    instances: np.ndarray  # (n_inst,) instance ids, code order


def _build_pairs(instance: np.ndarray, label: np.ndarray) -> _Pairs:
    instances, code = np.unique(instance, return_inverse=True)
    n_inst = instances.shape[0]
    order = np.lexsort((label, code))                      # by instance, unresolved (0) first
    n_neg = np.bincount(code, weights=(label == 0), minlength=n_inst).astype(np.int64)
    size = np.bincount(code, minlength=n_inst)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])    # first sorted position of each instance
    pos = np.flatnonzero(label == 1)
    reps = n_neg[code[pos]]                                # each resolved pairs with its pool's unresolved
    pos_rep = np.repeat(pos, reps)
    within = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
    neg = order[np.repeat(start[code[pos]], reps) + within]
    return _Pairs(pos=pos_rep, neg=neg, inst=code[pos_rep], n_inst=n_inst, instances=instances)


def _rankdata(x: np.ndarray) -> np.ndarray:
    """Ordinary ranks 1..n, ties averaged (scipy's ``rankdata``, imported on first use: scipy takes
    ~0.3 s to import, and the command line starts without it)."""
    from scipy.stats import rankdata
    return rankdata(x, method="average")


def _fill_missing(score: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(score), -np.inf, score)       # NaN = missing = lowest


def _pair_wins(score: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    s = _fill_missing(score)
    sp, sn = s[pos], s[neg]
    return (sp > sn) + 0.5 * (sp == sn)                     # 1[s+ > s-] + 1/2 1[s+ = s-]


def _instance_sums(wins: np.ndarray, inst: np.ndarray, n_inst: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-instance sum of pair wins and number of pairs."""
    return (np.bincount(inst, weights=wins, minlength=n_inst),
            np.bincount(inst, minlength=n_inst).astype(np.float64))


def _weighted_auc(w_sum: np.ndarray, n_pairs: np.ndarray, weights: np.ndarray, weighting: str) -> np.ndarray:
    """AUC under instance multiplicities ``weights`` (m, n_inst); NaN where no mixed instance is drawn."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if weighting == "pairs":                           # sum of wins / number of pairs
            return (weights @ w_sum) / (weights @ n_pairs)
        mixed = n_pairs > 0                                # mean over mixed instances of per-instance AUC
        inst_auc = np.where(mixed, w_sum / np.where(mixed, n_pairs, 1.0), 0.0)
        return (weights @ inst_auc) / (weights @ mixed.astype(np.float64))


def _auc(wins: np.ndarray, inst: np.ndarray, n_inst: int, weighting: str) -> AUC:
    w_sum, n_pairs = _instance_sums(wins, inst, n_inst)
    value = _weighted_auc(w_sum, n_pairs, np.ones((1, n_inst)), weighting)[0] if wins.size else np.nan
    return AUC(float(value), int(wins.size), int((n_pairs > 0).sum()))


def _check_pool_inputs(owner: str, instance, label, score, agent=None):
    inst = _check_ids(instance, "instance", owner)
    n = inst.shape[0]
    lab = _check_labels(label, "label", owner, n)
    s = _check_score(score, "score", owner, n)
    ag = None if agent is None else _check_ids(agent, "agent", owner, n)
    return inst, lab, s, ag


def within_pool_auc(instance, label, score, *, weighting: str = "pairs") -> AUC:
    """AUC of resolved vs unresolved over same-instance pairs only (mixed pools only).

    ``AUC = mean over pairs (p resolved, q unresolved, same instance) of 1[s_p > s_q] + 1/2 1[s_p = s_q]``;
    NaN scores are missing and lowest. ``weighting="pairs"`` (headline) pools all pairs;
    ``"instances"`` averages each mixed instance's own AUC. Returns ``AUC(auc, n_pairs, n_instances)``
    (``n_instances`` = mixed instances); NaN with ``n_pairs = 0`` when no pool is mixed.
    """
    owner = "within_pool_auc"
    check_choice(weighting, "weighting", owner, WEIGHTINGS)
    inst, lab, s, _ = _check_pool_inputs(owner, instance, label, score)
    pairs = _build_pairs(inst, lab)
    return _auc(_pair_wins(s, pairs.pos, pairs.neg), pairs.inst, pairs.n_inst, weighting)


def same_agent_auc(instance, label, score, agent, *, weighting: str = "pairs") -> AUC:
    """:func:`within_pool_auc` restricted to pairs whose two candidates come from the same agent.

    Removes the between-agent part of the signal (e.g. one agent resolving more often and writing
    longer trajectories); ``n_instances`` counts instances with at least one such pair.
    """
    owner = "same_agent_auc"
    check_choice(weighting, "weighting", owner, WEIGHTINGS)
    inst, lab, s, ag = _check_pool_inputs(owner, instance, label, score, agent)
    pairs = _build_pairs(inst, lab)
    keep = ag[pairs.pos] == ag[pairs.neg]
    return _auc(_pair_wins(s, pairs.pos[keep], pairs.neg[keep]), pairs.inst[keep], pairs.n_inst, weighting)


def per_agent_auc(instance, label, score, agent, *, weighting: str = "pairs") -> dict[str, AUC]:
    """Within-pool AUC per agent: for each agent, only pairs where both candidates are of that agent."""
    owner = "per_agent_auc"
    check_choice(weighting, "weighting", owner, WEIGHTINGS)
    inst, lab, s, ag = _check_pool_inputs(owner, instance, label, score, agent)
    pairs = _build_pairs(inst, lab)
    return _per_agent(pairs, _pair_wins(s, pairs.pos, pairs.neg), ag, weighting)


def _per_agent(pairs: _Pairs, wins: np.ndarray, agent: np.ndarray, weighting: str) -> dict[str, AUC]:
    out = {}
    for a in np.unique(agent).tolist():
        keep = (agent[pairs.pos] == a) & (agent[pairs.neg] == a)
        out[a] = _auc(wins[keep], pairs.inst[keep], pairs.n_inst, weighting)
    return out


# ----------------------------------------------------------------------------- rank correlation

def _covariate(x: Any, owner: str, n: int) -> tuple[np.ndarray, dict[str, int] | None]:
    """Numbers as given; strings with exactly two levels coded 0/1 (sorted level order)."""
    arr = _check_1d(x, "covariate", owner, n)
    if arr.dtype.kind in "UO":
        levels = sorted(set(arr.tolist()))
        if len(levels) != 2 or not all(isinstance(v, str) for v in levels):
            raise param_error("covariate", owner, "numbers, or strings with exactly two levels (coded 0/1)",
                              f"{len(levels)} distinct values {levels[:5]}")
        return (arr == levels[1]).astype(np.float64), {levels[0]: 0, levels[1]: 1}
    if arr.dtype.kind not in "iufb":
        raise param_error("covariate", owner, "a sequence of numbers", f"values of type {arr.dtype}")
    return check_scores(arr.astype(np.float64), "covariate", owner), None


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if x.size < 2:
        return float("nan")
    xc, yc = x - x.mean(), y - y.mean()
    den = math.sqrt(float(xc @ xc) * float(yc @ yc))
    return float(xc @ yc / den) if den > 0 else float("nan")


def spearman_with(score, covariate, instance=None) -> Spearman:
    """Spearman rank correlation of ``score`` with a ``covariate`` (NaN score = missing = lowest).

    ``covariate``: numbers (e.g. ``n_chars``, ``n_steps``) or strings with exactly two levels (e.g.
    agent names), coded 0 for the first and 1 for the second in sorted order (``"acr"`` -> 0,
    ``"sweagent"`` -> 1). Without ``instance``: the ordinary (pooled) Spearman rho with mean ranks
    for ties, ``n_instances = None``. With ``instance``: the within-instance version, the Pearson
    correlation of within-instance normalised ranks over instances with >= 2
    candidates where neither variable is constant (``n`` and ``n_instances`` count what was used).
    NaN when undefined (a constant variable, or no usable instance).
    """
    owner = "spearman_with"
    s = check_scores(_check_1d(score, "score", owner, None), "score", owner, allow_nan=True)
    n = s.shape[0]
    cov, _ = _covariate(covariate, owner, n)
    if instance is None:
        rs = _rankdata(_fill_missing(s))
        return Spearman(_pearson(rs, _rankdata(cov)), n, None)
    inst = _check_ids(instance, "instance", owner, n)
    return _within_spearman(s, cov, np.unique(inst, return_inverse=True)[1])


def _grouped_ranks(values: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Within-instance normalised ranks (NaN lowest) for integer instance codes: ``rank``'s core."""
    return grouped_ranks_by_code(np.asarray(values, dtype=np.float64), code)


def _within_spearman(s: np.ndarray, cov: np.ndarray, code: np.ndarray, *,
                     score_ranks: np.ndarray | None = None, cov_ranks: np.ndarray | None = None) -> Spearman:
    # within-instance ranks, never pooled across instances
    rs = _grouped_ranks(s, code) if score_ranks is None else score_ranks
    rc = _grouped_ranks(cov, code) if cov_ranks is None else cov_ranks
    n_inst = code.max() + 1

    size = np.bincount(code, minlength=n_inst)

    def varies(r):                                         # instance has a non-constant variable
        mean = np.bincount(code, weights=r, minlength=n_inst) / size
        return np.bincount(code, weights=(r - mean[code]) ** 2, minlength=n_inst) > 1e-12
    ok_inst = varies(rs) & varies(rc)                      # implies >= 2 candidates
    keep = ok_inst[code]
    # with n >= 2 every instance's normalised ranks have mean 1/2: centre there, not at the pooled mean
    x, y = rs[keep] - 0.5, rc[keep] - 0.5
    den = math.sqrt(float(x @ x) * float(y @ y))
    rho = float(x @ y / den) if den > 0 else float("nan")  # Pearson of within-instance ranks
    return Spearman(rho, int(keep.sum()), int(ok_inst.sum()))


# ----------------------------------------------------------------------------- paired bootstrap

def paired_bootstrap(metric_fn: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], instances,
                     n_boot: int = N_BOOT, seed: int = 0, *, level: float = CI_LEVEL) -> PairedDifference:
    """Paired bootstrap over instances of metric(A) - metric(B).

    ``metric_fn(weights)`` receives an (m, n_instances) float array of instance multiplicities (row
    ``[1, 1, ..., 1]`` is the full sample; column j is ``instances[j]``) and returns a pair
    ``(metric_a, metric_b)`` of (m,) arrays computed under those weights; both arms see the same
    resample. Instances are drawn with replacement ``n_boot`` times from ``np.random.default_rng(seed)``;
    the interval is the ``level`` percentile interval of the differences, leaving out resamples where
    the difference is not finite (``n_valid`` counts the others).
    """
    owner = "paired_bootstrap"
    if not callable(metric_fn):
        raise param_error("metric_fn", owner, "a callable weights -> (metric_a, metric_b)", metric_fn)
    ids = _check_ids(instances, "instances", owner)
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise param_error("instances", owner, "a sequence of distinct instance ids", "duplicated ids")
    n_boot, seed, level = _check_n_boot(n_boot, owner), _check_seed(seed, owner), _check_level(level, owner)
    n = ids.shape[0]
    weights = np.vstack([np.ones((1, n)), bootstrap_weights(n, n_boot, np.random.default_rng(seed))])
    a, b = (np.asarray(v, dtype=np.float64).reshape(-1) for v in metric_fn(weights))
    if a.shape != (n_boot + 1,) or b.shape != (n_boot + 1,):
        raise LatentSiftError(f"The 'metric_fn' parameter of {owner} must return two arrays of one value "
                              f"per weight row ({n_boot + 1}). Got shapes {a.shape} and {b.shape} instead.")
    return _paired_difference(a, b, level, n_boot, n)


def interval_outcome(d: Mapping | None) -> str:
    """'higher' / 'lower' / 'undetermined' from a paired difference's interval: above 0, below 0, or
    containing 0 ('unavailable' when there is no interval). The decision rule of ``protocol.decide``."""
    if not d or d.get("lo") is None or d.get("hi") is None:
        return "unavailable"
    return "higher" if d["lo"] > 0 else "lower" if d["hi"] < 0 else "undetermined"


def _paired_difference(a: np.ndarray, b: np.ndarray, level: float, n_boot: int, n_inst: int) -> PairedDifference:
    """Row 0 of ``a``/``b`` is the full sample, rows 1.. the resamples (the same for both arms)."""
    diff = a[1:] - b[1:]
    ok = diff[np.isfinite(diff)]
    lo, hi = (np.percentile(ok, [50 * (1 - level), 50 * (1 + level)]) if ok.size else (np.nan, np.nan))
    return PairedDifference(estimate=float(a[0] - b[0]), lo=float(lo), hi=float(hi), a=float(a[0]),
                            b=float(b[0]), level=level, n_boot=n_boot, n_valid=int(ok.size), n_instances=n_inst)


def auc_difference_ci(table: Mapping[str, Any], score_a, score_b, *, weighting: str = "pairs",
                      n_boot: int = N_BOOT, seed: int = 0, level: float = CI_LEVEL) -> PairedDifference:
    """Within-pool AUC of ``score_a`` minus that of ``score_b``, paired bootstrap over instances.

    ``table`` needs ``instance_id`` and ``label`` (other columns are ignored here); every instance of
    the table is resampled, pools that are not mixed simply contribute no pair.
    """
    owner = "auc_difference_ci"
    check_choice(weighting, "weighting", owner, WEIGHTINGS)
    inst, lab = _table_core(table, owner)
    n = inst.shape[0]
    sa, sb = _check_score(score_a, "score_a", owner, n), _check_score(score_b, "score_b", owner, n)
    pairs = _build_pairs(inst, lab)
    return _auc_diff(pairs, sa, sb, weighting, n_boot, seed, level, owner)


def _auc_diff(pairs: _Pairs, sa, sb, weighting, n_boot, seed, level, owner) -> PairedDifference:
    sums_a = _instance_sums(_pair_wins(sa, pairs.pos, pairs.neg), pairs.inst, pairs.n_inst)
    sums_b = _instance_sums(_pair_wins(sb, pairs.pos, pairs.neg), pairs.inst, pairs.n_inst)

    def metric(weights):
        return (_weighted_auc(*sums_a, weights, weighting), _weighted_auc(*sums_b, weights, weighting))
    return paired_bootstrap(metric, pairs.instances, n_boot=n_boot, seed=seed, level=level)


def _values(x: Any, name: str, owner: str) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(x, Mapping):
        keys = sorted(x)
        if not keys:
            raise param_error(name, owner, "a non-empty mapping instance_id -> value", "an empty mapping")
        return check_scores([x[k] for k in keys], name, owner, allow_nan=True), np.array(keys, dtype=str)
    return check_scores(_check_1d(x, name, owner, None), name, owner, allow_nan=True), None


def retention_difference_ci(per_instance_a, per_instance_b, *, n_boot: int = N_BOOT, seed: int = 0,
                            level: float = CI_LEVEL) -> PairedDifference:
    """Mean per-instance retention of filter A minus filter B, paired bootstrap over instances.

    Each input holds one value per instance (its retention, the mean over its draws, in [0, 1]),
    either as aligned arrays or as mappings instance_id -> value (then the key sets must match).
    NaN marks an instance where retention is undefined (no draw contains a resolved candidate);
    an instance NaN in either arm is dropped from both. Note: this is the mean of per-instance
    retentions; :mod:`latentsift.metrics.evaluate` reports the pooled ratio over draws.
    """
    owner = "retention_difference_ci"
    a, ka = _values(per_instance_a, "per_instance_a", owner)
    b, kb = _values(per_instance_b, "per_instance_b", owner)
    if (ka is None) != (kb is None):
        raise LatentSiftError(f"The parameters of {owner} must both be arrays or both be mappings "
                              f"instance_id -> value.")
    if ka is not None and not np.array_equal(ka, kb):
        extra = sorted(set(ka.tolist()) ^ set(kb.tolist()))[:3]
        raise LatentSiftError(f"The 'per_instance_a' and 'per_instance_b' parameters of {owner} must have "
                              f"the same instances. Got differing instances, e.g. {extra}.")
    if a.shape != b.shape:
        raise LatentSiftError(f"The 'per_instance_b' parameter of {owner} must have one value per instance "
                              f"({a.shape[0]}). Got {b.shape[0]} instead.")
    for arr, name in ((a, "per_instance_a"), (b, "per_instance_b")):
        bad = (arr < 0) | (arr > 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise param_error(name, owner, "retentions in [0, 1] (NaN = undefined)", f"{arr[i]!r} at index {i}")
    keep = ~np.isnan(a) & ~np.isnan(b)                     # dropped consistently in both arms
    if not keep.any():
        raise LatentSiftError(f"The parameters of {owner} have no instance where both retentions are defined.")
    a, b = a[keep], b[keep]
    ids = ka[keep] if ka is not None else np.array([str(i) for i in np.flatnonzero(keep)])

    def metric(weights):
        total = weights.sum(axis=1)
        return weights @ a / total, weights @ b / total
    return paired_bootstrap(metric, ids, n_boot=n_boot, seed=seed, level=level)


def _table_core(table: Mapping[str, Any], owner: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(table, Mapping):
        raise param_error("table", owner, "a mapping column -> array", type(table).__name__)
    for col in ("instance_id", "label"):
        if col not in table:
            raise LatentSiftError(f"The 'table' parameter of {owner} lacks the column '{col}'.")
    inst = _check_ids(table["instance_id"], "instance_id", owner)
    return inst, _check_labels(table["label"], "label", owner, inst.shape[0])


def _json_num(x: Any) -> Any:
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x
