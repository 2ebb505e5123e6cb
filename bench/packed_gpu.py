"""Packed replay against its bound on one device, for the embedded encoder's and a 1.5B policy's shapes.

    PYTHONPATH=src python3 bench/packed_gpu.py --out "$OUT/packed_gpu.json"                # a GPU machine
    PYTHONPATH=src python3 bench/packed_gpu.py --device cpu --tiny --out /tmp/packed.json   # the CPU smoke

It needs torch, transformers and numpy beside latentsift's source, nothing else: no weights, no tokenizer,
no installed package, no network. Each model is built from an inline config of the real shape with random
weights (the rate does not depend on the weights), bfloat16 on CUDA, float32 on a CPU: SmolLM2-135M-Instruct
(``LlamaForCausalLM``, the embedded encoder) and Qwen2.5-1.5B (``Qwen2ForCausalLM``); ``--tiny`` shrinks both
to 2 layers of width 64 for the CPU smoke. The library runs on a ``Policy`` of the random model with no
tokenizer: replay reads only the model, its fingerprint and its device. latentsift's modules import pydantic
(manifest schemas) and threadpoolctl (numpy's BLAS threads) at their top; where those are missing, inert
stand-ins take their names (this script reads and writes no manifest and sets no BLAS thread count) and
the output lists them.

The sequences, the same for every mode of a shape: one synthetic rendering per trajectory of the committed
dataset (``--lengths``, default data/own-policy/qwen2.5-coder-0.5b/trajectories.jsonl.gz), in file order up
to ``--budget-tokens``: the system text (70 tokens) and task prompt excluded, then each step's cot, fn and obs
as spans of len(text) / 3.5 tokens (the ratio measured with SmolLM2's tokenizer on 200 of these trajectories),
5 excluded template tokens after each message, token ids drawn uniformly from the vocabulary (seed 0): 791
tokens on average, median 725, 2.9 spans (SmolLM2's renderings of the 200: 751, 668 and 2.7). ``--lengths lognormal``: lengths from a seeded lognormal (median 670)
instead. Besides, ``--long-n`` trajectories of ``--long-tokens`` tokens (a SWE-bench trajectory's ~30k), the
dataset's steps tiled.

Modes, timed side by side: warm-up passes first, then ``--rounds`` rounds, each running every mode once
over all the sequences (the order rotated from round to round), ``torch.cuda.synchronize`` around each:

- ``bound@B``: the bare decoder stack (the base model: no LM head, no sequence x vocabulary logits), no hooks,
  every hidden state returned (``output_hidden_states=True``), the sequences packed by the library's own plan
  into rows of at most B tokens, each attending to itself only by the library's packed attention: on CUDA in
  16 bits one FlashAttention varlen call per layer (``torch.nn.attention.varlen.varlen_attn``), elsewhere (or
  where it fails) one ``sdpa`` call per sequence;
- ``bound-loop@B``: ``bound@B`` with one ``sdpa`` call per sequence and layer on every device (the library's
  fallback): what the varlen kernel buys;
- ``rows@B``: the issue's bound, rows of 2,048 tokens of the same token stream, B / 2,048 rows per forward,
  each row causal over its whole length (across sequence bounds: more attention work than ``bound@B``);
- ``bare-single``: the bare stack on one sequence per forward, hidden states returned (the issue's first column);
- ``single``: the library's old path, one sequence per forward with span pooling (``replay_many``, as
  ``latentsift extract --pack-tokens 0`` runs it);
- ``packed@B``: the library's packed path as ``latentsift extract --pack-tokens B`` runs it on one device:
  ``extract_settings``, ``pack_plan`` with ``pack_size``, ``extract_pack`` per pack (``replay_packed``: the
  packed attention of ``enable_packing``, the pooling of ``_SpanSums``, the states brought to the host); B as
  the settings record it;
- ``long``: the library's path for a trajectory longer than a chunk (``extract_pack`` of a pack of one:
  ``replay_many`` in the device's default chunks, a KV cache past the first, the sliding window past the context), tokens counted
  as the trajectory's, not the windows'; ``long@C`` (``--long-chunks``): the same in chunks of C tokens (capped by
  the window: a window in one chunk is one forward without a KV cache or mask).

A mode whose estimated memory exceeds 85% of the free GPU memory is skipped, and so is one that runs out of
memory, the reason printed. Rounds stop early at ``--seconds`` (shared between the shapes). Printed and written
to ``--out`` (JSON): tokens/s per mode (median over rounds, each round's seconds), the library's packed rate
over the bound of the same B, the packed states against the one-per-forward states (``|a - b| / |b|`` per span
and layer: float32 within 1e-5 on a CPU, bf16's rounding on a GPU), whether each library mode gave the same
bytes in every round, and the replay time of a team's 16 samples x 500 SWE-bench tasks x 30k tokens (240 M
tokens), computed from the measured rates (nothing of it is run).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import platform
import statistics
import sys
import time
import traceback
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "own-policy" / "qwen2.5-coder-0.5b" / "trajectories.jsonl.gz"
CHARS_PER_TOKEN = 3.5    # pooled characters per SmolLM2 token on DATA (render of 200 trajectories)
SYSTEM_TOKENS = 70       # excluded tokens before the task prompt (system text and template)
TEMPLATE_TOKENS = 5      # excluded tokens after each message
ROW = 2048               # a row of rows@B, the 8 x 2,048 and 32 x 2,048
TEAM_TOKENS = 16 * 500 * 30_000   # a team's 16 samples x 500 SWE-bench tasks x ~30k tokens
MEMORY_SHARE = 0.85      # of the free GPU memory a mode may be estimated to take
F32_TOL = 1e-5

#: the real shapes (config.json of HuggingFaceTB/SmolLM2-135M-Instruct and Qwen/Qwen2.5-1.5B)
SHAPES = {
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
        vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0,
        rms_norm_eps=1e-5)),
    "qwen1.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
        vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=1000000.0,
        rms_norm_eps=1e-6, use_sliding_window=False)),
}
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=512)


def _stand_ins() -> list[str]:
    """Inert modules under the names latentsift imports at its top but this script never uses, where missing."""
    made = []
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        mod = types.ModuleType("threadpoolctl")

        @contextmanager
        def threadpool_limits(*args, **kwargs):
            yield
        mod.threadpool_limits = threadpool_limits
        sys.modules["threadpoolctl"] = mod
        made.append("threadpoolctl")
    try:
        import pydantic  # noqa: F401
    except ImportError:
        mod = types.ModuleType("pydantic")

        class BaseModel:
            def __init_subclass__(cls, **kwargs):
                pass

        class ValidationError(ValueError):
            pass
        mod.BaseModel, mod.ValidationError, mod.ConfigDict = BaseModel, ValidationError, dict
        mod.Field = lambda *args, **kwargs: None
        mod.model_validator = lambda **kwargs: (lambda fn: fn)
        sys.modules["pydantic"] = mod
        made.append("pydantic")
    return made


STAND_INS = _stand_ins()

from latentsift.states.channel import Rendering  # noqa: E402  (after the stand-ins)
from latentsift.states.extract import extract_pack, extract_settings, pack_size  # noqa: E402
from latentsift.states.model import Fingerprint, Policy  # noqa: E402
from latentsift.states.packing import (BOUNDS, VARLEN, enable_packing,  # noqa: E402
                                       pack_plan, run_length)
from latentsift.states.states import replay_many  # noqa: E402
from latentsift.trajectories.trajectory import CHANNEL_ID  # noqa: E402


# ---------------------------------------------------------------------- sequences
def _tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _segments(record: dict, first_step: int = 0, prompt: bool = True) -> list[tuple[int, int, int]]:
    """(step, channel, tokens) of one dataset trajectory, -1 = excluded."""
    segs = [(-1, -1, SYSTEM_TOKENS + _tokens(record["task_prompt"]) + TEMPLATE_TOKENS)] if prompt else []
    for t, step in enumerate(record["steps"], first_step):
        for ch in ("cot", "fn", "obs"):
            if step.get(ch):
                segs += [(t, CHANNEL_ID[ch], _tokens(step[ch])), (-1, -1, TEMPLATE_TOKENS)]
    return segs


def _lognormal_segments(rng: np.random.Generator) -> list[tuple[int, int, int]]:
    n = int(np.clip(rng.lognormal(math.log(670), 0.45), 64, 2048))
    prompt = n // 3
    rest = n - prompt
    return [(-1, -1, prompt), (0, CHANNEL_ID["cot"], rest // 3), (0, CHANNEL_ID["fn"], rest // 3),
            (0, CHANNEL_ID["obs"], rest - 2 * (rest // 3))]


def _rendering(traj_id: str, segs: list, vocab: int, rng: np.random.Generator, cut: int | None = None) -> Rendering:
    counts = [k for _, _, k in segs]
    step = np.repeat([s for s, _, _ in segs], counts).astype(np.int32)[:cut]
    chan = np.repeat([c for _, c, _ in segs], counts).astype(np.int8)[:cut]
    ids = rng.integers(0, vocab, len(step), dtype=np.int64)
    return Rendering(traj_id, ids, step, chan, int(step.max()) + 1 if (step >= 0).any() else 0)


def _records(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def sequences(source: str, budget: int, long_n: int, long_tokens: int, vocab: int) -> tuple[list, list]:
    """The short renderings (up to ``budget`` tokens run) and the long ones."""
    rng = np.random.default_rng(0)
    records = _records(Path(source)) if source != "lognormal" else []
    short, total = [], 0
    for i in range(10**6):
        if records and i >= len(records):
            break
        segs = _segments(records[i]) if records else _lognormal_segments(rng)
        r = _rendering(f"s{i:05d}", segs, vocab, rng)
        short.append(r)
        total += run_length(r)
        if total >= budget:
            break
    long = []
    for j in range(long_n):
        segs, steps, k = [], 0, j
        while sum(n for *_, n in segs) < long_tokens:
            rec = records[k % len(records)] if records else None
            more = _segments(rec, steps, prompt=not segs) if rec else _lognormal_segments(rng)
            segs += more
            steps += len(rec["steps"]) if rec else 1
            k += 1
        long.append(_rendering(f"long{j}", segs, vocab, rng, cut=long_tokens))
    return short, long


def _cut(r: Rendering, n: int) -> Rendering:
    return Rendering(r.traj_id, r.input_ids[:n], r.step[:n], r.channel[:n], r.n_steps)


# ---------------------------------------------------------------------- the model
def build(shape: str, tiny: bool, device: str, dtype: torch.dtype) -> Policy:
    """A ``Policy`` of a randomly initialised model of ``shape`` (seed 0), without tokenizer."""
    config_cls, arch, kw = SHAPES[shape]
    cfg = getattr(transformers, config_cls)(**(kw | (TINY if tiny else {})))
    cfg.architectures = [arch]
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    fp = Fingerprint(architecture=arch, n_layers=cfg.num_hidden_layers, d_model=cfg.hidden_size,
                     tokenizer_sha="none", template_sha="none", weights_sha=f"random-{shape}",
                     dtype=str(dtype).removeprefix("torch."))
    return Policy(model=model, tokenizer=None, fingerprint=fp, path=f"random:{shape}")


@contextmanager
def attention(policy: Policy, name: str):
    """The model's attention set to ``name`` for the block (the library's packing switch is kept after)."""
    prev = policy.model.config._attn_implementation
    if prev != name:
        policy.model.set_attn_implementation(name)
    try:
        yield
    finally:
        if prev != name:
            policy.model.set_attn_implementation(prev)


# ---------------------------------------------------------------------- the modes
def _attention_kind(device: str, dtype: torch.dtype) -> tuple[str, str]:
    """Which attention the packed modes ran (after the warm-up: a refused kernel has fallen back by then)."""
    if VARLEN.takes(torch.empty(0, device=device, dtype=dtype)):
        return "FlashAttention varlen", ""
    return "sdpa per sequence", VARLEN.why or ("not a CUDA device" if device != "cuda" else f"{dtype}")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _bare(policy: Policy, ids: np.ndarray, **kw):
    dev = policy.device
    return policy.base(input_ids=torch.as_tensor(ids, device=dev).reshape(-1, ids.shape[-1]), use_cache=False,
                       output_hidden_states=True, **kw)


def run_bound(policy: Policy, packs: list[list[Rendering]], loop: bool = False) -> None:
    """Bare packed forwards with the library's packed attention (``enable_packing``: FlashAttention varlen on
    a GPU in 16 bits, else ``sdpa`` per sequence); ``loop``: ``sdpa`` per sequence everywhere."""
    dev = policy.device
    enable_packing(policy)
    was, VARLEN.enabled = VARLEN.enabled, not loop
    try:
        with torch.inference_mode():
            for pack in packs:
                runs = [run_length(r) for r in pack]
                ids = np.concatenate([r.input_ids[:n] for r, n in zip(pack, runs)])
                pos = np.concatenate([np.arange(n) for n in runs])
                cuts = torch.as_tensor(np.cumsum([0] + runs), dtype=torch.int32, device=dev)
                _bare(policy, ids[None], position_ids=torch.as_tensor(pos, device=dev)[None],
                      attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=dev),
                      **{BOUNDS: cuts, "max_length_q": max(runs)})
    finally:
        VARLEN.enabled = was


def run_rows(policy: Policy, stream: np.ndarray, rows_per_forward: int) -> None:
    rows = stream[: len(stream) // ROW * ROW].reshape(-1, ROW)
    with torch.inference_mode(), attention(policy, "sdpa"):
        for a in range(0, len(rows), rows_per_forward):
            _bare(policy, rows[a:a + rows_per_forward])


def run_bare_single(policy: Policy, short: list[Rendering]) -> None:
    with torch.inference_mode(), attention(policy, "sdpa"):
        for r in short:
            _bare(policy, r.input_ids[None, :run_length(r)])


def run_library(policy: Policy, renderings: list[Rendering], settings: dict) -> list:
    """``latentsift extract``'s replay of ``renderings`` with ``settings`` on one device (pack_tokens 0: one per
    forward, ``extract_one``; else ``extract_many``'s packed branch): the states, in order."""
    if not settings["pack_tokens"]:
        return replay_many(policy, renderings, chunk_tokens=settings["chunk_tokens"], max_tokens=settings["max_tokens"])
    items = [(types.SimpleNamespace(traj_id=r.traj_id), [r]) for r in renderings]
    out = []
    for pack in pack_plan(items, lambda tr: pack_size(tr[1], settings), settings["pack_tokens"]):
        out += [st for st, _, _ in extract_pack(policy, pack, settings)]
    return out


def estimate_bytes(policy: Policy, tokens: int, hidden_states: bool, pooled: bool, keys: int = 0) -> int:
    """A forward of ``tokens`` tokens: one layer's transients (q, k, v, attention output, MLP), every hidden
    state when returned, the pooling's float64 copy of a layer; ``keys``: a chunk's attention scores over that
    many cached keys, materialised (float32) where no FlashAttention kernel takes the chunk's mask."""
    cfg = policy.model.config
    size = torch.finfo(policy.model.dtype).bits // 8
    d, kv = cfg.hidden_size, cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    per_token = (4 * d + 2 * kv + 3 * cfg.intermediate_size) * size + cfg.num_attention_heads * keys * 4
    if hidden_states:
        per_token += (cfg.num_hidden_layers + 1) * d * size
    if pooled:
        per_token += d * (8 + 4)
    return tokens * per_token


def free_bytes(device: str) -> int | None:
    return torch.cuda.mem_get_info()[0] if device == "cuda" else None


def _digest(states: list) -> str:
    h = hashlib.sha256()
    for s in states:
        h.update(s.layers.tobytes())
    return h.hexdigest()


def agreement(got: list, ref: list) -> dict:
    """|a - b| / |b| over d_model per span and layer, ``got`` against ``ref`` (the same trajectories)."""
    rel = []
    for a, b in zip(got, ref):
        if a.traj_id != b.traj_id or a.layers.shape != b.layers.shape or a.step.tolist() != b.step.tolist():
            raise RuntimeError(f"{a.traj_id}: the packed and one-per-forward states have other spans")
        rel.append((np.linalg.norm(a.layers - b.layers, axis=-1) / np.linalg.norm(b.layers, axis=-1)).ravel())
    r = np.concatenate(rel) if rel else np.zeros(0)
    return {"max_rel": float(r.max()) if len(r) else 0.0, "median_rel": float(np.median(r)) if len(r) else 0.0,
            "span_layers": int(len(r))}


# ---------------------------------------------------------------------- one shape
def bench_shape(shape: str, args, deadline: float) -> dict:
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    t0 = time.perf_counter()
    policy = build(shape, args.tiny, dev, dtype)
    _sync(dev)
    built = time.perf_counter() - t0
    cfg = policy.model.config
    short, long = sequences(args.lengths, args.budget_tokens, args.long_n, args.long_tokens, cfg.vocab_size)
    n_short = sum(run_length(r) for r in short)
    stream = np.concatenate([r.input_ids[:run_length(r)] for r in short])
    print(f"\n== {shape}: {cfg.num_hidden_layers} layers, d_model {cfg.hidden_size}, {dtype}, built in {built:.1f} s; "
          f"{len(short)} sequences, {n_short:,} tokens (median {int(np.median([run_length(r) for r in short]))}), "
          f"{len(long)} long of {args.long_tokens:,}", flush=True)

    modes: dict[str, dict] = {}   # name -> {fn, tokens, est, library}

    def add(name, fn, tokens, est, library=False):
        modes[name] = {"fn": fn, "tokens": tokens, "est": est, "library": library}

    chunk_settings = extract_settings(policy, pack_tokens=0)
    for b in args.pack:
        packs = list(pack_plan(short, run_length, b))
        longest = max(sum(run_length(r) for r in p) for p in packs)
        add(f"bound@{b}", lambda packs=packs: run_bound(policy, packs), n_short,
            estimate_bytes(policy, longest, True, False))
        add(f"bound-loop@{b}", lambda packs=packs: run_bound(policy, packs, True), n_short,
            estimate_bytes(policy, longest, True, False))
        rows = max(1, b // ROW)
        if f"rows@{rows * ROW}" not in modes:
            add(f"rows@{rows * ROW}", lambda rows=rows: run_rows(policy, stream, rows), len(stream) // ROW * ROW,
                estimate_bytes(policy, rows * ROW, True, False))
    add("bare-single", lambda: run_bare_single(policy, short), n_short,
        estimate_bytes(policy, max(run_length(r) for r in short), True, False))
    add("single", lambda: run_library(policy, short, chunk_settings), n_short,
        estimate_bytes(policy, max(run_length(r) for r in short), False, True), library=True)
    effective = {}
    for b in args.pack:
        settings = extract_settings(policy, pack_tokens=b)
        effective[b] = settings["pack_tokens"]
        name = f"packed@{settings['pack_tokens']}"
        if name not in modes:
            add(name, lambda s=settings: run_library(policy, short, s), n_short,
                estimate_bytes(policy, settings["pack_tokens"], False, True), library=True)
    # the device's default pack_tokens (a long trajectory is a pack of one); "long" at the default chunk, then
    # long@C: chunks of C tokens (capped by the context window: a chunk as long as its window needs no KV cache)
    long_settings = {"long": extract_settings(policy)}
    long_settings |= {f"long@{c}": extract_settings(policy, chunk_tokens=c) for c in args.long_chunks}
    for name, ls in long_settings.items() if long else ():
        chunk = min(ls["chunk_tokens"], ls["context"], args.long_tokens)
        keys = min(args.long_tokens, ls["context"]) if chunk < min(args.long_tokens, ls["context"]) else 0
        add(name, lambda ls=ls: run_library(policy, long, ls), sum(r.n_tokens for r in long),
            estimate_bytes(policy, chunk, False, True, keys), library=True)
    if args.modes:
        keep = set(args.modes)
        modes = {k: v for k, v in modes.items() if k.split("@")[0] in keep or k in keep}

    free = free_bytes(dev)
    skipped: dict[str, str] = {}
    for name, m in modes.items():
        if free is not None and m["est"] > MEMORY_SHARE * free:
            skipped[name] = (f"needs about {m['est'] / 2**30:.1f} GiB, more than {MEMORY_SHARE:.0%} of the "
                             f"{free / 2**30:.1f} GiB free")
            print(f"   skip {name}: {skipped[name]}", flush=True)

    def attempt(name, fn):
        try:
            return fn()
        except Exception as e:   # out of memory, or a kernel refusing: this mode is skipped, the others run
            first = (str(e).splitlines() or [""])[0][:160]
            skipped[name] = (f"out of memory: {first}" if isinstance(e, torch.OutOfMemoryError)
                             else f"failed: {type(e).__name__}: {first}")
            print(f"   skip {name}: {skipped[name]}", flush=True)
            if not isinstance(e, torch.OutOfMemoryError):
                traceback.print_exc()
            if dev == "cuda":
                torch.cuda.empty_cache()
            return None

    # warm-up: every mode on a few sequences (the long ones cut to two chunks and a bit)
    t_warm = time.perf_counter()
    warm_short, warm_long = short[:4], [_cut(r, 2 * ROW + 100) for r in long[:1]]
    for name in [n for n in modes if n not in skipped]:
        b = int(name.split("@")[1]) if "@" in name else 0
        if name.startswith("bound"):
            fn = lambda: run_bound(policy, list(pack_plan(warm_short, run_length, b)),  # noqa: E731
                                   name.startswith("bound-loop"))
        elif name.startswith("rows@"):
            fn = lambda: run_rows(policy, stream[: 2 * ROW], max(1, b // ROW))  # noqa: E731
        elif name == "bare-single":
            fn = lambda: run_bare_single(policy, warm_short)  # noqa: E731
        elif name in long_settings:
            fn = lambda: run_library(policy, warm_long, long_settings[name])  # noqa: E731
        else:
            fn = lambda: run_library(policy, warm_short, chunk_settings if name == "single"  # noqa: E731
                                     else extract_settings(policy, pack_tokens=b))
        attempt(name, fn)
    _sync(dev)
    kind, why = _attention_kind(dev, dtype)
    print(f"   warm-up {time.perf_counter() - t_warm:.1f} s; packed attention: {kind}" + (f" ({why})" if why else ""),
          flush=True)

    seconds: dict[str, list[float]] = {n: [] for n in modes}
    digests: dict[str, list[str]] = {n: [] for n in modes if modes[n]["library"]}
    last: dict[str, list] = {}
    order = list(modes)
    for rnd in range(args.rounds):
        t_round = time.perf_counter()
        for name in order[rnd % len(order):] + order[:rnd % len(order)]:
            if name in skipped:
                continue
            _sync(dev)
            t = time.perf_counter()
            out = attempt(name, modes[name]["fn"])
            _sync(dev)
            if name in skipped:
                continue
            seconds[name].append(time.perf_counter() - t)
            if modes[name]["library"]:
                digests[name].append(_digest(out))
                last[name] = out
        took = time.perf_counter() - t_round
        print(f"   round {rnd + 1}: {took:.1f} s", flush=True)
        if time.perf_counter() + took > deadline and rnd + 1 < args.rounds:
            print(f"   stopping after {rnd + 1} rounds: --seconds reached", flush=True)
            break

    res: dict = {"config": {k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "intermediate_size", "vocab_size",
                                                          "max_position_embeddings")},
                 "dtype": str(dtype).removeprefix("torch."), "built_s": built,
                 "sequences": len(short), "tokens": n_short, "long": {"n": len(long), "tokens": args.long_tokens},
                 "bound_attention": kind, "bound_attention_note": why,
                 "pack_tokens_recorded": {str(b): e for b, e in effective.items()},
                 "modes": {}, "skipped": skipped}
    for name, m in modes.items():
        if seconds[name]:
            res["modes"][name] = {"tokens": m["tokens"], "seconds": seconds[name],
                                  "tok_s": m["tokens"] / statistics.median(seconds[name])}
    rate = {n: v["tok_s"] for n, v in res["modes"].items()}
    res["ratios"] = {}
    for b, e in effective.items():
        for top, bottom in ((f"packed@{e}", f"bound@{b}"), (f"bound-loop@{b}", f"bound@{b}")):
            if top in rate and bottom in rate:
                res["ratios"][f"{top} / {bottom}"] = rate[top] / rate[bottom]
    for name in rate:
        if name.startswith("packed@") and "single" in rate:
            res["ratios"][f"{name} / single"] = rate[name] / rate["single"]
    res["same_bytes_every_round"] = {n: len(set(d)) == 1 for n, d in digests.items() if d}
    res["digests"] = {n: d[0] for n, d in digests.items() if d}   # sha256 of the states: compare fresh processes
    res["agreement"] = {n: agreement(last[n], last["single"]) for n in last if n.startswith("packed@")
                        and "single" in last}
    res["team_replay_hours"] = team_rows(rate)
    return res


def team_rows(rate: dict[str, float]) -> dict:
    """Hours to replay TEAM_TOKENS at each measured rate (computed, not run)."""
    return {name: TEAM_TOKENS / r / 3600 for name, r in rate.items()}


# ---------------------------------------------------------------------- output
def table(results: dict) -> str:
    lines = []
    for shape, res in results["shapes"].items():
        if "error" in res:
            lines.append(f"{shape}: failed: {res['error']}")
            continue
        lines.append(f"\n{shape} ({res['dtype']}, {res['sequences']} sequences, {res['tokens']:,} tokens; "
                     f"bound@B attention: {res['bound_attention']})")
        lines.append(f"  {'mode':16s} {'tok/s':>12s} {'rounds':>7s} {'240 M tokens':>14s}")
        for name, m in res["modes"].items():
            lines.append(f"  {name:16s} {m['tok_s']:12,.0f} {len(m['seconds']):7d} "
                         f"{res['team_replay_hours'][name]:12.2f} h")
        for name, why in res["skipped"].items():
            lines.append(f"  {name:16s} skipped: {why}")
        for k, v in res["ratios"].items():
            lines.append(f"  {k}: {v:.3f}")
        for k, v in res["agreement"].items():
            lines.append(f"  {k} vs single: |a-b|/|b| max {v['max_rel']:.2e}, median {v['median_rel']:.2e} "
                         f"({v['span_layers']} span x layer)")
        lines.append("  same bytes in every round: " + ", ".join(f"{k} {v}" for k, v in
                                                                 res["same_bytes_every_round"].items()))
        lines.append(f"  pack_tokens as extract_settings records them: {res['pack_tokens_recorded']}")
        hours = res["team_replay_hours"]
        rows = [(h, n) for n, h in hours.items() if n.startswith("long") or n == "single"]
        for kind in ("packed@", "bound@"):   # the fastest of each, where measured
            rows += [min((h, n) for n, h in hours.items() if n.startswith(kind))] if any(
                n.startswith(kind) for n in hours) else []
        lines.append("  240 M tokens, computed from the measured rates: " + "; ".join(f"{h:.2f} h at {n}"
                                                                                       for h, n in rows))
    lines.append(f"\n240 M tokens = 16 samples x 500 SWE-bench tasks x 30k tokens; the hours are computed from "
                 f"the measured rates (only {results['facts']['device']} rates were measured). A 30k-token "
                 "trajectory is longer than a chunk, so extract replays it as 'long' does, not packed.")
    return "\n".join(lines)


def facts(device: str) -> dict:
    f = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
         "transformers": transformers.__version__, "numpy": np.__version__, "python": platform.python_version(),
         "stand_ins": STAND_INS}
    if device == "cuda":
        f["gpu"] = torch.cuda.get_device_name(0)
        f["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    else:
        f["cpu"] = platform.processor() or platform.machine()
        f["torch_threads"] = torch.get_num_threads()
    return f


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--shapes", default="smollm2,qwen1.5b", help=f"comma-separated, of {list(SHAPES)}")
    ap.add_argument("--tiny", action="store_true", help="2 layers of width 64 (the CPU smoke)")
    ap.add_argument("--lengths", default=str(DATA) if DATA.is_file() else "lognormal",
                    help="canonical trajectory JSONL(.gz) whose lengths are used, or 'lognormal'")
    ap.add_argument("--budget-tokens", type=int, default=131072, help="tokens of the short sequences")
    ap.add_argument("--pack", default="8192,16384,65536", help="tokens per packed forward (B), comma-separated")
    ap.add_argument("--long-n", type=int, default=2, help="trajectories of --long-tokens (0: none)")
    ap.add_argument("--long-tokens", type=int, default=30000)
    ap.add_argument("--long-chunks", default="32768", help="chunk tokens of the long@C modes, comma-separated ('': none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=240.0, help="stop starting rounds after this, all shapes")
    ap.add_argument("--modes", help="comma-separated subset (bound, rows, bare-single, single, packed, long)")
    ap.add_argument("--threads", type=int, help="torch threads (a CPU)")
    ap.add_argument("--out", type=Path, help="JSON written here")
    args = ap.parse_args(argv)
    args.pack = [int(b) for b in args.pack.split(",")]
    args.modes = args.modes.split(",") if args.modes else None
    args.long_chunks = [int(c) for c in args.long_chunks.split(",") if c]
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/packed_gpu.py: torch sees no CUDA device; use --device cpu.")
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    results = {"facts": facts(args.device), "args": {k: v for k, v in vars(args).items() if k != "out"},
               "shapes": {}}
    print("facts: " + json.dumps(results["facts"]), flush=True)
    shapes = args.shapes.split(",")
    for i, shape in enumerate(shapes):
        left = args.seconds - (time.perf_counter() - start)
        deadline = time.perf_counter() + left / (len(shapes) - i)
        try:
            results["shapes"][shape] = bench_shape(shape, args, deadline)
        except Exception as e:  # one shape failing says why; the other still runs
            traceback.print_exc()
            results["shapes"][shape] = {"error": f"{type(e).__name__}: {e}"[:500]}
        if args.device == "cuda":
            torch.cuda.empty_cache()
        results["seconds"] = time.perf_counter() - start
        if args.out:   # after each shape: a run cut short still returns what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1, default=str))
    print(table(results), flush=True)
    print(f"\ntotal {results['seconds']:.0f} s", flush=True)
    return results


if __name__ == "__main__":
    main()
