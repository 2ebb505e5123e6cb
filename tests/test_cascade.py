"""The four-stage cascade on hand-made pools whose answers are worked out by hand."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from latentsift import LatentSiftError
from latentsift.cascade.cascade import (CandidateRecord, pool_priority, run_cascade, saving, stage1_retain,
                                        total_tokens)
from latentsift.sift.retain import retain_count, select_retained
from latentsift.cascade.verifier import Verdict, VerifierFailure


def recs(labels, regression=None, gen=None, iid="i"):
    regression = regression or {}
    gen = gen or {}
    return {t: CandidateRecord(t, iid, lab, regression.get(t), gen.get(t)) for t, lab in labels.items()}


def ef(scores, n_in=100, n_out=1):
    """An EF result table: score None = a failed call."""
    return {t: (VerifierFailure(t, "timeout", attempts=4) if s is None else
                Verdict(t, s, s, 1 - s, n_in if isinstance(n_in, int) else n_in[t], n_out))
            for t, s in scores.items()}


IDS = ["a", "b", "c", "d", "e", "f"]


def test_stage1_keeps_the_top_max3_halfK_in_drawn_order():
    # K = 6 -> retain max(3, 3) = 3: the three highest scores (d, b, f), reported in drawn order.
    scores = dict(zip(IDS, [0.1, 0.9, 0.2, 1.5, 0.3, 0.8]))
    r = recs({t: 0 for t in IDS})
    out = run_cascade(IDS, scores, r, final_verifier=ef({t: 0.5 for t in IDS}))
    assert out.stage1 == ("b", "d", "f")
    # K <= 3 keeps everything.
    out = run_cascade(["a", "c"], scores, r, final_verifier=ef({t: 0.5 for t in IDS}))
    assert out.stage1 == ("a", "c")


def test_stage1_ties_at_the_cut_are_deterministic_and_order_free():
    scores = {t: 1.0 for t in IDS}  # everything tied: the (seed, traj_id) hash decides
    r = recs({t: 0 for t in IDS})
    v = ef({t: 0.5 for t in IDS})
    a = run_cascade(IDS, scores, r, final_verifier=v, seed=3).stage1
    b = run_cascade(IDS[::-1], scores, r, final_verifier=v, seed=3).stage1
    assert len(a) == 3 and set(a) == set(b)
    mask = select_retained(np.ones(6), IDS, seed=3)
    assert set(a) == {t for t, m in zip(IDS, mask) if m}


def test_pool_wide_order_gives_the_same_stage1_as_per_draw_selection():
    rng = np.random.default_rng(0)
    ids = [f"r{i}/x" for i in range(8)]
    for trial in range(20):
        scores = [None if rng.random() < 0.15 else float(rng.integers(0, 4)) for _ in ids]  # many ties
        prio = pool_priority(ids, scores, seed=trial)
        for k in (4, 5, 6, 8):
            for sub in itertools.combinations(range(8), k):
                drawn = [ids[i] for i in sub]
                direct = stage1_retain(drawn, [scores[i] for i in sub], seed=trial)
                keep = set(sorted(drawn, key=prio.__getitem__)[:retain_count(k)])
                assert direct == [t for t in drawn if t in keep]


def test_stage2_keeps_the_max_regression_count_and_never_invents_one():
    labels = {"a": 0, "b": 1, "c": 0}
    v = ef({"a": 0.9, "b": 0.1, "c": 0.5})
    none = None
    # All counts known: keep the max (b, c at 7), then the EF verifier picks c (0.5 > 0.1).
    r = recs(labels, regression={"a": 3, "b": 7, "c": 7})
    out = run_cascade(["a", "b", "c"], none, r, final_verifier=v)
    assert out.stage2 == ("b", "c") and out.stage2_rule == "applied" and out.final == ("c",) and out.value == 0
    # Some counts missing: skip-stage keeps all three; keep keeps the max and the unknown ones.
    r = recs(labels, regression={"a": 3, "b": 7})
    out = run_cascade(["a", "b", "c"], none, r, final_verifier=v, missing="skip-stage")
    assert out.stage2 == ("a", "b", "c") and out.stage2_rule == "skipped-missing" and out.final == ("a",)
    out = run_cascade(["a", "b", "c"], none, r, final_verifier=v, missing="keep")
    assert out.stage2 == ("b", "c") and out.stage2_rule == "kept-missing"
    # No counts at all: the stage is a no-op.
    out = run_cascade(["a", "b", "c"], none, recs(labels), final_verifier=v)
    assert out.stage2 == ("a", "b", "c") and out.stage2_rule == "none-known"


def test_stage3_is_skipped_and_not_charged_without_generated_tests():
    labels = {"a": 1, "b": 0, "c": 0}
    v = ef({"a": 0.2, "b": 0.9, "c": 0.1})
    out = run_cascade(["a", "b", "c"], None, recs(labels), final_verifier=v, testgen_tokens=5000)
    assert out.stage3_rule == "no-tests" and not out.stage3_reached and out.testgen_tokens == 0
    assert out.final == ("b",) and out.value == 0
    # With generated tests: reached, charged once, keeps the max (a), then a single candidate is left.
    r = recs(labels, gen={"a": 2.0, "b": 1.0, "c": 2.0})
    out = run_cascade(["a", "b", "c"], None, r, final_verifier=v, testgen_tokens=5000)
    assert out.stage3_reached and out.testgen_tokens == 5000 and out.stage3 == ("a", "c")
    assert out.final == ("a",) and out.value == 1 and out.ef_calls == ("a", "c") and out.ef_tokens == 202
    # Stage 2 leaves one candidate: Stage 3 is not reached, nothing charged, no EF call.
    r = recs(labels, regression={"a": 9, "b": 1, "c": 1}, gen={"a": 2.0, "b": 1.0, "c": 2.0})
    out = run_cascade(["a", "b", "c"], None, r, final_verifier=v, testgen_tokens=5000)
    assert out.stage2 == ("a",) and out.stage3_rule == "single" and out.testgen_tokens == 0
    assert out.ef_calls == () and out.ef_tokens == 0 and out.value == 1
    with pytest.raises(LatentSiftError, match="test-generation cost"):
        run_cascade(["a", "b", "c"], None, recs(labels, gen={"a": 1.0}), final_verifier=v)


def test_original_workflow_charges_all_K_and_reuses_stage1_scores():
    labels = {t: int(t == "e") for t in IDS}
    n_in = dict(zip(IDS, [100, 200, 300, 400, 500, 600]))
    stage1 = ef(dict(zip(IDS, [0.1, 0.2, 0.3, 0.4, 0.9, 0.5])), n_in=n_in)
    final = ef({t: 0.5 for t in IDS}, n_in=10_000)  # must not be used
    out = run_cascade(IDS, stage1, recs(labels), final_verifier=final)
    assert out.stage1 == ("d", "e", "f") and out.final == ("e",) and out.value == 1
    assert out.ef_calls == tuple(IDS) and out.ef_tokens == sum(n_in.values()) + 6


def test_token_free_workflow_charges_only_stage4_survivors():
    labels = {t: int(t == "b") for t in IDS}
    filt = dict(zip(IDS, [0.1, 0.9, 0.2, 1.5, 0.3, 0.8]))  # keeps b, d, f
    n_in = dict(zip(IDS, [100, 200, 300, 400, 500, 600]))
    final = ef(dict(zip(IDS, [0.99, 0.7, 0.1, 0.6, 0.99, 0.2])), n_in=n_in)
    r = recs(labels, regression={t: 5 for t in IDS} | {"f": 1})  # Stage 2 drops f
    out = run_cascade(IDS, filt, r, final_verifier=final)
    assert out.stage1 == ("b", "d", "f") and out.stage2 == ("b", "d")
    assert out.ef_calls == ("b", "d") and out.ef_tokens == 200 + 400 + 2
    assert out.final == ("b",) and out.value == 1


def test_ties_after_stage4_count_as_the_mean_label_or_a_seeded_random_pick():
    labels = {"a": 1, "b": 0, "c": 0, "d": 1}
    v = ef({"a": 0.8, "b": 0.8, "c": 0.8, "d": 0.1})
    out = run_cascade(["a", "b", "c"], None, recs(labels), final_verifier=v)
    assert out.final == ("a", "b", "c") and out.value == pytest.approx(1 / 3)
    picks = [run_cascade(["a", "b", "c"], None, recs(labels), final_verifier=v, tie="random",
                         draw_key=str(i)).value for i in range(300)]
    assert set(picks) <= {0.0, 1.0} and abs(np.mean(picks) - 1 / 3) < 0.1
    again = [run_cascade(["a", "b", "c"], None, recs(labels), final_verifier=v, tie="random",
                         draw_key=str(i)).value for i in range(300)]
    assert picks == again


def test_verifier_failures_are_never_scored_as_half():
    labels = {"a": 1, "b": 0, "c": 0}
    # a failed (it would win at 0.5 against b=0.2 and c=0.3 if failures were scored 0.5).
    v = ef({"a": None, "b": 0.2, "c": 0.3})
    out = run_cascade(["a", "b", "c"], None, recs(labels), final_verifier=v)
    assert out.final == ("c",) and out.value == 0 and out.stage4_rule == "some-failed"
    assert out.failures == ("a",)
    # All survivors failed: a documented tie over all of them.
    v = ef({"a": None, "b": None, "c": None})
    out = run_cascade(["a", "b", "c"], None, recs(labels), final_verifier=v)
    assert out.stage4_rule == "all-failed" and out.value == pytest.approx(1 / 3)
    # As a Stage-1 filter a failure ranks below every score.
    v = ef(dict(zip(IDS, [None, 0.1, 0.2, 0.3, 0.4, None])))
    out = run_cascade(IDS, v, recs({t: 0 for t in IDS}))
    assert out.stage1 == ("c", "d", "e")


def test_callable_filter_scores_each_draw():
    calls = []

    def score_draw(instance_id, traj_ids):
        calls.append((instance_id, traj_ids))
        return {t: float(i) for i, t in enumerate(traj_ids)}  # within-draw: last drawn is best

    r = recs({t: int(t == "f") for t in IDS})
    out = run_cascade(["c", "a", "f", "b"], score_draw, r, final_verifier=ef({t: 0.5 for t in IDS}))
    assert calls == [("i", ("c", "a", "f", "b"))]
    assert out.stage1 == ("a", "f", "b") and out.value == pytest.approx(1 / 3)


def test_bad_inputs_raise_clear_errors():
    r = recs({"a": 0, "b": 1})
    with pytest.raises(LatentSiftError, match="no score for candidate 'b'"):
        run_cascade(["a", "b"], {"a": 1.0}, r, final_verifier=ef({"a": 0.1, "b": 0.2}))
    with pytest.raises(LatentSiftError, match="final_verifier"):
        run_cascade(["a", "b"], {"a": 1.0, "b": 2.0}, r)
    with pytest.raises(LatentSiftError, match="no result for candidate"):
        run_cascade(["a", "b"], None, r, final_verifier=ef({"a": 0.1}))
    with pytest.raises(LatentSiftError, match="'tie' parameter"):
        run_cascade(["a", "b"], None, r, final_verifier=ef({"a": 0.1, "b": 0.2}), tie="first")


def test_paper_token_arithmetic():
    # Paper appendix A.4 (R2EGym-32B, K=16): 366.2K + 0.955 x 244.3K vs 76.0K + 0.937 x 244.3K.
    orig = total_tokens(366.2e3, 0.955, 244.3e3)
    ours = total_tokens(76.0e3, 0.937, 244.3e3)
    assert orig == pytest.approx(599.5e3, abs=100) and ours == pytest.approx(304.9e3, abs=100)
    assert round(100 * saving(orig, ours), 1) == 49.1
    assert round(100 * saving(366.2e3, 76.0e3), 1) == 79.2  # EF tokens only (paper: -79.2%)
