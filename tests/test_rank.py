import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from latentsift import normalized_ranks, grouped_normalized_ranks, min_channel_rank, fuse

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


def test_paper_example_ties():
    np.testing.assert_allclose(normalized_ranks([1, 1, 2, 2]), [1 / 6, 1 / 6, 5 / 6, 5 / 6])


def test_all_equal_is_half_and_single_is_zero():
    np.testing.assert_allclose(normalized_ranks([3.0, 3.0, 3.0]), [0.5, 0.5, 0.5])
    np.testing.assert_allclose(normalized_ranks([7.0]), [0.0])


def test_distinct_scores_span_zero_to_one():
    np.testing.assert_allclose(normalized_ranks([0.3, -2.0, 5.0]), [0.5, 0.0, 1.0])


def test_min_rank_example():
    r = np.array([[0.67], [1.00], [0.33]])
    np.testing.assert_allclose(min_channel_rank(r), [0.33])


def test_missing_ranks_lowest_and_ties_with_missing():
    r = normalized_ranks([np.nan, 2.0, np.nan, 1.0])
    # the two missing share ranks 0 and 1 -> 0.5/3; present ones rank above them
    np.testing.assert_allclose(r, [0.5 / 3, 1.0, 0.5 / 3, 2 / 3])


def test_bad_input():
    with pytest.raises(ValueError, match="scores"):
        normalized_ranks([[1, 2]])
    with pytest.raises(ValueError, match="non-finite"):
        normalized_ranks([1.0, np.inf])
    with pytest.raises(ValueError, match="weight"):
        fuse([0.1], [0.2], weight=2)


def test_grouped_ranks_never_pool_instances():
    s = [1, 2, 100, 200, 300]
    g = ["a", "a", "b", "b", "b"]
    np.testing.assert_allclose(grouped_normalized_ranks(s, g), [0, 1, 0, 0.5, 1])


def test_fusion_equal_weights():
    np.testing.assert_allclose(fuse([0.2, 1.0], [0.6, 0.0]), [0.4, 0.5])


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=20), st.randoms(use_true_random=False))
def test_ranks_order_invariant_and_bounded(scores, rnd):
    scores = np.array(scores)
    perm = np.arange(len(scores))
    rnd.shuffle(perm)
    r = normalized_ranks(scores)
    assert ((r >= 0) & (r <= 1)).all()
    np.testing.assert_allclose(normalized_ranks(scores[perm]), r[perm])
    # higher score never gets a lower rank
    order = np.argsort(scores, kind="stable")
    assert (np.diff(r[order]) >= -1e-12).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=30))
def test_average_ranks_equal_scipy(values):
    from scipy.stats import rankdata
    from latentsift.sift.rank import average_ranks
    x = np.array(values, dtype=float)
    np.testing.assert_allclose(average_ranks(x), rankdata(x, method="average") - 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 3).map(float), finite, st.just(-np.inf), st.just(np.inf)),
                min_size=1, max_size=40))
def test_pairwise_and_sorted_ranks_agree_bit_for_bit(values):
    from latentsift.sift.rank import _pairwise_ranks, _sorted_ranks, average_ranks
    x = np.array(values, dtype=float)
    assert _pairwise_ranks(x).tobytes() == _sorted_ranks(x).tobytes() == average_ranks(x).tobytes()
    with_nan = np.append(x, np.nan)  # NaN: the sorted path, whatever the length
    assert average_ranks(with_nan).tobytes() == _sorted_ranks(with_nan).tobytes()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.one_of(st.integers(-2, 2).map(float), st.just(float("nan")))),
                min_size=1, max_size=40))
def test_grouped_ranks_equal_per_group_ranks(rows):
    g = np.array([r[0] for r in rows])
    s = np.array([r[1] for r in rows])
    out = grouped_normalized_ranks(s, g)
    for k in np.unique(g):
        np.testing.assert_allclose(out[g == k], normalized_ranks(s[g == k]))
