"""CPU forward engines for state extraction, side by side in one run: tokens/s and how far their
pooled states are from eager float32.

    .venv/bin/python bench/forward.py [--n 8] [--rounds 2] [--engines fp32,bf16,int8,int8pc[,compile]]

Engines (all through ``latentsift.states.states.replay``, the extraction path, hooks included):
- ``fp32``: eager float32 (the reference);
- ``bf16``: eager bfloat16;
- ``int8``: ``torch.ao.quantization.quantize_dynamic`` of every ``nn.Linear`` (int8 weights, activations
  quantised per batch), per-tensor weight scales, float32 elsewhere;
- ``int8pc``: the same with per-channel weight scales;
- ``compile``: ``torch.compile`` of each decoder layer, float32 (needs a C++ compiler at run time:
  never a default, since nothing may compile during ``make test`` or ``make demo``).
- ``auto``: what ``dtype="auto"`` picks on this machine (printed with its reason).

Timings alternate engines per trajectory so that load from other processes hits all alike; each
engine is warmed up first. State differences: per span and layer, ||s - s_fp32|| / ||s_fp32|| (max and
median) and the cosine, on the final layer and over all layers.
To see an AVX2-only CPU on a machine with native bf16, run under
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``.
"""
from __future__ import annotations

import argparse
import copy
import os
import shutil
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LATENTSIFT_DATA", ROOT.parent / "shared" / "datasets" / "swebench-lite-pools"))


def make_engine(name: str, fp32, bf16):
    import torch

    from latentsift.states.model import Policy

    if name == "fp32":
        return fp32
    if name == "bf16":
        return bf16
    if name == "int8":
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(fp32.model), {torch.nn.Linear}, dtype=torch.qint8)
        return Policy(model=q, tokenizer=fp32.tokenizer, fingerprint=fp32.fingerprint, path=fp32.path)
    if name == "int8pc":
        qc = torch.ao.quantization.per_channel_dynamic_qconfig
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(fp32.model), {torch.nn.Linear: qc}, dtype=torch.qint8)
        return Policy(model=q, tokenizer=fp32.tokenizer, fingerprint=fp32.fingerprint, path=fp32.path)
    if name == "compile":
        m = copy.deepcopy(fp32.model)
        for layer in m.model.layers:
            layer.compile(dynamic=True)
        return Policy(model=m, tokenizer=fp32.tokenizer, fingerprint=fp32.fingerprint, path=fp32.path)
    raise SystemExit(f"unknown engine {name!r}")


def rel_err(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per (span, layer): ||a - ref|| / ||ref||."""
    return np.linalg.norm(a - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-12)


def cosine(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return (a * ref).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(ref, axis=-1), 1e-12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="trajectories (half ACR, half SWE-agent)")
    ap.add_argument("--rounds", type=int, default=2, help="timed passes over the trajectories")
    ap.add_argument("--engines", default="fp32,bf16,int8,int8pc",
                    help="comma-separated; add compile to time torch.compile (needs a C++ compiler)")
    ap.add_argument("--max-span-tokens", type=int, default=16, help="the default run's span budget")
    ap.add_argument("--max-prompt-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from latentsift.states.channel import render
    from latentsift.trajectories.importers import import_paths
    from latentsift.states.model import cpu_dtype_choice, load_policy
    from latentsift.states.states import replay

    choice = cpu_dtype_choice()
    fp32 = load_policy(dtype="float32", device="cpu")
    bf16 = load_policy(dtype="bfloat16", device="cpu")
    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    if "compile" in names and not shutil.which(os.environ.get("CXX", "g++")):
        print("  compile: skipped (no C++ compiler on PATH)")
        names.remove("compile")
    engines = {}
    for n in names:
        try:
            engines[n] = make_engine(n, fp32, bf16)
        except Exception as e:  # an engine this torch build lacks: report, keep the others
            print(f"  {n}: unavailable ({type(e).__name__}: {str(e)[:120]})")
    half = args.n // 2
    trajs = import_paths(DATA / "r2egym" / "acr-run-1.jsonl.gz").trajectories[:args.n - half]
    trajs += import_paths(DATA / "sweagent" / "cost_2_1.tar.gz").trajectories[:half]
    renders = [render(t, fp32.tokenizer, max_span_tokens=args.max_span_tokens,
                      max_prompt_tokens=args.max_prompt_tokens) for t in trajs]
    n_tok = sum(int(np.flatnonzero(r.step >= 0)[-1]) + 1 for r in renders)

    warm = {}
    for name, pol in list(engines.items()):
        t0 = time.perf_counter()
        try:
            warm[name] = [replay(pol, r) for r in renders]   # warm-up pass; also the states compared
        except Exception as e:
            print(f"  {name}: failed ({type(e).__name__}: {str(e)[:160]})")
            del engines[name]
            continue
        print(f"  {name}: warm-up pass {time.perf_counter() - t0:.1f} s")
    times = dict.fromkeys(engines, 0.0)
    for _ in range(args.rounds):
        for r in renders:
            for name, pol in engines.items():
                t0 = time.perf_counter()
                replay(pol, r)
                times[name] += time.perf_counter() - t0

    print(f"\nCPU capability {torch.backends.cpu.get_cpu_capability()}, torch threads {torch.get_num_threads()}, "
          f"{len(renders)} trajectories, {n_tok:,} tokens x {args.rounds} rounds "
          f"(max_span_tokens={args.max_span_tokens}, max_prompt_tokens={args.max_prompt_tokens})")
    auto = {"float32": "fp32", "bfloat16": "bf16"}.get(choice.dtype)
    print(f"auto -> {choice.dtype}: {choice.reason}")
    ref = warm.get("fp32")
    print(f"{'engine':8s} {'tok/s':>8s} {'x fp32':>7s}  {'final: max rel':>14s} {'median':>8s} {'min cos':>8s}"
          f"  {'all layers: max rel':>19s} {'median':>8s}")
    for name in engines:
        rate = n_tok * args.rounds / times[name]
        x = times["fp32"] / times[name] if "fp32" in times else float("nan")
        if ref is None:
            print(f"{name:8s} {rate:8,.0f} {x:7.2f}")
            continue
        fin = np.concatenate([rel_err(s.layers[:, -1], r.layers[:, -1]) for s, r in zip(warm[name], ref)])
        cos = np.concatenate([cosine(s.layers[:, -1], r.layers[:, -1]) for s, r in zip(warm[name], ref)])
        alll = np.concatenate([rel_err(s.layers, r.layers).ravel() for s, r in zip(warm[name], ref)])
        print(f"{name:8s} {rate:8,.0f} {x:7.2f}  {fin.max():14.2e} {np.median(fin):8.2e} {cos.min():8.5f}"
              f"  {alll.max():19.2e} {np.median(alll):8.2e}")
    if auto in times:
        print(f"{'auto':8s} {n_tok * args.rounds / times[auto]:8,.0f} {times['fp32'] / times[auto]:7.2f}  "
              f"(= {auto}, the dtype 'auto' picks here)")


if __name__ == "__main__":
    main()
