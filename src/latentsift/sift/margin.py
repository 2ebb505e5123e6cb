"""The distance branch's per-channel score (paper Eq. 2, section "Distance scoring and latent filtering").

Inputs are the nearest-neighbour distances of one candidate's channel-c states: ``d_pos[i]``,
``d_neg[i]`` and the step index ``steps[i]`` of state i. A channel with no state gives NaN (missing):
the channel does not rank that candidate (see ``rank.channel_ranks``).

The aggregations are segmented (``*_grouped``) and score many candidates at once: ``owner[i]`` is
the candidate number of state i in ``0..n_owners-1`` (one candidate: ``owner = zeros``, ``n_owners = 1``).
"""
from __future__ import annotations

import numpy as np

DISTANCES = ("two-sided", "pos", "neg")
WEIGHTINGS = ("linear", "uniform")


def step_margins(d_pos, d_neg) -> np.ndarray:
    """m[t] = d_neg(z[t]) - d_pos(z[t]) (Eq. 2); positive = closer to success."""
    return np.asarray(d_neg, dtype=np.float64) - np.asarray(d_pos, dtype=np.float64)


def signed_evidence(d_pos, d_neg, distance: str = "two-sided") -> np.ndarray:
    """Per-step evidence: the two-sided margin (Eq. 2), or the one-sided ablations -d_pos / d_neg."""
    if distance == "two-sided":
        return step_margins(d_pos, d_neg)
    if distance == "pos":
        return -np.asarray(d_pos, dtype=np.float64)
    if distance == "neg":
        return np.asarray(d_neg, dtype=np.float64)
    raise ValueError(f"The 'distance' parameter must be one of {list(DISTANCES)}. Got {distance!r} instead.")


def step_weighted_mean_grouped(values, steps, owner, n_owners: int) -> np.ndarray:
    """q = sum_t t*m[t] / sum_t t per owner (Eq. 2); plain mean when the weights sum to 0; NaN if empty."""
    v = np.asarray(values, dtype=np.float64)
    t = np.asarray(steps, dtype=np.float64)
    o = np.asarray(owner, dtype=np.int64)
    wsum = np.bincount(o, weights=t, minlength=n_owners)
    wnum = np.bincount(o, weights=t * v, minlength=n_owners)
    plain = uniform_mean_grouped(v, o, n_owners)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(wsum > 0, wnum / np.where(wsum > 0, wsum, 1.0), plain)


def uniform_mean_grouped(values, owner, n_owners: int) -> np.ndarray:
    """(1/T_c) sum_t m[t] over the steps that have a channel-c state (ablation); NaN if empty."""
    v = np.asarray(values, dtype=np.float64)
    o = np.asarray(owner, dtype=np.int64)
    cnt = np.bincount(o, minlength=n_owners)
    tot = np.bincount(o, weights=v, minlength=n_owners)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)


def channel_scores_grouped(d_pos, d_neg, steps, owner, n_owners: int, *, distance: str = "two-sided",
                           weighting: str = "linear") -> np.ndarray:
    """q_c for every owner: evidence per step (Eq. 2 or ablation) aggregated over steps."""
    ev = signed_evidence(d_pos, d_neg, distance)
    if weighting == "linear":
        return step_weighted_mean_grouped(ev, steps, owner, n_owners)
    if weighting == "uniform":
        return uniform_mean_grouped(ev, owner, n_owners)
    raise ValueError(f"The 'weighting' parameter must be one of {list(WEIGHTINGS)}. Got {weighting!r} instead.")

