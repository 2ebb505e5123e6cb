"""Fusion of the two branch scores (paper Eq. 3, section "Linear scorer and signal fusion")."""
from __future__ import annotations

import numpy as np

FUSION_WEIGHT = 0.5  # paper default: equal weights


def fuse(s_dist, s_lin, weight: float = FUSION_WEIGHT) -> np.ndarray:
    """s = w * s_dist + (1 - w) * s_lin (Eq. 3); w = 0.5 in the paper."""
    if not 0.0 <= float(weight) <= 1.0:
        raise ValueError(f"The 'weight' parameter of fuse must be a float in [0, 1]. Got {weight!r} instead.")
    return weight * np.asarray(s_dist, dtype=np.float64) + (1.0 - weight) * np.asarray(s_lin, dtype=np.float64)
