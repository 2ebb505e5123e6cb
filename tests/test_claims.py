"""The recall-matched comparison of claim (c) of the probe study's rules (docs/studies/probe.md): a length
rule's calls read off its recall-against-calls curve at the probe's realized recall, on constructed curves."""
from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from latentsift.protocol.claims import recall_matched_calls

# A rule's out-of-fold curve: keeping none, four thresholds, keeping all 16 (recall, mean calls per pool).
RECALLS = np.array([0.0, 0.80, 0.88, 0.93, 0.97, 1.0])
CALLS = np.array([0.0, 4.0, 6.0, 8.0, 11.0, 16.0])


def test_a_target_between_two_points_mixes_them_linearly():
    m = recall_matched_calls(RECALLS, CALLS, 0.915)   # between 0.88 (6 calls) and 0.93 (8 calls)
    assert (m.lo, m.hi) == (2, 3)
    assert m.weight == pytest.approx(0.7)              # (0.915 - 0.88) / (0.93 - 0.88)
    assert m.mean_calls == pytest.approx(0.3 * 6.0 + 0.7 * 8.0)   # 7.4, not the 8 of the point reaching 0.915
    # the mixture realizes the target in expectation
    assert (1 - m.weight) * RECALLS[m.lo] + m.weight * RECALLS[m.hi] == pytest.approx(0.915)


def test_an_overshooting_rule_is_not_charged_for_its_overshoot():
    """The confirmation's (d) charged the cheapest rule reaching R its full calls at its own (higher) recall:
    at R = 0.9 a rule at 0.93 with 8 calls; matched to a probe that realized 0.90, it costs less."""
    m = recall_matched_calls(RECALLS, CALLS, 0.90)
    assert m.mean_calls == pytest.approx(6.0 + (0.90 - 0.88) / (0.93 - 0.88) * 2.0)   # 6.8 < 8
    assert m.mean_calls < CALLS[3]


def test_a_point_at_the_target_is_read_as_it_is():
    m = recall_matched_calls(RECALLS, CALLS, 0.93)
    assert (m.lo, m.hi, m.weight, m.mean_calls) == (3, 3, 0.0, 8.0)
    assert recall_matched_calls(RECALLS, CALLS, 1.0).mean_calls == 16.0
    assert recall_matched_calls(RECALLS, CALLS, 0.0).mean_calls == 0.0


def test_per_pool_calls_are_mixed_pool_by_pool():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 2, size=(len(RECALLS), 40))
    per_pool = CALLS[:, None] + noise - noise.mean(axis=1, keepdims=True)   # the curve's means, pool by pool
    m = recall_matched_calls(RECALLS, per_pool, 0.95)        # between 0.93 and 0.97: w = 0.5
    assert (m.lo, m.hi) == (3, 4) and m.weight == pytest.approx(0.5)
    np.testing.assert_allclose(m.calls, 0.5 * per_pool[3] + 0.5 * per_pool[4])
    assert m.calls.shape == (40,)


def test_a_dominated_point_is_skipped_in_the_rules_favour():
    """A threshold that keeps more for less recall is not the rule's curve: its neighbours bracket instead."""
    r = np.array([0.0, 0.85, 0.89, 0.95, 1.0])
    c = np.array([0.0, 5.0, 9.0, 7.0, 16.0])   # 0.89 at 9 calls: dominated by 0.95 at 7
    m = recall_matched_calls(r, c, 0.90)
    assert (m.lo, m.hi) == (1, 3)
    assert m.mean_calls == pytest.approx(5.0 + (0.90 - 0.85) / (0.95 - 0.85) * 2.0)   # 6.0, not 9.x


def test_refusals():
    with pytest.raises(ValueError, match="'target'"):
        recall_matched_calls([0.5, 0.9], [3.0, 7.0], 0.95)   # the curve must reach the target
    with pytest.raises(ValueError, match="'calls'"):
        recall_matched_calls([0.0, 1.0], [1.0, 2.0, 3.0], 0.5)
    with pytest.raises(ValueError, match="finite"):
        recall_matched_calls([0.0, np.nan, 1.0], [0.0, 1.0, 2.0], 0.5)


def test_the_power_calculation_of_the_rules():
    """The probe study's power table (docs/studies/probe.md) from the confirmation's own interval."""
    from latentsift.protocol.power import (bonferroni_level, decision_power, scaled_se, se_from_interval,
                                           study_power)

    level = bonferroni_level(32)
    se = se_from_interval(0.079, 0.203, level)
    assert level == pytest.approx(0.9984375) and se == pytest.approx(0.0196, abs=5e-5)
    # the interval's half-width is z se: an effect of exactly z se is decided half the time
    z = NormalDist().inv_cdf((1 + level) / 2)
    assert decision_power(z * se, se, level) == pytest.approx(0.5, abs=1e-6)
    assert decision_power(0.0, se, level) == pytest.approx(1 - level)   # at no effect: the level's error rate
    assert scaled_se(se, 2624, 1312) == pytest.approx(se * 2 ** 0.5)
    rows = {(r["effect_of"], r["k"]): r for r in study_power()}
    assert all(r["m"] == 14 and r["level"] == pytest.approx(1 - 0.05 / 14) for r in rows.values())
    probe16, probe8 = rows["probe minus shortest-in-characters", 16], rows["probe minus shortest-in-characters", 8]
    assert probe16["power"] > 0.999 and 0.98 < probe8["power"] < 0.99      # both >= 90%: K = 8 is allowed
    assert probe8["effect_90"] == pytest.approx(0.116, abs=1e-3)
    assert rows["probe own minus proxy", 8]["power"] < 0.9                  # said in the rules, not hidden
