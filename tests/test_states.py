"""States: hooked pooling, chunked prefill, sliding window, online capture.

Tolerances (relative L2 error per (span, layer) vector, ``_rel``):
- float32: hooked pooling = output_hidden_states pooling, chunked = single forward, online =
  replay, all to <= 1e-4 (measured ~1e-6);
- bfloat16 (the default): chunked vs single forward and hooked vs output_hidden_states agree to
  bf16 noise: median <= 2e-2 and max <= 0.15 (measured: median ~5e-3, max ~5e-2; bf16 itself
  differs from float32 by up to ~9e-2 on some vectors). Online vs replay in bf16 measured at
  median 5e-3, max 1e-2 (not run here: bf16 decoding is very slow on CPU).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from latentsift._core.validation import LatentSiftError
from latentsift.states.channel import Rendering, render
from latentsift.states.extract import extract_many, extract_settings
from latentsift.states.hardware import cpu_facts, usable_bf16_units
from latentsift.states.states import (StateRecorder, TrajectoryStates, add_span_sums, has_hooks, layer_hooks, replay,
                                      replay_many, window_plan)
from latentsift.trajectories.trajectory import CHANNEL_ID

F32_TOL = 1e-4
BF16_MEDIAN_TOL, BF16_MAX_TOL = 2e-2, 0.15


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def shared_trajs(data_dir):
    from latentsift.trajectories.importers import import_paths

    acr = import_paths(data_dir / "r2egym" / "acr-run-1.jsonl.gz").trajectories
    swe = import_paths(data_dir / "sweagent" / "cost_2_1.tar.gz").trajectories
    return {"acr": acr[:3], "swe": swe[:3]}


@pytest.fixture(scope="module")
def policy32():
    from latentsift.states.model import load_policy
    return load_policy(dtype="float32")


@pytest.fixture(scope="module")
def short_rendering(shared_trajs, policy):
    """A real shared trajectory rendered short (about 600 tokens)."""
    return render(shared_trajs["swe"][0], policy.tokenizer, max_span_tokens=16, max_prompt_tokens=32)


@pytest.fixture(scope="module")
def full32(policy32, short_rendering):
    """``short_rendering`` replayed in float32 at the defaults (one chunk, the whole context, every layer), made
    once: the reference that the hooked, windowed, cut and layer-subset replays below are compared with."""
    return replay(policy32, short_rendering)


def _hs_pool(policy, r: Rendering) -> np.ndarray:
    """Reference: mean pooling of output_hidden_states[1..L] of one full forward."""
    with torch.inference_mode():
        out = policy.base(input_ids=torch.as_tensor(r.input_ids)[None], output_hidden_states=True)
    hs = torch.stack(out.hidden_states[1:], 0)[:, 0].float().numpy()     # (L, n_tokens, d_model)
    idx, keys = r.span_index()
    return np.stack([hs[:, idx == j].mean(1) for j in range(len(keys))])


# ---------------------------------------------------------------------------------------------- pure
@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), context=st.integers(2, 700))
def test_window_plan_pools_every_token_once_with_half_context(n, context):
    plan = window_plan(n, context)
    pooled = np.zeros(n, dtype=int)
    for start, end, pool_from in plan:
        assert 0 <= start < end <= n and end - start <= context
        pooled[max(pool_from, start):end] += 1
        if start > 0:   # a later window pools only its second half: >= context // 2 tokens of left context
            assert pool_from - start == context - context // 2 >= context // 2
    assert (pooled == 1).all()
    assert plan[-1][1] == n


@given(n=st.integers(1, 400), spans=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_span_sums_off_a_cpu_are_each_spans_exact_sum_rounded_once(n, spans, seed):
    """The GPU's order-free pooling (each span's tokens summed in float64 in token order, forced here on a
    CPU) gives each span's float64 sum rounded once to float32, added to what the span held; the CPU's
    ordered index_add_ agrees with it to float32 rounding. Both leave the other spans alone."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, n, 8)).astype(np.float32)
    tgt = rng.integers(0, spans, n)
    held = rng.standard_normal((3, spans + 2, 8)).astype(np.float32)
    part = np.zeros(held.shape)     # each span's float64 sum
    np.add.at(part, (slice(None), tgt), x.astype(np.float64))
    want = held + part
    free, ordered = torch.tensor(held), torch.tensor(held)
    add_span_sums(free, 1, torch.as_tensor(tgt), torch.tensor(x), ordered=False)
    add_span_sums(ordered, 1, torch.as_tensor(tgt), torch.tensor(x))
    exact = (held + part.astype(np.float32)).astype(np.float32)    # the span's sum rounded, then added
    np.testing.assert_array_equal(free.numpy(), exact)
    np.testing.assert_allclose(ordered.numpy(), want, rtol=1e-5, atol=1e-4)
    untouched = np.setdiff1d(np.arange(spans + 2), tgt)
    np.testing.assert_array_equal(free.numpy()[:, untouched], held[:, untouched])


def test_exact_attention_is_one_setting_shared_by_threads_on_a_gpu_and_nothing_on_a_cpu(monkeypatch):
    """On CUDA our forwards run with FlashAttention or the math kernel only (the memory-efficient and cuDNN
    kernels gave other tokens from run to run on an H100: bench/cuda.py). The setting is process-wide, so
    blocks in several threads share one: made by the first to enter, undone by the last to leave."""
    import threading
    import torch.nn.attention as attention
    from latentsift._core.attention import exact_attention

    log = []

    class Recording:
        def __init__(self, backends):
            self.backends = backends

        def __enter__(self):
            log.append(("on", tuple(self.backends)))

        def __exit__(self, *exc):
            log.append(("off",))

    monkeypatch.setattr(attention, "sdpa_kernel", Recording)
    with exact_attention("cpu"):
        pass
    assert log == []
    inside, leave = threading.Barrier(3), threading.Event()

    def block():
        with exact_attention("cuda:0"):
            inside.wait()
            leave.wait()

    workers = [threading.Thread(target=block) for _ in range(2)]
    for w in workers:
        w.start()
    inside.wait()                    # both threads inside their blocks
    assert log == [("on", (attention.SDPBackend.FLASH_ATTENTION, attention.SDPBackend.MATH))]
    leave.set()
    for w in workers:
        w.join()
    assert log[1:] == [("off",)]     # undone once, by the last to leave
    with pytest.raises(RuntimeError), exact_attention("cuda"):
        raise RuntimeError("a failing forward")
    assert log[-2:] == [("on", log[0][1]), ("off",)]


def test_window_plan_short_sequence_is_one_window():
    assert window_plan(100, 8192) == [(0, 100, 0)]
    assert window_plan(10, 4) == [(0, 4, 0), (2, 6, 4), (4, 8, 6), (6, 10, 8)]


# ---------------------------------------------------------------------------------------------- model
@pytest.mark.model
def test_replay_shared_trajectories_shapes(policy, shared_trajs):
    L, d = policy.n_layers, policy.d_model
    for t in shared_trajs["acr"][:1] + shared_trajs["swe"][:1]:
        r = render(t, policy.tokenizer, max_span_tokens=24, max_prompt_tokens=48)
        s = replay(policy, r)
        keys = r.span_keys()
        assert isinstance(s, TrajectoryStates) and s.traj_id == t.traj_id
        assert s.layers.shape == (len(keys), L, d) and s.layers.dtype == np.float32
        assert np.isfinite(s.layers).all()
        assert [(int(a), int(b)) for a, b in zip(s.step, s.channel)] == keys
        assert s.n_tokens == r.n_tokens
        # one distance state per non-empty (step, channel) span, L layers per cot/fn span
        assert s.distance_states().shape == (len(keys), d)
        n_model = sum(c != CHANNEL_ID["obs"] for _, c in keys)
        assert s.scorer_states().shape == (n_model, L, d) and n_model > 0
        # each channel that the trajectory has got states
        for c in ("cot", "obs", "fn"):
            has = any(getattr(step, c) for step in t.steps)
            assert has == bool((s.channel == CHANNEL_ID[c]).any()), c
        assert not has_hooks(policy)


@pytest.mark.model
def test_hooked_pooling_equals_output_hidden_states(policy32, short_rendering, full32):
    s = full32
    ref = _hs_pool(policy32, short_rendering)
    assert _rel(s.layers, ref).max() <= F32_TOL


@pytest.mark.model
def test_hooked_pooling_bf16_close_to_output_hidden_states(policy, short_rendering):
    err = _rel(replay(policy, short_rendering).layers, _hs_pool(policy, short_rendering))
    assert np.median(err) <= BF16_MEDIAN_TOL and err.max() <= BF16_MAX_TOL


@pytest.mark.model
def test_chunked_prefill_equals_single_forward(policy32, policy, short_rendering):
    n = short_rendering.n_tokens
    assert n > 300
    for p, check in ((policy32, lambda e: e.max() <= F32_TOL),
                     (policy, lambda e: np.median(e) <= BF16_MEDIAN_TOL and e.max() <= BF16_MAX_TOL)):
        single = replay(p, short_rendering, chunk_tokens=n)
        chunked = replay(p, short_rendering, chunk_tokens=97)
        assert check(_rel(chunked.layers, single.layers))


@pytest.mark.model
def test_sliding_window_beyond_context(policy32, short_rendering, full32):
    r, ctx = short_rendering, 128
    seen = []
    hook = policy32.base.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["past_key_values"].get_seq_length() + kw["input_ids"].shape[1]),
        with_kwargs=True)
    try:
        win = replay(policy32, r, context=ctx, chunk_tokens=50)
    finally:
        hook.remove()
    full = full32
    assert max(seen) <= ctx                        # the model never sees more than its context
    assert win.layers.shape == full.layers.shape and np.isfinite(win.layers).all()
    idx, keys = r.span_index()
    last_pos = np.array([np.flatnonzero(idx == j).max() for j in range(len(keys))])
    inside = last_pos < ctx                         # spans inside the first window are unchanged
    assert inside.any() and (~inside).any()
    assert _rel(win.layers[inside], full.layers[inside]).max() <= F32_TOL
    assert _rel(win.layers[~inside], full.layers[~inside]).max() > 1e-3   # what the window loses


@pytest.mark.model
def test_max_tokens_keeps_prefix_spans(policy32, short_rendering, full32):
    r = short_rendering
    cut = r.n_tokens // 2
    part, full = replay(policy32, r, max_tokens=cut), full32
    idx, keys = r.span_index()
    kept = sorted(set(idx[:cut][idx[:cut] >= 0].tolist()))
    assert part.n_tokens == cut and part.n_spans == len(kept) < full.n_spans
    whole = [j for j in kept if np.flatnonzero(idx == j).max() < cut]
    pos = [kept.index(j) for j in whole]
    assert _rel(part.layers[pos], full.layers[whole]).max() <= F32_TOL


@pytest.mark.model
def test_layer_subset(policy32, short_rendering, full32):
    sub = replay(policy32, short_rendering, layer_ids=[1, 15, 30])
    full = full32
    assert sub.layer_ids == (1, 15, 30) and sub.n_layers == 3
    np.testing.assert_allclose(sub.layers, full.layers[:, [0, 14, 29]], rtol=1e-5, atol=1e-5)
    with pytest.raises(LatentSiftError, match="layer_ids"):
        replay(policy32, short_rendering, layer_ids=[0, 3])


def test_hooks_removed_on_error(policy):
    with pytest.raises(RuntimeError):
        with layer_hooks(policy, lambda i, h: None):
            assert has_hooks(policy)
            raise RuntimeError("boom")
    assert not has_hooks(policy)


# ---------------------------------------------------------------------------------------------- online
def _enc(policy, text: str) -> list[int]:
    return policy.tokenizer(text, add_special_tokens=False)["input_ids"]


def _agent_loop(policy, reuse_cache: bool) -> StateRecorder:
    """A 3-step conversation generated greedily with the recorder on.

    Each assistant turn: its first half is labelled cot, the rest fn (the split an agent makes
    after parsing), the closing <|im_end|> excluded; observations come back as user turns.
    """
    from transformers import DynamicCache

    tok = policy.tokenizer
    observations = ["README.md setup.py src/", "def add(a, b):\n    return a - b", "2 passed, 0 failed"]
    cache = DynamicCache(config=policy.model.config) if reuse_cache else None
    rec = StateRecorder(policy, "online-test")
    ids: list[int] = []

    def feed(text: str, step: int, channel) -> None:
        t = _enc(policy, text)
        rec.label(len(t), step, channel)
        ids.extend(t)

    with rec:
        feed("<|im_start|>system\nYou are a coding agent. Call tools as <function=bash>cmd</function>."
             "<|im_end|>\n<|im_start|>user\nFix add() in math.py.<|im_end|>\n<|im_start|>assistant\n", -1, -1)
        for t, obs in enumerate(observations):
            kw = {"past_key_values": cache} if reuse_cache else {}
            with torch.inference_mode():
                out = policy.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                            dtype=torch.long), max_new_tokens=20, do_sample=False, **kw)
            new = out[0, len(ids):].tolist()
            ch = [CHANNEL_ID["cot"]] * (len(new) // 2) + [CHANNEL_ID["fn"]] * (len(new) - len(new) // 2)
            if new[-1] == tok.eos_token_id:
                ch[-1] = -1
            rec.label_tokens([t] * len(new), ch)
            ids.extend(new)
            feed("<|im_end|>\n<|im_start|>user\n" if new[-1] != tok.eos_token_id else "\n<|im_start|>user\n", -1, -1)
            feed(obs, t, "obs")
            feed("<|im_end|>\n<|im_start|>assistant\n", -1, -1)
        assert has_hooks(policy)
        with torch.inference_mode():   # the last observation is prefilled as the next turn would be
            if reuse_cache:
                policy.base(input_ids=torch.tensor([ids[cache.get_seq_length():]]), past_key_values=cache)
            else:
                policy.base(input_ids=torch.tensor([ids]))
    assert not has_hooks(policy)
    assert rec.n_seen == rec.n_labelled == len(ids)
    return rec


@pytest.mark.model
@pytest.mark.parametrize("reuse_cache", [True, False], ids=["cache-reuse", "re-prefill"])
def test_online_capture_agrees_with_replay(policy32, reuse_cache):
    """Generated with the recorder on (decode steps), then replayed (prefill): same states.

    Without cache reuse, generate re-prefills the whole conversation each turn: the recorder
    skips the tokens it has already seen. float32 because bf16 single-token decoding is ~30x
    slower than float32 on CPUs without native bf16 matmul (measured: 7.6 ms vs 0.26 ms per
    576x1536 GEMV); bf16 online vs replay was measured separately at median 5e-3, max 1e-2."""
    rec = _agent_loop(policy32, reuse_cache=reuse_cache)
    online = rec.states()
    r = rec.rendering()
    assert r.n_steps == 3
    replayed = replay(policy32, r)
    assert online.layers.shape == replayed.layers.shape == (9, policy32.n_layers, policy32.d_model)
    np.testing.assert_array_equal(online.step, replayed.step)
    np.testing.assert_array_equal(online.channel, replayed.channel)
    assert _rel(online.layers, replayed.layers).max() <= F32_TOL


@pytest.mark.model
def test_recorder_rejects_incomplete_labels_and_batches(policy):
    rec = StateRecorder(policy)
    with rec, torch.inference_mode():
        policy.base(input_ids=torch.tensor([[1, 2, 3, 4]]))
        with pytest.raises(LatentSiftError, match="batch"):
            policy.base(input_ids=torch.tensor([[5, 6], [7, 8]]))
    assert not has_hooks(policy)
    with pytest.raises(LatentSiftError, match="not labelled"):
        rec.states()
    rec.label(4, 0, "cot")
    assert rec.states().n_spans == 1
    rec.label(2, 0, "fn")          # labelled but never run through the model
    with pytest.raises(LatentSiftError, match="never run"):
        rec.states()


def test_recorder_sees_only_its_own_threads_forwards(policy, short_rendering):
    """A replay in another thread while a recorder is open goes to neither the recorder nor is
    changed by it (layer hooks and the recorder's pre-hook are per thread)."""
    import threading
    alone = replay(policy, short_rendering)
    got = []
    rec = StateRecorder(policy)
    with rec:
        worker = threading.Thread(target=lambda: got.append(replay(policy, short_rendering)))
        worker.start()
        worker.join()
        with torch.inference_mode():
            policy.base(input_ids=torch.tensor([[1, 2, 3]]))
    assert rec.n_seen == 3 and np.array_equal(got[0].layers, alone.layers) and not has_hooks(policy)


def test_replay_many_keeps_order(policy, shared_trajs):
    rs = [render(t, policy.tokenizer, max_span_tokens=4, max_prompt_tokens=8) for t in shared_trajs["acr"][:2]]
    out = replay_many(policy, rs)
    assert [s.traj_id for s in out] == [r.traj_id for r in rs]


@pytest.mark.model
def test_per_step_replay_merges_disjoint_spans(policy32):
    """render_per_step (templates that drop earlier <think>): every span once, in trajectory order;
    step 0's cot/fn see the same prefix as in the one-sequence rendering."""
    from latentsift.states.channel import render_per_step
    from latentsift.states.states import merge_states

    from latentsift.trajectories.trajectory import Step, Trajectory

    call = "<function=bash>\n<parameter=command>{}</parameter>\n</function>"
    t = Trajectory(traj_id="hand/1", instance_id="i", repo="r", task_prompt="Fix add() in math.py.", steps=[
        Step(cot="Let me list the files.", fn=call.format("ls"), obs="math.py setup.py"),
        Step(cot="Open math.py.", fn=call.format("cat math.py"), obs="def add(a, b):\n    return a - b"),
        Step(cot="Fix the sign.", fn="<function=submit>\n</function>")])
    full = replay(policy32, render(t, policy32.tokenizer))
    rs = render_per_step(t, policy32.tokenizer)
    assert len(rs) == 3
    merged = merge_states(replay_many(policy32, rs))
    assert merged.n_spans == 8
    assert merged.traj_id == t.traj_id
    np.testing.assert_array_equal(merged.step, full.step)
    np.testing.assert_array_equal(merged.channel, full.channel)
    first = full.step == 0
    first &= full.channel != CHANNEL_ID["obs"]
    assert first.any() and _rel(merged.layers[first], full.layers[first]).max() <= F32_TOL
    with pytest.raises(LatentSiftError, match="two renderings"):
        merge_states([full, full])


def test_a_converted_gguf_copy_loads_the_same_model(policy, tmp_path, monkeypatch):
    """The converted-model cache (a session folder here, conftest): the copy gives the same
    fingerprint, weights, tokenizer, template and forward pass as the GGUF file itself."""
    from pathlib import Path

    from latentsift.states import model as M
    copy = M.load_policy(cache=False)  # the session's first load (the policy fixture) wrote the copy
    # a copy that cannot be read back (here: a broken config) is passed over for the GGUF file, untouched
    broken = tmp_path / "cache" / "converted" / Path(copy.loaded_from).name
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{not json")
    (broken / M.CONVERTED_MARKER).write_text("{}")
    monkeypatch.setenv(M.CACHE_ENV, str(tmp_path / "cache"))
    gguf = M.load_policy(cache=False)
    monkeypatch.undo()
    assert gguf.loaded_from == gguf.path and sorted(p.name for p in broken.iterdir()) == [
        "config.json", M.CONVERTED_MARKER]
    assert Path(copy.loaded_from).parent == M.converted_cache_root()
    assert (Path(copy.loaded_from) / M.CONVERTED_MARKER).is_file() and copy.path == gguf.path
    assert copy.fingerprint == gguf.fingerprint and copy.context_length == gguf.context_length
    a, b = gguf.model.state_dict(), copy.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    chat = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "def f():\n    return 1  # ok?"}]
    text = gguf.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert copy.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == text
    ids = gguf.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert copy.tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    with torch.inference_mode():
        x = torch.tensor([ids])
        assert torch.equal(gguf.base(input_ids=x).last_hidden_state, copy.base(input_ids=x).last_hidden_state)
    # a cache that cannot be written is skipped; "off" turns it off
    (tmp_path / "file").write_text("not a folder")
    M._save_converted(copy.model, copy.tokenizer, tmp_path / "file" / "copy", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "file"]
    monkeypatch.setenv(M.CACHE_ENV, "off")
    assert M.converted_cache_root() is None


# ------------------------------------------------------------------------- same input, same bytes
#: The default run's span settings on the first 256 tokens of the first acr-run-1 trajectories, among
#: them astropy__astropy-14182, the one whose bf16 states once differed between two extractions.
SAME_BYTES = {"max_span_tokens": 16, "max_prompt_tokens": 128, "max_tokens": 256}
FRESH = textwrap.dedent("""
    import hashlib, json, sys
    from latentsift.states.extract import extract_many, extract_settings
    from latentsift.states.model import load_policy
    from latentsift.trajectories.trajectory import load_jsonl
    pools, settings = sys.argv[1], json.loads(sys.argv[2])
    out = {}
    for dtype in sys.argv[3:]:
        policy = load_policy(dtype=dtype)
        done = extract_many(policy, load_jsonl(pools), extract_settings(policy, **settings))
        out[dtype] = {s.traj_id: hashlib.sha256(s.layers.tobytes()).hexdigest() for s, _, _ in done}
    print(json.dumps(out))
""")
_NATIVE_BF16 = usable_bf16_units(cpu_facts())[0]
_SAME_BYTES_DTYPES = ["float32"] + (["bfloat16"] if _NATIVE_BF16 else [])


def _state_bytes(policy, trajs) -> dict[str, str]:
    settings = extract_settings(policy, **SAME_BYTES)
    return {s.traj_id: hashlib.sha256(s.layers.tobytes()).hexdigest()
            for s, _, _ in extract_many(policy, trajs, settings)}


@pytest.fixture(scope="module")
def two_fresh_processes(policy, policy32, shared_trajs, tmp_path_factory):
    """The sha256 of each trajectory's float32 span means (before the store's float16 rounding) in
    two fresh processes at once, per dtype the CPU runs natively (the models converted beforehand)."""
    from latentsift.trajectories.trajectory import save_jsonl

    pools = tmp_path_factory.mktemp("same-bytes") / "pools.jsonl"
    save_jsonl(shared_trajs["acr"], pools)
    run = [sys.executable, "-c", FRESH, str(pools), json.dumps(SAME_BYTES), *_SAME_BYTES_DTYPES]
    children = [subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for c in children:
        stdout, stderr = c.communicate(timeout=600)
        assert c.returncode == 0, stderr[-2000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


@pytest.mark.model
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not _NATIVE_BF16, reason="this CPU has no usable AVX512-BF16 or AMX: bfloat16 would run on emulated "
                             "kernels, which dtype 'auto' never picks here"))])
def test_the_same_trajectories_give_the_same_bytes_in_fresh_processes_and_after_other_work(
        dtype, two_fresh_processes, policy, policy32, shared_trajs):
    """Two fresh processes and this one after other work with the same model (other trajectories,
    other settings, a chunked replay) give the same bytes. (A load from the converted-model copy
    against the GGUF file itself: same weights and forward bits, test_a_converted_gguf_copy_...)"""
    from latentsift.states.model import load_policy

    here = {"float32": policy32, "bfloat16": policy}[dtype]
    here = here if here.fingerprint.dtype == dtype else load_policy(dtype=dtype)
    list(extract_many(here, shared_trajs["swe"][:2], extract_settings(here, max_span_tokens=8, max_tokens=300)))
    replay(here, render(shared_trajs["swe"][2], here.tokenizer, max_span_tokens=8, max_prompt_tokens=32),
           chunk_tokens=64, max_tokens=300)
    mine = _state_bytes(here, shared_trajs["acr"])
    first, second = (out[dtype] for out in two_fresh_processes)
    assert list(mine) == [t.traj_id for t in shared_trajs["acr"]]
    assert first == second == mine
