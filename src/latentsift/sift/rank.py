"""Within-instance rank normalisation (paper Eq. 4, appendix "Within-instance rank normalization").

Two rules for a missing score (NaN):

- ``normalized_ranks`` (any single score: the learned branch's q_lin, a rule's score): a missing
  score ranks below every present one; several missing scores tie and share the mean of their ranks.
- ``channel_ranks`` / ``min_channel_rank`` (the distance branch, s_dist = min_c r_c, paper Eq. 4 and
  the appendix's s_dist = min_c r_c): a channel ranks only the candidates that have it (n in
  r = rho / max(n - 1, 1) is the number of those), and a candidate's s_dist is the minimum over the
  channels it is ranked in. The paper's trajectories always carry all three channels; where one is
  absent (a scaffold whose candidate submits at once has no observation) this is its rule read
  faithfully: ranking the absent channel lowest would give the candidate the lowest s_dist of its pool
  for a channel it never had, whatever its other channels say. Two edge cases, written here because the
  paper does not meet them:

  * a channel that only one candidate of a set of several has ranks it against nobody (the paper's
    "a single candidate receives rank 0" is the rank of a pool of one, where no order is chosen), so
    that channel does not count for it either;
  * a candidate ranked in no channel gets ``NEUTRAL_RANK`` = 0.5, the rank the paper gives candidates
    whose scores cannot be told apart (all equal, n > 1): no distance evidence is neither the lowest
    rank (which claims evidence against it, the defect above) nor the top (the minimum over no channels
    is vacuously the top, which would reward a candidate for lacking every channel). Fused at 0.5/0.5
    (Eq. 3), such candidates are then ordered among themselves by the learned branch alone.
"""
from __future__ import annotations

import numpy as np

from .._core.validation import check_scores

PAIRWISE_MAX = 32  # NaN-free arrays up to this length are ranked by pairwise counts
NEUTRAL_RANK = 0.5  # s_dist of a candidate ranked in no channel (module docstring)


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


def min_channel_rank(ranks) -> np.ndarray:
    """s_dist = min over the channels a candidate is ranked in of r_c (Eq. 4); ``ranks`` is
    (n_channels, n_candidates), NaN where a candidate is not ranked in a channel (``channel_ranks``).
    A candidate ranked in no channel gets ``NEUTRAL_RANK`` (module docstring)."""
    r = np.asarray(ranks, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] == 0:
        raise ValueError(f"The 'ranks' parameter of min_channel_rank must be a 2-D array "
                         f"(n_channels, n_candidates) with at least one channel. Got shape {r.shape} instead.")
    low = np.where(np.isnan(r), np.inf, r).min(axis=0)  # s_dist = min_c r_c over the ranked channels (Eq. 4)
    return np.where(np.isinf(low), NEUTRAL_RANK, low)
