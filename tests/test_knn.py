import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from latentsift import nearest_distances


def brute(q, b):
    q = q.astype(np.float64)
    b = b.astype(np.float64)
    d = np.sqrt(((q[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    return d.min(1), d.argmin(1)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 300), st.integers(1, 64), st.integers(1, 8), st.integers(1, 64),
       st.integers(0, 2**31 - 1))
@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_equals_brute_force(threads, nq, nb, d, block_q, block_b, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((nq, d)).astype(np.float32) * 3
    b = rng.standard_normal((nb, d)).astype(np.float32) * 3 + 0.5
    D, I = nearest_distances(q, b, block_q=block_q, block_b=block_b, return_index=True, threads=threads)
    ref, ref_i = brute(q, b)
    np.testing.assert_allclose(D, ref, rtol=1e-4, atol=1e-4)
    # tie-tolerant: the returned row is at the minimal distance
    np.testing.assert_allclose(np.sqrt(((q.astype(np.float64) - b[I]) ** 2).sum(1)), ref, rtol=1e-4, atol=1e-4)
    assert D.dtype == np.float32 and I.dtype == np.int64 and D.shape == (nq,)


def test_faiss_backend_matches_torch():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((50, 576)).astype(np.float32)
    b = rng.standard_normal((3000, 576)).astype(np.float32)
    D1, I1 = nearest_distances(q, b, return_index=True)
    D2, I2 = nearest_distances(q, b, backend="faiss", return_index=True)
    np.testing.assert_allclose(D1, D2, rtol=1e-4)
    np.testing.assert_array_equal(I1, I2)


def test_identical_point_is_zero_not_nan():
    b = np.random.default_rng(2).standard_normal((10, 32)).astype(np.float32) * 50
    D = nearest_distances(b[:3], b)
    assert np.isfinite(D).all() and (D >= 0).all() and (D < 1e-1).all()


def test_empty_queries_and_float64_mode():
    b = np.ones((4, 3), np.float32)
    assert nearest_distances(np.zeros((0, 3)), b).shape == (0,)
    D = nearest_distances(np.zeros((2, 3)), b, dtype="float64")
    np.testing.assert_allclose(D, np.sqrt(3))


@pytest.mark.parametrize("q,b,msg", [
    (np.ones((2, 3)), np.ones((0, 3)), "non-empty"),
    (np.ones((2, 4)), np.ones((5, 3)), "dimension mismatch"),
    (np.array([[1.0, np.nan, 0.0]]), np.ones((5, 3)), "NaN or inf"),
    (np.ones((2, 3)), np.full((5, 3), np.inf), "NaN or inf"),
    (np.ones(3), np.ones((5, 3)), "2-D"),
])
def test_bad_input_is_a_clear_value_error(q, b, msg):
    with pytest.raises(ValueError, match=msg):
        nearest_distances(q, b)


def test_precomputed_norms_give_the_same_answer_and_are_checked():
    from latentsift.bank.knn import bank_sqnorms
    rng = np.random.default_rng(3)
    q = rng.standard_normal((20, 16)).astype(np.float32)
    b = rng.standard_normal((300, 16)).astype(np.float32)
    D1, I1 = nearest_distances(q, b, return_index=True)
    D2, I2 = nearest_distances(q, b, return_index=True, sqnorms=bank_sqnorms(b), validate_bank=False)
    np.testing.assert_array_equal(I1, I2)
    np.testing.assert_allclose(D1, D2, rtol=1e-6)
    with pytest.raises(ValueError, match="sqnorms"):
        nearest_distances(q, b, sqnorms=np.ones(3))


@pytest.mark.parametrize("block_b", [16384, 700])
def test_exact_duplicates_go_to_the_first_row_wherever_they_lie(block_b):
    """Identical bank rows far apart (and in different bank blocks): the first one is returned, with
    distance 0 for a query equal to them, whatever rounding the CPU's GEMM gives each position."""
    rng = np.random.default_rng(3)
    b = rng.standard_normal((3000, 576)).astype(np.float32)
    b[2990] = b[2999] = b[5]
    b[1500] = b[7]
    q = np.concatenate([b[[2999, 7, 1500]], rng.standard_normal((200, 576)).astype(np.float32)])
    D, I = nearest_distances(q, b, return_index=True, block_b=block_b)
    assert I[:3].tolist() == [5, 7, 7] and np.all(D[:3] == 0)
    b64 = b.astype(np.float64)  # the exact distances, a query at a time (all at once: a 2.8 GB temporary, 10x slower)
    ref = np.array([np.sqrt(((x.astype(np.float64) - b64) ** 2).sum(-1)).min() for x in q[3:]])
    np.testing.assert_allclose(D[3:], ref, rtol=1e-5)


@pytest.mark.parametrize("cols", [4096, 4096 + 64 * 3, 300, 200])
def test_the_two_level_shortlist_finds_what_topk_finds(cols):
    import torch
    from latentsift.bank.knn import SHORTLIST_GROUP, smallest
    g = torch.Generator().manual_seed(cols)
    full = torch.randn(40, cols + 50, generator=g)
    v = full[:, :cols]  # a view with a wider row stride, as the product buffer's last bank block
    v[0, :] = 1.0  # one row of ties only
    v[1, 5::SHORTLIST_GROUP] = -9.0  # the smallest entries spread over groups
    v[2, 64:72] = -9.0  # ... or packed in one group
    for k in (1, 4):
        vals, idx = smallest(v, k)
        ref_vals, ref_idx = v.topk(k, dim=1, largest=False, sorted=False)
        assert torch.equal(vals.sort(1).values, ref_vals.sort(1).values)
        assert torch.equal(v.gather(1, idx), vals)  # the columns hold those values
        assert torch.equal(idx[3:].sort(1).values, ref_idx[3:].sort(1).values)  # no ties: the same columns


@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_through_the_two_level_shortlist_equal_brute_force(threads):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((70, 24)).astype(np.float32)
    b = rng.standard_normal((1500, 24)).astype(np.float32)
    b[1400] = q[3]  # an exact hit in the last, narrower block (plain topk)
    D, I = nearest_distances(q, b, block_q=32, block_b=512, return_index=True, threads=threads)
    ref, ref_i = brute(q, b)
    np.testing.assert_allclose(D, ref, rtol=1e-4, atol=1e-4)
    assert np.array_equal(I, ref_i) and I[3] == 1400 and D[3] == 0.0
