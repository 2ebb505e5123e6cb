"""Keep rules (``latentsift.sift.keep``): the interface, the paper's fixed rule, the recall-targeted
rule, and their registration."""
from __future__ import annotations

import numpy as np
import pytest

from latentsift import LatentSiftError, NotFittedError, retain_count, select_retained
from latentsift._core.registry import registry_add, registry_lookup, registry_remove
from latentsift.sift.keep import (PAPER_KEEP, CalibrationPools, FixedKeep, KeepRule, RecallKeep, crc_threshold,
                                  keep_rule, keep_rules, pool_miss_score)


def _pools(rng, n, k=6):
    s = rng.standard_normal((n, k))
    y = (rng.random((n, k)) < 1 / (1 + np.exp(-2 * s))).astype(int)
    ids = [[f"p{i}/c{j}" for j in range(k)] for i in range(n)]
    return CalibrationPools([f"p{i}" for i in range(n)], ids, list(s), list(y))


def test_the_fixed_rule_is_the_papers_retention():
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 4, 5, 8, 9, 16):
        ids = [f"c{j}" for j in range(k)]
        s = rng.integers(0, 3, k).astype(float)   # ties at the cut
        assert PAPER_KEEP.count(k) == retain_count(k) == min(k, max(3, k // 2))
        assert PAPER_KEEP.keep(s, ids).tolist() == select_retained(s, ids).tolist()
        assert FixedKeep(seed=5).keep(s, ids).tolist() == select_retained(s, ids, seed=5).tolist()
    assert PAPER_KEEP.fit(_pools(rng, 3)) is PAPER_KEEP          # nothing to learn
    assert PAPER_KEEP.describe() == "max(3, floor(K/2))"
    assert FixedKeep(2, 0.25).count(12) == 3 and FixedKeep(2, 0.25).describe() == "max(2, floor(0.25 K))"
    with pytest.raises(LatentSiftError, match="'min_keep' parameter of FixedKeep"):
        FixedKeep(0)


def test_the_recall_rule_keeps_every_pool_it_may_not_lose():
    """At n = 19 calibration pools and R = 0.95 no pool may be lost: the threshold is the lowest
    pool-miss score, and each calibration pool keeps a resolved candidate."""
    rng = np.random.default_rng(1)
    cal = _pools(rng, 40)
    rule = RecallKeep(0.95).fit(cal)
    u = np.array([pool_miss_score(s, y, t) for s, y, t in zip(cal.scores, cal.labels, cal.traj_ids)])
    u = u[~np.isnan(u)]
    assert rule.n_calibration_pools_ == u.size and rule.threshold_ == crc_threshold(u, 0.05)
    lost = [not (rule.keep(s, t) & (y == 1)).any() for s, y, t in zip(cal.scores, cal.labels, cal.traj_ids) if y.any()]
    assert sum(lost) <= rule.n_lost_allowed_ == int(np.floor(0.05 * (u.size + 1) - 1 + 1e-9))
    kept = [rule.keep(s, t).sum() for s, t in zip(cal.scores, cal.traj_ids)]
    assert 1 <= min(kept) and np.mean(kept) < 6                   # at least one, not all
    d = rule.to_dict()
    assert d["target_recall"] == 0.95 and d["n_calibration_pools"] == u.size and d["calibration"]["method"] == "isotonic"
    assert 0 <= rule.predict_proba([0.0])[0] <= 1
    assert rule.get_params() == {"target_recall": 0.95, "min_keep": 1, "calibration": "isotonic", "seed": 0}


def test_an_unfitted_or_underfed_recall_rule_refuses():
    with pytest.raises(NotFittedError):
        RecallKeep(0.9).keep([0.1, 0.2], ["a", "b"])
    with pytest.raises(LatentSiftError, match="needs at least 19 calibration pools"):
        RecallKeep(0.95).fit(_pools(np.random.default_rng(2), 5))
    with pytest.raises(LatentSiftError, match="'target_recall' parameter of RecallKeep"):
        RecallKeep(1.5)
    with pytest.raises(LatentSiftError, match="'calibration' parameter of RecallKeep"):
        RecallKeep(0.9, calibration="beta")


class TopOne(KeepRule):
    """A new retention policy: the single best candidate."""

    name = "top-one"

    def keep(self, scores, traj_ids):
        m = np.zeros(len(traj_ids), dtype=bool)
        m[PAPER_KEEP.keep(scores, traj_ids) & (np.asarray(scores) == np.nanmax(scores))] = True
        return m


def test_a_new_keep_rule_is_one_class_and_one_registration():
    assert keep_rules()[:2] == ("fixed", "target-recall")
    assert registry_lookup("keep_rule", "fixed") is FixedKeep and isinstance(keep_rule("target-recall"), RecallKeep)
    registry_add("keep_rule", "top-one", TopOne)
    try:
        assert "top-one" in keep_rules()
        assert keep_rule("top-one").keep([0.1, 0.9, 0.5], ["a", "b", "c"]).tolist() == [False, True, False]
        with pytest.raises(LatentSiftError, match="taken"):
            registry_add("keep_rule", "top-one", FixedKeep)
    finally:
        registry_remove("keep_rule", "top-one")
    with pytest.raises(LatentSiftError, match="Unknown keep rule 'top-one'; registered: fixed, target-recall"):
        keep_rule("top-one")
