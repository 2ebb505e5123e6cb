"""Packed replay (``states.packing``): several trajectories per forward give each one the states of a
forward of its own (float32 within 1e-5 relative per span vector), whatever is packed beside it and in
whatever order, and the same bytes twice. Short renderings (at most 160 tokens each) keep it fast."""
from __future__ import annotations

import hashlib
import inspect

import numpy as np
import pytest

from latentsift._core.validation import LatentSiftError
from latentsift.states.channel import render
from latentsift.states.extract import check_settings, extract_many, extract_settings, pack_size
from latentsift.states.packing import (PACKED_ATTENTION, VARLEN, Varlen, can_pack, memory_pack_tokens,
                                       model_token_bytes, pack_plan, packed_attention, replay_packed, run_length,
                                       token_bytes)
from latentsift.states.states import has_hooks, replay_many

F32_TOL = 1e-5
MAX_TOKENS = 160
SPANS = {"max_span_tokens": 8, "max_prompt_tokens": 16}

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.model]


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def _close(packed, alone) -> None:
    """Same spans and tokens, and every (span, layer) vector within F32_TOL relative."""
    assert packed.traj_id == alone.traj_id and packed.n_tokens == alone.n_tokens
    assert packed.step.tolist() == alone.step.tolist() and packed.channel.tolist() == alone.channel.tolist()
    assert packed.layers.shape == alone.layers.shape and _rel(packed.layers, alone.layers).max() <= F32_TOL


@pytest.fixture(scope="module")
def policy32():
    from latentsift.states.model import load_policy
    return load_policy(dtype="float32")


@pytest.fixture(scope="module")
def trajs(data_dir):
    from latentsift.trajectories.importers import import_paths
    return import_paths(data_dir / "sweagent" / "cost_2_1.tar.gz").trajectories[:3]


@pytest.fixture(scope="module")
def renderings(policy32, trajs):
    return [render(t, policy32.tokenizer, **SPANS) for t in trajs]


@pytest.fixture(scope="module")
def alone(policy32, renderings):
    """One rendering per forward (the reference), before any packed forward of this module."""
    return replay_many(policy32, renderings, max_tokens=MAX_TOKENS)


def test_pack_plan_groups_in_order_within_the_budget():
    plan = list(pack_plan([5, 3, 4, 9, 1, 2], lambda n: n, 8))
    assert plan == [[5, 3], [4], [9], [1, 2]]
    assert [x for g in plan for x in g] == [5, 3, 4, 9, 1, 2]
    assert all(sum(g) <= 8 for g in plan if len(g) > 1)


def test_a_trajectory_longer_than_a_chunk_is_never_packed():
    from latentsift.states.channel import Rendering

    step = np.r_[np.full(10, -1), np.zeros(40)].astype(np.int32)   # 40 pooled tokens after 10 excluded
    r = Rendering("a", np.arange(60), np.r_[step, np.full(10, -1)].astype(np.int32), np.zeros(60, np.int8), 1)
    settings = {"max_tokens": None, "chunk_tokens": 60, "context": 100, "pack_tokens": 80}
    assert run_length(r) == 50 and run_length(r, 20) == 20
    assert pack_size([r], settings) == 50 and pack_size([r, r], settings) == 100
    assert pack_size([r], settings | {"chunk_tokens": 40}) == 81          # over the budget: alone, chunked
    assert pack_size([r], settings | {"chunk_tokens": 40, "max_tokens": 30}) == 30


def test_packed_equals_one_per_forward_and_the_neighbours_do_not_matter(policy32, renderings, alone):
    assert can_pack(policy32)
    packed = replay_packed(policy32, renderings, max_tokens=MAX_TOKENS)
    assert [s.traj_id for s in packed] == [r.traj_id for r in renderings]
    for p, a in zip(packed, alone):
        _close(p, a)
    # other order, other neighbours, alone in a pack: still within the tolerance of one per forward
    reordered = replay_packed(policy32, renderings[::-1], max_tokens=MAX_TOKENS)[::-1]
    pairs = replay_packed(policy32, [renderings[2], renderings[0]], max_tokens=MAX_TOKENS)
    single = replay_packed(policy32, renderings[1:2], max_tokens=MAX_TOKENS)
    for p, a in [*zip(reordered, alone), (pairs[0], alone[2]), (pairs[1], alone[0]), (single[0], alone[1])]:
        _close(p, a)
    assert not has_hooks(policy32)


def test_unpacked_forwards_are_unchanged_by_the_packed_attention(policy32, renderings):
    """After packing switched the model's attention, a forward without bounds is sdpa's, bit for bit (one
    rendering, in three chunks: the first without a cache, the others attending to it)."""
    replay_packed(policy32, renderings[:1], max_tokens=MAX_TOKENS)
    assert policy32.model.config._attn_implementation == PACKED_ATTENTION
    mine = replay_many(policy32, renderings[1:2], max_tokens=MAX_TOKENS, chunk_tokens=64)
    policy32.model.set_attn_implementation("sdpa")
    try:
        ref = replay_many(policy32, renderings[1:2], max_tokens=MAX_TOKENS, chunk_tokens=64)
    finally:
        policy32.model.set_attn_implementation(PACKED_ATTENTION)
    assert len(mine) == len(ref) == 1 and mine[0].n_tokens == MAX_TOKENS > 2 * 64
    assert np.array_equal(mine[0].layers, ref[0].layers)


def _digests(states) -> list[tuple[str, str]]:
    return [(s.traj_id, hashlib.sha256(s.layers.tobytes()).hexdigest()) for s, _, _ in states]


def test_extract_packs_short_trajectories_and_keeps_long_ones_alone(policy32, trajs, renderings, alone):
    lengths = [run_length(r, MAX_TOKENS) for r in renderings]
    budget = lengths[0] + lengths[1]          # the first two share a forward, the third fills its own
    settings = extract_settings(policy32, max_tokens=MAX_TOKENS, pack_tokens=budget, **SPANS)
    assert settings["pack_tokens"] == budget
    out = list(extract_many(policy32, trajs, settings, workers=2))
    assert [s.traj_id for s, _, _ in out] == [t.traj_id for t in trajs]
    for (s, truncated, windowed), a, r in zip(out, alone, renderings):
        _close(s, a)
        assert truncated == (r.n_tokens > MAX_TOKENS) and not windowed
    # too small a budget: every trajectory alone, replayed exactly as without packing
    tiny = extract_settings(policy32, max_tokens=MAX_TOKENS, pack_tokens=10, **SPANS)
    assert all(np.array_equal(s.layers, a.layers) for (s, _, _), a in zip(extract_many(policy32, trajs, tiny), alone))
    # the same input again (one worker instead of two): the same bytes
    assert _digests(extract_many(policy32, trajs, settings, workers=1)) == _digests(out)


def test_pack_tokens_is_checked_and_off_by_default_on_a_cpu(policy32):
    with pytest.raises(LatentSiftError, match="pack_tokens"):
        check_settings(pack_tokens=-1)
    assert extract_settings(policy32)["pack_tokens"] == 0
    # a pack longer than the context is kept: its renderings each have positions of their own
    assert extract_settings(policy32, pack_tokens=10**6)["pack_tokens"] == 10**6 > policy32.context_length
    assert extract_settings(policy32)["chunk_tokens"] == 2048                     # the CPU's default chunk
    assert extract_settings(policy32, chunk_tokens=64)["chunk_tokens"] == 64


def test_a_packed_rows_span_sums_off_a_cpu_are_those_of_a_cpu():
    """Off a CPU a packed row's tokens are grouped by span on the host (token order kept) and each layer is
    pooled by one float64 segment sum, rounded once: forced here on a CPU, the sums and counts of a row whose
    spans interleave and whose renderings include an empty one are the CPU's ordered index_add_."""
    import torch

    from latentsift.states.states import _SpanSums

    rng = np.random.default_rng(0)
    src = np.array([0, 1, 3, 5, 6, 7])        # three renderings: spans 0, 0, 1 | (none) | 2, 3, 2
    tgt = np.array([0, 0, 1, 2, 3, 2])
    hidden = torch.as_tensor(rng.standard_normal((1, 8, 4)), dtype=torch.float32)
    sums = []
    for ordered in (True, False):
        acc = _SpanSums(2, 4, 4, "cpu")
        acc.ordered = ordered
        acc.set_targets(src, tgt)
        for i in range(2):
            acc(i, hidden)
        sums.append((acc.sums.numpy().copy(), acc.counts.copy()))
    (a, ca), (b, cb) = sums
    assert ca.tolist() == cb.tolist() == [2, 1, 2, 1]
    np.testing.assert_allclose(a, b, rtol=1e-6)
    want = (hidden[0, 5].double() + hidden[0, 7].double()).float().numpy()
    np.testing.assert_array_equal(b[0, 2], want)


def test_a_store_resumes_at_another_pack_budget_and_the_option_is_checked(policy32, trajs, alone, tmp_path):
    from latentsift._jobs.extract import run_extract
    from latentsift.states.extract import extract_pools
    from latentsift.states.store import StateStore
    from latentsift.trajectories.trajectory import save_jsonl

    kw = dict(max_tokens=MAX_TOKENS, store_dtype="float32", **SPANS)
    extract_pools(policy32, trajs[:1], tmp_path / "s", pack_tokens=0, **kw)
    rep = extract_pools(policy32, trajs, tmp_path / "s", pack_tokens=4096, **kw)
    assert (rep.n_skipped, rep.n_extracted) == (1, 2)
    store = StateStore(tmp_path / "s")
    assert store.settings["pack_tokens"] == 0        # the manifest keeps the first run's settings
    stored = store.load()
    for a in alone:
        _close(stored[a.traj_id], a)
    save_jsonl(trajs[:1], tmp_path / "pools.jsonl")
    with pytest.raises(LatentSiftError, match="--pack-tokens"):
        run_extract(tmp_path / "pools.jsonl", tmp_path / "t", pack_tokens=-1)


def _fake_varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                      window_size=(-1, -1), num_splits=None):
    """torch.nn.attention.varlen.varlen_attn's contract on a CPU (no GQA keyword): causal by window_size."""
    import torch
    import torch.nn.functional as F

    assert window_size == (-1, 0) and key.shape[1] == query.shape[1] and cu_seq_q is cu_seq_k and num_splits == 1
    cuts = cu_seq_q.tolist()
    assert max_q == max_k == max(b - a for a, b in zip(cuts[:-1], cuts[1:]))
    return torch.cat([F.scaled_dot_product_attention(*(x[a:b].transpose(0, 1) for x in (query, key, value)),
                                                     is_causal=True, scale=scale).transpose(0, 1)
                      for a, b in zip(cuts[:-1], cuts[1:])])


def _fake_varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    assert is_causal
    return _fake_varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size=(-1, 0), num_splits=1)


def _failing_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
    raise RuntimeError("FlashAttention only supports head dimension at most 256")


@pytest.fixture
def attention_inputs():
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    module = LlamaAttention(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2), 0)
    module._latentsift_fallback = "sdpa"
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 20, 16, generator=g) for h in (4, 2, 2))
    return module, q, k, v, torch.tensor([0, 5, 12, 20], dtype=torch.int32)


def test_the_varlen_kernels_glue_matches_attention_per_sequence(attention_inputs):
    """The packed attention's GPU-only path (layout, GQA, causal flag of either varlen_attn signature, no
    split-KV), checked on a CPU against stand-ins keeping varlen_attn's contract: sdpa on each sequence."""
    import torch

    module, q, k, v, bounds = attention_inputs
    ref, _ = packed_attention(module, q, k, v, None, cu_seq_lens_q=bounds, max_length_q=8, scaling=module.scaling)
    assert ref.shape == (1, 20, 4, 16) and not VARLEN.takes(q)        # a CPU: the loop ran
    for fake in (_fake_varlen_2_11, _fake_varlen_2_10):
        varlen = Varlen()
        varlen.fn, varlen.params = fake, frozenset(inspect.signature(fake).parameters)
        torch.testing.assert_close(varlen(q, k, v, bounds, 8, module.scaling), ref, rtol=1e-5, atol=1e-6)


def test_a_refused_varlen_kernel_falls_back_to_the_loop_and_says_so(attention_inputs, monkeypatch, caplog):
    module, q, k, v, bounds = attention_inputs
    ref, _ = packed_attention(module, q, k, v, None, cu_seq_lens_q=bounds, max_length_q=8, scaling=module.scaling)
    monkeypatch.setattr(VARLEN, "fn", _failing_varlen)
    monkeypatch.setattr(VARLEN, "why", VARLEN.why)                      # restored after, as fn
    monkeypatch.setattr(VARLEN, "params", frozenset(inspect.signature(_failing_varlen).parameters))
    monkeypatch.setattr(Varlen, "takes", lambda self, query: self.enabled and self.fn is not None)
    got, _ = packed_attention(module, q, k, v, None, cu_seq_lens_q=bounds, max_length_q=8, scaling=module.scaling)
    assert VARLEN.fn is None and "head dimension" in VARLEN.why
    assert "attention per sequence from here on" in caplog.text
    assert (got == ref).all()


def test_the_gpus_default_pack_is_halved_until_its_transients_fit_the_memory_budget(policy32):
    """SmolLM2's and a 1.5B's shapes keep 65,536 tokens in bfloat16; a 7B's (d 3,584, kv 512, ff 18,944)
    is halved to 32,768, a 32B's to 16,384; never below 2,048 tokens."""
    smol, q15, q7, q32 = (token_bytes(576, 192, 1536, 2), token_bytes(1536, 256, 8960, 2),
                          token_bytes(3584, 512, 18944, 2), token_bytes(5120, 1024, 27648, 2))
    assert [memory_pack_tokens(65536, b) for b in (smol, q15, q7, q32)] == [65536, 65536, 32768, 16384]
    assert memory_pack_tokens(65536, 10**9) == 2048 and memory_pack_tokens(0, 10**9) == 0
    assert model_token_bytes(policy32) == token_bytes(576, 192, 1536, 4)   # the embedded model, float32
