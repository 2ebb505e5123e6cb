"""Stage-1 retention: keep the max(3, floor(K/2)) highest-scoring candidates (paper appendix, "Candidate selection").

Tie rule at the cut (deterministic, independent of candidate order): higher score first; among equal
scores, the smaller value of sha256(f"{seed}:{traj_id}") first. NaN scores count as lowest.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Sequence

import numpy as np

from .._core.validation import check_positive_int, check_scores, LatentSiftError

#: The keep rules' defaults, spelled here only: the paper's fixed rule keeps max(MIN_KEEP, floor(KEEP_FRAC K))
#: (all when K <= MIN_KEEP); a recall-targeted rule keeps at least TARGET_MIN_KEEP per pool.
MIN_KEEP = 3     # paper: max(3, floor(K/2))
KEEP_FRAC = 0.5
TARGET_MIN_KEEP = 1


def retain_rule_text(min_keep: int = MIN_KEEP, frac: float = KEEP_FRAC) -> str:
    """The fixed rule in words: "max(3, floor(K/2))" for the paper's settings."""
    return f"max({min_keep}, floor({'K/2' if frac == 0.5 else f'{frac:g} K'}))"


def retain_count(k: int, min_keep: int = MIN_KEEP, frac: float = KEEP_FRAC) -> int:
    """Number of candidates Stage 1 keeps: min(K, max(min_keep, floor(frac * K))); all when K <= 3."""
    k = check_positive_int(k, "k", "retain_count")
    return min(k, max(int(min_keep), int(np.floor(frac * k))))


def check_retention(min_keep, frac, owner: str) -> tuple[int, float]:
    """``min_keep`` a positive int and ``frac`` in [0, 1]: Stage 1 must keep at least one candidate of a
    pool (``min_keep`` 0 with a small ``frac`` would retain nothing and end the cascade silently)."""
    if isinstance(min_keep, bool) or not isinstance(min_keep, (int, np.integer)) or min_keep < 1:
        raise LatentSiftError(f"The 'min_keep' parameter of {owner} must be a positive int (Stage 1 keeps at least "
                              f"one candidate; with min_keep 0 a small frac retains nothing). Got {min_keep!r} instead.")
    if isinstance(frac, bool) or not isinstance(frac, (int, float, np.floating)) or not 0.0 <= float(frac) <= 1.0:
        raise LatentSiftError(f"The 'frac' parameter of {owner} must be a number in [0, 1]. Got {frac!r} instead.")
    return int(min_keep), float(frac)


@functools.lru_cache(maxsize=1 << 18)  # the evaluation asks again for every draw of every filter
def tie_key(traj_id: str, seed: int = 0) -> int:
    """Deterministic pseudo-random tie-breaker for one candidate (stable across runs and platforms)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{traj_id}".encode()).digest()[:8], "big")


def order_by_score(scores, traj_ids: Sequence[str], *, seed: int = 0) -> np.ndarray:
    """Indices of candidates from best to worst under the documented tie rule."""
    s = check_scores(scores, "scores", "order_by_score", allow_nan=True)
    if len(traj_ids) != s.shape[0]:
        raise LatentSiftError(f"The 'traj_ids' parameter of order_by_score must have one id per score "
                              f"({s.shape[0]}). Got {len(traj_ids)} instead.")
    primary = np.where(np.isnan(s), -np.inf, s)
    ties = np.array([tie_key(t, seed) for t in traj_ids], dtype=np.uint64)
    return np.lexsort((ties, -primary))


def select_retained(scores, traj_ids: Sequence[str], *, n_keep: int | None = None, seed: int = 0,
                    min_keep: int = MIN_KEEP, frac: float = KEEP_FRAC) -> np.ndarray:
    """Boolean mask of retained candidates: the top ``n_keep`` (default ``retain_count(K)``)."""
    order = order_by_score(scores, traj_ids, seed=seed)
    k = len(order)
    keep = retain_count(k, min_keep, frac) if n_keep is None else min(check_positive_int(n_keep, "n_keep", "select_retained"), k)
    mask = np.zeros(k, dtype=bool)
    mask[order[:keep]] = True
    return mask
