"""Benchmark of state extraction: tokens/s next to a bare forward pass of the same tokens, bytes on
disk per 1,000 tokens, and peak memory against trajectory length.

    .venv/bin/python bench/extract.py [--n 24] [--max-span-tokens 64] [--max-prompt-tokens 128]

Timings alternate bare / hooked per trajectory so that load from other processes hits both alike.
- ``bare``: replay's chunked prefill (same chunks; KV cache when over one chunk) without hooks;
- ``bare-1``: one forward per trajectory without cache (use_cache=False);
- ``replay``: ``latentsift.states.states.replay`` (hooks + pooling);
- ``extract``: ``extract_pools`` end to end (render + replay + safetensors/Parquet writes);
- ``batch4``: bare forward of 4 right-padded renderings at once (is batching worth it on CPU?).
Memory: each length runs in a fresh subprocess; peak RSS growth over the loaded, warmed model.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LATENTSIFT_DATA", ROOT.parent / "shared" / "datasets" / "swebench-lite-pools"))


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter (Linux: VmHWM); False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_now_mb() -> float:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return _peak_mb()


def memory_probe(n_tokens: int, chunk: int) -> None:
    """Child: replay a synthetic n-token rendering; print peak RSS growth (MB) as JSON."""
    from latentsift.states.channel import Rendering
    from latentsift.states.model import load_policy
    from latentsift.states.states import replay

    policy = load_policy()
    rng = np.random.default_rng(0)
    warm = Rendering("warm", rng.integers(100, 40000, 64), np.zeros(64, np.int32), np.zeros(64, np.int8), 1)
    replay(policy, warm)
    _reset_peak()
    before = _rss_now_mb()
    ids = rng.integers(100, 40000, n_tokens)
    pos = np.arange(n_tokens)
    step = (pos // 150).astype(np.int32)              # one step per 150 tokens, three channels
    chan = ((pos % 150) // 50).astype(np.int8)
    t0 = time.perf_counter()
    s = replay(policy, Rendering("probe", ids, step, chan, int(step.max()) + 1), chunk_tokens=chunk)
    dt = time.perf_counter() - t0
    print(json.dumps({"n_tokens": n_tokens, "peak_growth_mb": _peak_mb() - before, "seconds": dt,
                      "n_spans": s.n_spans, "context": policy.context_length}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24, help="trajectories (half ACR, half SWE-agent)")
    ap.add_argument("--max-span-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=128)
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's choice); use 1 on a busy machine")
    ap.add_argument("--memory-lengths", default="1024,4096,16384",
                    help="comma-separated token counts for the memory probe ('' to skip)")
    ap.add_argument("--probe", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.probe:
        memory_probe(args.probe, args.chunk_tokens)
        return
    from transformers import DynamicCache

    from latentsift.states.channel import render
    from latentsift.trajectories.importers import import_paths
    from latentsift.states.model import load_policy
    from latentsift.states.states import replay
    from latentsift.states.extract import extract_pools
    from latentsift.states.store import StateStore

    policy = load_policy(dtype=args.dtype)
    half = args.n // 2
    trajs = import_paths(DATA / "r2egym" / "acr-run-1.jsonl.gz").trajectories[:args.n - half]
    trajs += import_paths(DATA / "sweagent" / "cost_2_1.tar.gz").trajectories[:half]
    kw = {"max_span_tokens": args.max_span_tokens, "max_prompt_tokens": args.max_prompt_tokens}
    renders = [render(t, policy.tokenizer, **kw) for t in trajs]
    base = policy.base

    def run_len(r) -> int:   # replay stops after the last pooled token; the bare pass runs the same tokens
        pooled = np.flatnonzero(r.step >= 0)
        return int(pooled[-1]) + 1 if len(pooled) else 0

    def bare(r) -> None:   # replay's chunking (KV cache only when more than one chunk), no hooks
        ids = torch.as_tensor(r.input_ids[:run_len(r)])[None]
        cache = DynamicCache(config=policy.model.config) if ids.shape[1] > args.chunk_tokens else None
        for a in range(0, ids.shape[1], args.chunk_tokens):
            base(input_ids=ids[:, a:a + args.chunk_tokens], past_key_values=cache, use_cache=cache is not None)

    def bare1(r) -> None:
        base(input_ids=torch.as_tensor(r.input_ids[:run_len(r)])[None], use_cache=False)

    with torch.inference_mode():
        bare(renders[0])
    replay(policy, renders[0], chunk_tokens=args.chunk_tokens)
    times = {"bare": 0.0, "bare-1": 0.0, "replay": 0.0}
    n_tok = sum(run_len(r) for r in renders)
    for r in renders:
        for name, fn in (("bare", bare), ("replay", None), ("bare-1", bare1)):
            t0 = time.perf_counter()
            if fn is None:
                replay(policy, r, chunk_tokens=args.chunk_tokens)
            else:
                with torch.inference_mode():
                    fn(r)
            times[name] += time.perf_counter() - t0

    # batching: 4 right-padded renderings per forward vs the same 4 one at a time (bare, no cache)
    b_time = s_time = 0.0
    b_tok = 0
    for a in range(0, len(renders) - 3, 4):
        group = renders[a:a + 4]
        lens = [run_len(r) for r in group]
        ids = torch.full((4, max(lens)), policy.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros(4, max(lens), dtype=torch.long)
        for i, (r, n) in enumerate(zip(group, lens)):
            ids[i, :n] = torch.as_tensor(r.input_ids[:n])
            mask[i, :n] = 1
        with torch.inference_mode():
            t0 = time.perf_counter()
            base(input_ids=ids, attention_mask=mask, use_cache=False)
            t1 = time.perf_counter()
            for r in group:
                bare1(r)
            t2 = time.perf_counter()
        b_time += t1 - t0
        s_time += t2 - t1
        b_tok += sum(lens)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rep = extract_pools(policy, trajs, Path(tmp) / "s", chunk_tokens=args.chunk_tokens, **kw)
        t_extract = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (Path(tmp) / "s").rglob("*") if p.is_file())
        t0 = time.perf_counter()
        StateStore(Path(tmp) / "s").load()
        t_load = time.perf_counter() - t0

    print(f"device {policy.device}, dtype {args.dtype}, torch threads {torch.get_num_threads()}, "
          f"{len(renders)} trajectories, {n_tok:,} tokens run (max_span_tokens={args.max_span_tokens}, "
          f"max_prompt_tokens={args.max_prompt_tokens}, chunk {args.chunk_tokens})")
    for name in ("bare-1", "bare", "replay"):
        print(f"  {name:8s} {n_tok / times[name]:8,.0f} tok/s")
    print(f"  extract  {rep.n_tokens / t_extract:8,.0f} tok/s (render + replay + store; counts all rendered tokens)")
    print(f"  hook + pooling overhead over the bare chunked pass: {times['replay'] / times['bare'] - 1:+.1%}; "
          f"over bare-1: {times['replay'] / times['bare-1'] - 1:+.1%}")
    print(f"  end-to-end extract over the bare chunked pass: {t_extract / times['bare'] - 1:+.1%}")
    if b_tok:
        print(f"  batch of 4 (right padding) {b_tok / b_time:,.0f} tok/s vs one at a time {b_tok / s_time:,.0f} tok/s "
              "(padded tokens not counted)")
    print(f"  on disk: {size:,} bytes for {rep.n_tokens:,} tokens = {size / rep.n_tokens * 1000:,.0f} bytes per "
          f"1,000 tokens ({rep.n_extracted} trajectories, all 30 layers, float16); load {t_load:.2f} s")

    lengths = [int(x) for x in args.memory_lengths.split(",") if x.strip()]
    for n in lengths:
        cmd = [sys.executable, __file__, "--probe", str(n), "--chunk-tokens", str(args.chunk_tokens)]
        out = subprocess.run(cmd + (["--threads", str(args.threads)] if args.threads else []),
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  memory probe {n} failed: {out.stderr[-500:]}")
            continue
        m = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  peak memory growth replaying {n:6,d} tokens: {m['peak_growth_mb']:7.1f} MB "
              f"({m['n_tokens'] / m['seconds']:,.0f} tok/s, context {m['context']})")


if __name__ == "__main__":
    main()
