"""Calibration and the recall-targeted keep rule (conformal risk control) on synthetic pools."""
from __future__ import annotations

import numpy as np
import pytest

from latentsift import LatentSiftError
from latentsift.calibrate import ece, ece_ci, fit_calibration, reliability
from latentsift.operating import (CalibrationPools, apply_operating_point, check_calibration_size, crc_threshold,
                                  fit_operating_point, keep_mask, min_calibration_pools, pool_miss_score)
from latentsift.sift import CandidateScore, PoolResult


def synthetic_pools(rng, n_pools, k=6, signal=1.5):
    """Exchangeable pools: latent quality per candidate, score = quality + noise, label ~ Bernoulli."""
    q = rng.standard_normal((n_pools, k))
    y = (rng.random((n_pools, k)) < 1 / (1 + np.exp(-(2 * q - 1.5)))).astype(int)
    s = signal * q + rng.standard_normal((n_pools, k))
    ids = [[f"p{i}/c{j}" for j in range(k)] for i in range(n_pools)]
    return CalibrationPools([f"p{i}" for i in range(n_pools)], ids, list(s), list(y))


def realized(op, pools: CalibrationPools):
    """(pool recall over pools holding a resolved candidate, mean candidates kept per pool)."""
    hit, pos, kept = 0, 0, 0
    for t, s, y in zip(pools.traj_ids, pools.scores, pools.labels):
        m = op.keep(s, t)
        kept += m.sum()
        if y.any():
            pos += 1
            hit += bool((m & (y == 1)).any())
    return hit / pos, kept / len(pools.scores)


@pytest.mark.parametrize("target", [0.8, 0.9])
def test_expected_recall_reaches_the_target_over_many_exchangeable_splits(target):
    """What is tested: conformal risk control promises E[recall] >= R over the draw of calibration and
    test pools (marginal, not per split). Over 400 random splits the mean realized recall is at least
    R up to 3 Monte-Carlo standard errors, and at most R + 1/(n+1) + 3 s.e. (the rule is not
    trivially conservative: it keeps fewer than all 6 candidates on average)."""
    rng = np.random.default_rng(1)
    recalls, kept, ns = [], [], []
    for _ in range(400):
        cal, test = synthetic_pools(rng, 60), synthetic_pools(rng, 200)
        cmap = fit_calibration(*cal.flat())
        op = fit_operating_point(cal, cmap, target)
        r, k = realized(op, test)
        recalls.append(r)
        kept.append(k)
        ns.append(op.n_calibration_pools)
    recalls = np.array(recalls)
    se = recalls.std(ddof=1) / np.sqrt(recalls.size)
    assert recalls.mean() >= target - 3 * se
    assert recalls.mean() <= target + 1 / (min(ns) + 1) + 3 * se
    assert np.mean(kept) < 5.5
    # a single split can fall below the target (the guarantee is in expectation): it does here
    assert (recalls < target).any()


def test_crc_threshold_allows_floor_alpha_n_plus_1_minus_1_losses():
    u = np.array([0.1, 0.2, 0.3, 0.4, np.inf, np.inf, 0.5, 0.6, 0.7])  # n = 9
    assert crc_threshold(u, 0.1) == 0.1         # 0.1 * 10 - 1 = 0 losses allowed
    assert crc_threshold(u, 0.2) == 0.2         # one loss: the pool at 0.1
    assert crc_threshold(u, 0.0) == -np.inf     # R = 1: keep all
    assert crc_threshold(u, 0.95) == np.inf     # every finite pool may be lost: min_keep only
    assert (u < crc_threshold(u, 0.3)).sum() == 2
    with pytest.raises(LatentSiftError, match="needs n >= 19"):
        crc_threshold(u, 0.05)
    assert min_calibration_pools(0.9) == 9 and min_calibration_pools(0.99) == 99 and min_calibration_pools(1.0) == 0
    with pytest.raises(LatentSiftError, match="needs at least 9 calibration pools"):
        check_calibration_size(8, 0.9)
    check_calibration_size(9, 0.9)
    check_calibration_size(0, 1.0)


def test_keep_rule_and_pool_miss_score_agree():
    ids = ["a", "b", "c", "d"]
    s = np.array([0.9, 0.2, 0.5, np.nan])
    assert keep_mask(s, ids, np.inf, 1).tolist() == [True, False, False, False]       # confident: one
    assert keep_mask(s, ids, -np.inf, 1).tolist() == [True, True, True, True]         # keep all
    assert keep_mask(s, ids, 0.5, 1).tolist() == [True, False, True, False]
    assert keep_mask(s, ids, np.inf, 2).tolist() == [True, False, True, False]        # min_keep 2
    y = np.array([0, 1, 0, 0])
    u = pool_miss_score(s, y, ids, 1)
    assert u == 0.2
    for tau in (0.1, 0.2, 0.3, 0.9):      # lost exactly when tau > u
        assert (not (keep_mask(s, ids, tau, 1) & (y == 1)).any()) == (tau > u)
    assert pool_miss_score(s, np.array([1, 0, 0, 0]), ids, 1) == np.inf
    assert np.isnan(pool_miss_score(s, np.zeros(4), ids, 1))


def test_calibration_maps_are_monotone_and_ece_of_a_calibrated_model_is_small():
    rng = np.random.default_rng(0)
    s = rng.standard_normal(4000)
    p_true = 1 / (1 + np.exp(-2 * s))
    y = (rng.random(4000) < p_true).astype(int)
    for method in ("isotonic", "platt"):
        m = fit_calibration(s, y, method)
        grid = np.linspace(-4, 4, 200)
        assert np.all(np.diff(m.predict(grid)) >= -1e-12)
        assert ece(m.predict(s), y) < 0.05
        assert np.abs(m.predict(grid) - 1 / (1 + np.exp(-2 * grid)))[50:150].max() < 0.15
    assert ece(np.full(4000, 0.9), y) > 0.3          # a badly calibrated constant
    groups = [f"p{i // 4}" for i in range(4000)]
    ci = ece_ci(p_true, y, groups, n_boot=200, seed=0)
    assert ci["lo"] <= ci["mean"] <= ci["hi"] and ci["hi"] < 0.08
    rel = reliability(p_true, y)
    assert sum(rel["count"]) == 4000 and np.allclose(rel["mean_p"], rel["frac_resolved"], atol=0.06)
    const = fit_calibration([0.1, 0.5, 0.9], [1, 1, 1])
    assert np.allclose(const.predict([0.0, 2.0]), 1.0)


def _pool(iid, scores):
    cands = [CandidateScore(traj_id=f"{iid}/{j}", instance_id=iid, s=float(v), retained=False)
             for j, v in enumerate(scores)]
    return PoolResult(iid, "x", 0, cands)


def test_a_flagged_pool_is_never_reported_as_guaranteed():
    rng = np.random.default_rng(3)
    cal = synthetic_pools(rng, 80)
    op = fit_operating_point(cal, fit_calibration(*cal.flat()), 0.9)
    results = [_pool(f"p{i}", rng.standard_normal(5)) for i in range(6)]
    for on_shift in ("keep-all", "warn"):
        rows = apply_operating_point(results, op, shifted=["p1", "p4"], on_shift=on_shift)
        assert [r["guaranteed"] for r in rows] == [True, False, True, True, False, True]
        for r, res in zip(rows, results):
            assert r["n_keep"] == res.n_keep == sum(c.retained for c in res.candidates) >= 1
            assert set(r["probabilities"]) == {c.traj_id for c in res.candidates}
        if on_shift == "keep-all":
            assert rows[1]["n_keep"] == 5 and rows[4]["n_keep"] == 5 and "keep-all" in rows[1]["reason"]
        else:
            assert "no guarantee" in rows[1]["reason"]
