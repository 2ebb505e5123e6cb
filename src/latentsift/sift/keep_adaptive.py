"""Adaptive keep rules: the threshold set on the score's value across pools, not on its within-pool rank.

The protocol's Stage-1 scores are within-pool normalised ranks, so a threshold on them is close to
"keep the top j of K" whatever the pool looks like: a confident pool cannot keep fewer than an
uncertain one of the same K. A filter's *value* (the rule score before ranking, e.g. minus the
characters of shortest-in-characters, or the learned logit q_lin of the paper's method) is
comparable across pools, and a threshold on it adapts per pool. Two ways to use it, both the
recall-targeted rule of ``keep`` (conformal risk control, the same bound and the same calibration
sizes) on a transformed score:

- the value itself (``RecallKeep`` fed the values): keep every candidate whose value reaches tau;
  a pool whose candidates all score low keeps its ``min_keep`` best only;
- ``GapRecallKeep`` ("gap-recall"): keep every candidate within tau of the pool's best value,
  i.e. ``RecallKeep`` on s - max(s) per pool. A pool whose best candidate stands far above the rest
  (confident) keeps one; a pool of close values (uncertain) keeps more. On within-pool ranks
  (max = 1) it is the rank rule itself.

Both are valid under the same exchangeability as the rank rule (the transformation of a pool's
scores depends on that pool only); which keeps fewer candidates at equal realized recall is an
empirical question, measured by ``protocol.operating`` (``adaptive`` in ``operating_points``) and
``bench/adaptive_keep.py``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .._core.registry import registry_add
from .keep import RecallKeep


def gap_scores(scores: Any) -> np.ndarray:
    """s - max(s) over the pool's finite scores (NaN stays NaN; a pool without a finite score: all NaN)."""
    s = np.asarray(scores, dtype=np.float64)
    fin = s[np.isfinite(s)]
    return s - fin.max() if fin.size else np.full_like(s, np.nan)


class GapRecallKeep(RecallKeep):
    """Per pool the ``min_keep`` best and every candidate whose score is within ``-threshold_`` of the
    pool's best (``threshold_`` is on s - max(s) <= 0), the threshold chosen for ``target_recall`` by
    conformal risk control on calibration pools (``RecallKeep`` on the gap scores; module docstring)."""

    name = "gap-recall"

    def threshold_scores(self, scores: Any) -> np.ndarray:
        return gap_scores(scores)


registry_add("keep_rule", "gap-recall", GapRecallKeep)
