import numpy as np
import pytest

from latentsift.sift.margin import channel_scores_grouped, step_margins, step_weighted_mean_grouped, uniform_mean_grouped


def step_weighted_mean(margins, steps) -> float:
    """One candidate's Eq. 2 step-weighted mean (the grouped form with a single owner)."""
    return float(step_weighted_mean_grouped(margins, steps, np.zeros(len(margins), dtype=np.int64), 1)[0])


def uniform_mean(margins) -> float:
    return float(uniform_mean_grouped(margins, np.zeros(len(margins), dtype=np.int64), 1)[0])


def channel_score(d_pos, d_neg, steps, **kw) -> float:
    """q_c of one candidate (the grouped form with a single owner)."""
    return float(channel_scores_grouped(d_pos, d_neg, steps, np.zeros(len(d_pos), dtype=np.int64), 1, **kw)[0])


def test_margin_sign():
    np.testing.assert_allclose(step_margins([1.0, 3.0], [2.0, 1.0]), [1.0, -2.0])


def test_step_weighted_mean_matches_formula():
    m = np.array([5.0, 1.0, 2.0, 4.0])
    t = np.array([0, 1, 2, 3])
    assert step_weighted_mean(m, t) == pytest.approx((1 * 1 + 2 * 2 + 3 * 4) / 6)
    # steps skipped by the channel keep their true step index as weight
    assert step_weighted_mean([1.0, 3.0], [2, 6]) == pytest.approx((2 + 18) / 8)


def test_only_step_zero_falls_back_to_plain_mean_and_empty_is_missing():
    assert step_weighted_mean([4.0], [0]) == 4.0
    assert np.isnan(step_weighted_mean([], []))
    assert np.isnan(channel_score([], [], []))


def test_one_sided_and_uniform_variants():
    d_pos, d_neg, t = [1.0, 2.0], [4.0, 1.0], [1, 2]
    assert channel_score(d_pos, d_neg, t) == pytest.approx((1 * 3 + 2 * -1) / 3)
    assert channel_score(d_pos, d_neg, t, distance="pos") == pytest.approx((1 * -1 + 2 * -2) / 3)
    assert channel_score(d_pos, d_neg, t, distance="neg") == pytest.approx((1 * 4 + 2 * 1) / 3)
    assert channel_score(d_pos, d_neg, t, weighting="uniform") == pytest.approx(1.0)
    assert uniform_mean([3.0, -1.0]) == 1.0
    with pytest.raises(ValueError, match="distance"):
        channel_score(d_pos, d_neg, t, distance="both")


def test_grouped_equals_per_candidate():
    rng = np.random.default_rng(0)
    owner = rng.integers(0, 5, 40)
    owner[owner == 3] = 4  # owner 3 has no state: missing
    d_pos, d_neg = rng.random(40), rng.random(40)
    steps = rng.integers(0, 12, 40)
    g = channel_scores_grouped(d_pos, d_neg, steps, owner, 5)
    for k in range(5):
        sel = owner == k
        ref = channel_score(d_pos[sel], d_neg[sel], steps[sel])
        assert (np.isnan(ref) and np.isnan(g[k])) or g[k] == pytest.approx(ref)
    assert np.isnan(g[3])
