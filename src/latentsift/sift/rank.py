"""Within-instance rank normalisation (paper Eq. 4, appendix "Within-instance rank normalization").

Two rules for a missing score (NaN):

- ``normalized_ranks`` (any single score: the learned branch's q_lin, a rule's score): a missing
  score ranks below every present one; several missing scores tie and share the mean of their ranks.
- ``channel_ranks`` / ``min_channel_rank`` / ``null_min_rank`` (the distance branch, s_dist; paper Eq. 4
  and the appendix's s_dist = min_c r_c): a channel ranks only the candidates that have it (n in
  r = rho / max(n - 1, 1) is the number of those), m = min_c r_c is the minimum over the channels a
  candidate is ranked in, and s_dist is m mapped through its distribution under no signal
  (``null_min_rank``), so that s_dist does not depend on how many channels a candidate has. The paper's
  trajectories always carry all three channels; where one is absent (a scaffold whose candidate submits
  at once has no observation, a one-turn candidate with no reasoning text) neither reading of the
  paper's min is neutral: ranking the absent channel lowest gives the candidate the lowest s_dist of its
  pool for a channel it never had, and the minimum over fewer ranks is larger on average (about 1/2 for
  one rank, 1/3 for the lower of two, 1/4 for three), which lifts a candidate for a channel it lacks
  whatever its states say.

  The null (no signal in any channel): a channel's scores are exchangeable among its n_c holders, so a
  candidate's rank there is k / max(n_c - 1, 1) with k uniform on 0 .. n_c - 1, independently across
  channels (the channels' scores are independent noise). The minimum M of a candidate's ranked channels
  then has, exactly, P(M >= m) = prod_c #{k : k / d_c >= m} / n_c and P(M > m) = prod_c
  #{k : k / d_c > m} / n_c (d_c = max(n_c - 1, 1)), and s_dist is its mid-distribution function
  (null_min_rank, Eq. 4'):

      s_dist = P(M < m) + P(M = m) / 2 = 1 - (P(M >= m) + P(M > m)) / 2.

  Why this and not the continuous 1 - (1 - m)^c: the ranks are discrete and include both ends 0 and 1,
  so the continuous formula is off for the pools met here (the lower of three ranks among 6 averages
  0.208, not 1/4; among 2 candidates the continuous map sends a three-channel candidate to 0 with
  probability 7/8, null mean 1/8 against 1/2 for one channel). The mid-distribution has null mean
  exactly 1/2 whatever c and the n_c are (E[F(M-) + P(M)/2] = 1/2 for any discrete M), tends to
  1 - (1 - m)^c as the n_c grow, is strictly increasing in m for a fixed set of channels and holder
  counts (so where every candidate has the same channels the order of s_dist is the paper's min: only
  its value, hence the fused score of Eq. 3, moves), and for one channel maps rank k to (k + 1/2) / n_c.
  It makes a missing channel neutral on average, not exactly in every finite pool: the pool's
  candidates share each channel's permutation of ranks, and two candidates' s_dist take different
  discrete values. On pure-noise pools where channel presence goes with the label (3,000 pools, half of
  each pool lacking the channel(s)) the within-pool AUC of s_dist is 0.522 (K = 16) and 0.529 (K = 8)
  when the observation is missing, 0.510 and 0.515 when two channels of three are; the plain min gives
  0.601 / 0.615 and 0.750 / 0.759 (tests/test_missing_channel.py). Two edge cases, written here because
  the paper does not meet them:

  * a channel that only one candidate of a set of several has ranks it against nobody (the paper's
    "a single candidate receives rank 0" is the rank of a pool of one, where no order is chosen), so
    that channel does not count for it either;
  * a candidate ranked in no channel gets ``NEUTRAL_RANK`` = 0.5, the null mean of every other
    candidate's s_dist and the rank the paper gives candidates whose scores cannot be told apart (all
    equal, n > 1): no distance evidence is neither the lowest rank (which claims evidence against it)
    nor the top (which would reward a candidate for lacking every channel). Fused at 0.5/0.5 (Eq. 3),
    such candidates are then ordered among themselves by the learned branch alone.
"""
from __future__ import annotations

import numpy as np

from .._core.validation import check_scores

PAIRWISE_MAX = 32  # NaN-free arrays up to this length are ranked by pairwise counts
NEUTRAL_RANK = 0.5  # s_dist of a candidate ranked in no channel: the null mean of s_dist (module docstring)
_GRID_TOL = 1e-9  # a rank within this of a grid point k / d is that point (float error of rho / d * d)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Zero-based ascending ranks, ties sharing the mean of the ranks they occupy.

    Written with numpy instead of ``scipy.stats.rankdata(method="average")`` (same result, tested)
    because the evaluation calls it for every draw of every filter and scipy's per-call overhead
    dominated there (~180 us vs ~15 us for a pool of 6).
    """
    if x.shape[0] <= PAIRWISE_MAX and not np.isnan(x).any():
        return _pairwise_ranks(x)
    return _sorted_ranks(x)


def _pairwise_ranks(x: np.ndarray) -> np.ndarray:
    """``average_ranks`` of a short, NaN-free array by counting: a value with ``less`` smaller and ``eq``
    equal values (itself included) occupies ranks less .. less + eq - 1, mean (2 less + eq - 1) / 2:
    the same integers halved as :func:`_sorted_ranks` computes, so the same bits (tested); about two
    thirds of the time for a pool of 6, where a sort's fixed costs dominate."""
    col = x[:, None]
    return (2 * (x < col).sum(axis=1) + (x == col).sum(axis=1) - 1) / 2.0


def _sorted_ranks(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    new = np.empty(n, dtype=bool)
    new[:1] = True
    new[1:] = xs[1:] != xs[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends - 1) / 2.0, ends - starts)
    return ranks


def _normalized_ranks(scores: np.ndarray) -> np.ndarray:
    n = scores.shape[0]
    if n == 0:
        return np.zeros(0)
    filled = np.where(np.isnan(scores), -np.inf, scores)
    rho = average_ranks(filled)  # Eq. 4: zero-based ranks, ties get the mean rank
    return rho / max(n - 1, 1)  # Eq. 4: r = rho / max(n-1, 1)


def normalized_ranks(scores) -> np.ndarray:
    """Normalised ranks in [0, 1] of one instance's scores, ascending (higher score, higher rank).

    Ties get the mean of the ranks they occupy; all equal with n > 1 gives 0.5 each; n = 1 gives 0.
    NaN means missing and ranks lowest. Example: (1, 1, 2, 2) -> (1/6, 1/6, 5/6, 5/6).
    """
    return _normalized_ranks(check_scores(scores, "scores", "normalized_ranks", allow_nan=True))


def _grouped_inputs(scores, groups, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """(scores, integer group codes 0..G-1) of a grouped ranking, checked."""
    s = check_scores(scores, "scores", owner, allow_nan=True)
    g = np.asarray(groups)
    if g.shape != s.shape:
        raise ValueError(f"The 'groups' parameter of {owner} must have one entry per "
                         f"score ({s.shape[0]}). Got {g.shape[0] if g.ndim else 0} instead.")
    return s, (np.unique(g, return_inverse=True)[1] if s.size else np.zeros(0, dtype=np.int64))


def grouped_normalized_ranks(scores, groups) -> np.ndarray:
    """``normalized_ranks`` applied within each group (instance) separately; never pooled across groups."""
    s, code = _grouped_inputs(scores, groups, "grouped_normalized_ranks")
    return grouped_ranks_by_code(s, code) if s.size else np.zeros(0)


def grouped_ranks_by_code(s: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """Core of ``grouped_normalized_ranks`` for trusted float scores and integer group codes 0..G-1."""
    filled = np.where(np.isnan(s), -np.inf, s)
    # one lexsort by (group, score): tie groups never cross instance boundaries
    order = np.lexsort((filled, inverse))
    gs, xs = inverse[order], filled[order]
    new = np.ones(len(s), dtype=bool)
    new[1:] = (gs[1:] != gs[:-1]) | (xs[1:] != xs[:-1])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(s))
    group_start = np.searchsorted(gs, gs, side="left")  # first sorted position of each row's group
    n_group = np.bincount(inverse)[gs]
    rho = np.repeat((starts + ends - 1) / 2.0, ends - starts) - group_start  # Eq. 4 within the group
    out = np.empty(len(s), dtype=np.float64)
    out[order] = rho / np.maximum(n_group - 1, 1)
    return out


def _channel_ranks(q: np.ndarray) -> np.ndarray:
    n = q.shape[0]
    have = ~np.isnan(q)
    m = int(have.sum())
    if m == n:
        return _normalized_ranks(q)
    out = np.full(n, np.nan)
    if m >= 2:  # fewer: no candidate is ranked against another in this channel
        out[have] = average_ranks(q[have]) / (m - 1)  # Eq. 4 over the m candidates that have the channel
    return out


def channel_ranks(scores) -> np.ndarray:
    """r_c of one channel within one instance: normalised ranks among the candidates that have a score.

    NaN (no state in the channel) stays NaN: the candidate is not ranked in this channel. A set of
    several candidates of which only one has the channel ranks nobody (NaN for all). Otherwise as
    ``normalized_ranks`` with n = the number of candidates that have the channel (module docstring).
    Example: (NaN, 2, 1, 3) -> (NaN, 0.5, 0, 1).
    """
    return _channel_ranks(check_scores(scores, "scores", "channel_ranks", allow_nan=True))


def grouped_channel_ranks(scores, groups) -> np.ndarray:
    """``channel_ranks`` within each group (instance) separately; never pooled across groups."""
    s, code = _grouped_inputs(scores, groups, "grouped_channel_ranks")
    out = np.full(s.shape[0], np.nan)
    if s.size == 0:
        return out
    have = ~np.isnan(s)
    n_have = np.bincount(code[have], minlength=code.max() + 1)
    n_all = np.bincount(code)
    ranked = have & ((n_have[code] >= 2) | (n_all[code] == 1))  # a lone holder of several is not ranked
    if ranked.any():
        out[ranked] = grouped_ranks_by_code(s[ranked], code[ranked])  # Eq. 4 among the group's holders
    return out


def _rank_matrix(ranks, owner: str) -> np.ndarray:
    r = np.asarray(ranks, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] == 0:
        raise ValueError(f"The 'ranks' parameter of {owner} must be a 2-D array "
                         f"(n_channels, n_candidates) with at least one channel. Got shape {r.shape} instead.")
    return r


def min_channel_rank(ranks) -> np.ndarray:
    """m = min over the channels a candidate is ranked in of r_c (Eq. 4).

    ``ranks`` is (n_channels, n_candidates), NaN where a candidate is not ranked in a channel
    (``channel_ranks``). A candidate ranked in no channel gets ``NEUTRAL_RANK``. The distance branch's
    s_dist is this m through its null distribution (``null_min_rank``; module docstring)."""
    r = _rank_matrix(ranks, "min_channel_rank")
    low = np.where(np.isnan(r), np.inf, r).min(axis=0)  # m = min_c r_c over the ranked channels (Eq. 4)
    return np.where(np.isinf(low), NEUTRAL_RANK, low)


def null_min_rank(ranks, groups=None) -> np.ndarray:
    """s_dist: the mid-distribution function, under no signal, of m = ``min_channel_rank`` (Eq. 4').

    ``ranks`` as ``min_channel_rank``'s, of one instance (``channel_ranks``), or of several with
    ``groups`` (one per candidate; ``grouped_channel_ranks``): a channel's holder count n_c is counted in
    the candidate's own instance. s_dist = 1 - (P(M >= m) + P(M > m)) / 2 with P(M >= m) =
    prod_c #{k in 0..n_c-1 : k / d_c >= m} / n_c over the candidate's ranked channels (module docstring:
    null mean 1/2 whatever the number of channels; same order as m where all hold the same channels).
    A candidate ranked in no channel gets ``NEUTRAL_RANK``, and so does, by the formula, a pool of one
    (its ranks are the paper's 0, the only point of each grid). Example: one channel ranked among 4,
    r = (0, 1/3, 2/3, 1) -> (1/8, 3/8, 5/8, 7/8).
    """
    r = _rank_matrix(ranks, "null_min_rank")
    if r.shape[1] == 0:
        return np.zeros(0)
    have = ~np.isnan(r)
    if groups is None:
        n = np.broadcast_to(have.sum(axis=1, keepdims=True), r.shape)
    else:
        _, code = _grouped_inputs(r[0], groups, "null_min_rank")
        n = np.stack([np.bincount(code[h], minlength=code.max() + 1)[code] for h in have])
    m = min_channel_rank(r)
    k = m * np.maximum(n - 1, 1)  # m on channel c's grid k / d_c (d_c = max(n_c - 1, 1))
    at_least = np.where(have, (n - np.ceil(k - _GRID_TOL)) / np.maximum(n, 1), 1.0).prod(axis=0)  # P(M >= m)
    above = np.where(have, (n - 1 - np.floor(k + _GRID_TOL)) / np.maximum(n, 1), 1.0).prod(axis=0)  # P(M > m)
    return np.where(have.any(axis=0), 1.0 - (at_least + above) / 2.0, NEUTRAL_RANK)  # Eq. 4'
