"""The CUDA path, checked and timed on a machine with a GPU: same bytes in fresh processes, agreement with
the CPU, extraction's rate, and the rollout's online capture on the GPU.

    .venv/bin/python bench/cuda.py [--model PATH] [--pools FILE] [--n 256] [--check 12] [--rollout-tasks 2]

Printed, each part on its own (a part that fails prints its error and the others still run):

- ``facts``: torch, CUDA, the GPU, the host CPU (model, cores, AMX / AVX512-BF16 flags);
- ``pooling``: one layer's span sums of a 2,048-token chunk, repeated 20 times on the GPU with
  ``index_add_`` (atomics) and with ``states.add_span_sums`` (the order-free pooling used there):
  how many distinct results each gives;
- ``same bytes``: the sha256 of every trajectory's float32 span means from ``extract_many`` in two fresh
  processes and in this one after other work, on the GPU, in bfloat16 (``auto``) and float32;
- ``agreement``: the GPU's states against the CPU's float32 ones of the same trajectories (per span,
  ``|a - b| / |b|`` over d_model: median and max, all layers), next to the CPU's own bf16 - fp32;
- ``rate``: ``extract_pools`` of --n trajectories into a store on the GPU (tokens/s as ``latentsift
  extract`` reports them) beside a bare forward of the same tokens (no hooks);
- ``rollout``: ``latentsift rollout --device cuda`` of --rollout-tasks HumanEval tasks (K = 4, short
  turns) twice in fresh processes (same trajectories and states bytes?) and once in float32, whose
  online states are compared with a float32 replay of the saved trajectories on the GPU.

--pools defaults to the committed own-policy dataset (the shared SWE data need not be on a GPU machine).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from forward import rel_err  # bench/forward.py, beside this script: ||a - ref|| / ||ref|| per span and layer

ROOT = Path(__file__).resolve().parents[1]
POOLS = ROOT / "data" / "own-policy" / "qwen2.5-coder-0.5b" / "trajectories.jsonl.gz"
SAME_BYTES = {"max_span_tokens": 64, "max_prompt_tokens": 128}
DEV = "cuda"   # --device cpu: a dry run of the same steps on a machine without a GPU


def _shas(policy, trajs) -> dict[str, str]:
    from latentsift.states.extract import extract_many, extract_settings

    done = extract_many(policy, trajs, extract_settings(policy, **SAME_BYTES))
    return {s.traj_id: hashlib.sha256(s.layers.tobytes()).hexdigest() for s, _, _ in done}


def child(args) -> None:
    """A fresh process: per dtype, the sha256 of each trajectory's states on the GPU (JSON on stdout)."""
    from latentsift.states.model import load_policy
    from latentsift.trajectories.trajectory import load_jsonl

    trajs = load_jsonl(args.pools)[:args.check]
    print(json.dumps({d: _shas(load_policy(args.model, dtype=d, device=DEV), trajs) for d in ("auto", "float32")}))


def part(name: str):
    def wrap(fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            print(f"\n== {name}", flush=True)
            try:
                fn(*a, **kw)
            except Exception:  # a part that fails says why; the others still run
                print(traceback.format_exc()[-3000:])
            print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
        return run
    return wrap


@part("facts")
def facts() -> None:
    import torch

    from latentsift.states.hardware import cpu_facts

    host = cpu_facts()
    gpu = torch.cuda.get_device_name(0) if DEV == "cuda" else "none used"
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU {gpu}; "
          f"host {host.model}, {os.cpu_count()} cores, AMX {host.amx}, AVX512-BF16 {host.avx512_bf16}")


@part("pooling")
def pooling() -> None:
    import torch

    from latentsift.states.states import add_span_sums, span_plan

    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(2048, 576, device=DEV, generator=g, dtype=torch.bfloat16).float()
    lengths = np.random.default_rng(0).integers(8, 200, 64)
    tgt = torch.as_tensor(np.repeat(np.arange(len(lengths)), lengths)[:2048], device=DEV)
    plan = span_plan(tgt)
    seen: dict[str, set] = {"index_add_": set(), "add_span_sums": set()}
    for _ in range(20):
        a = torch.zeros(len(lengths), 576, device=DEV).index_add_(0, tgt, x)
        b = torch.zeros(len(lengths), 576, device=DEV)
        add_span_sums(b, 0, tgt, x, plan, ordered=False)
        seen["index_add_"].add(hashlib.sha256(a.cpu().numpy().tobytes()).hexdigest())
        seen["add_span_sums"].add(hashlib.sha256(b.cpu().numpy().tobytes()).hexdigest())
    print("distinct results of 20 runs: " + ", ".join(f"{k} {len(v)}" for k, v in seen.items())
          + f"; largest difference between the two {float((a - b).abs().max()):.3g} (sums up to "
          f"{float(b.abs().max()):.3g})")


@part("same bytes (two fresh processes and this one after other work)")
def same_bytes(args, policies, trajs) -> None:
    from latentsift.states.states import replay
    from latentsift.states.channel import render

    cmd = [sys.executable, __file__, "--child", "--model", str(args.model), "--pools", str(args.pools),
           "--check", str(args.check), "--device", DEV]
    children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for c in children:
        out, err = c.communicate(timeout=900)
        if c.returncode:
            raise RuntimeError(err[-2000:])
        outs.append(json.loads(out.strip().splitlines()[-1]))
    for dtype, pol in policies.items():
        other = trajs[args.check:args.check + 2]
        _shas(pol, other)                                   # other work first: other lengths, other settings
        replay(pol, render(other[0], pol.tokenizer, max_span_tokens=8), chunk_tokens=64)
        mine = _shas(pol, trajs[:args.check])
        first, second = (o[dtype] for o in outs)
        same = sum(first[t] == second[t] == mine[t] for t in mine)
        print(f"{dtype:8s} ({pol.fingerprint.dtype}): {same}/{len(mine)} trajectories the same bytes in all three")


@part("agreement with the CPU's float32 states")
def agreement(args, policies, trajs) -> None:
    from latentsift.states.extract import extract_many, extract_settings
    from latentsift.states.model import load_policy

    def states(pol):
        return {s.traj_id: s.layers for s, _, _ in extract_many(pol, trajs[:args.check],
                                                                extract_settings(pol, **SAME_BYTES))}
    ref = states(load_policy(args.model, dtype="float32", device="cpu"))
    rows = {f"GPU {d}": states(p) for d, p in policies.items()}
    try:
        rows["CPU bfloat16"] = states(load_policy(args.model, dtype="bfloat16", device="cpu"))
    except Exception as e:  # pragma: no cover - a CPU without bf16 kernels
        print(f"CPU bfloat16: {e}")
    for name, got in rows.items():
        rel = np.concatenate([rel_err(got[t], ref[t]).ravel() for t in ref])
        print(f"{name:13s} vs CPU float32: |a-b|/|b| per span and layer: median {np.median(rel):.2e}, "
              f"99th pct {np.percentile(rel, 99):.2e}, max {rel.max():.2e} ({len(rel)} spans x layers)")


@part("rate")
def rate(args, policies, trajs) -> None:
    import torch

    from latentsift.states.channel import render
    from latentsift.states.extract import extract_pools

    pol = policies["auto"]
    sel = trajs[:args.n]
    with tempfile.TemporaryDirectory() as tmp:
        extract_pools(pol, sel[:4], Path(tmp) / "warm")
        t0 = time.perf_counter()
        rep = extract_pools(pol, sel, Path(tmp) / "s")
        dt = time.perf_counter() - t0
    renders = [render(t, pol.tokenizer) for t in sel]
    t0 = time.perf_counter()
    with torch.inference_mode():
        for r in renders:
            pol.base(input_ids=torch.as_tensor(r.input_ids, device=DEV)[None], use_cache=False)
        if DEV == "cuda":
            torch.cuda.synchronize()
    bare = time.perf_counter() - t0
    n_tok = sum(r.n_tokens for r in renders)
    print(f"extract_pools on the GPU ({pol.fingerprint.dtype}): {rep.n_extracted} trajectories, "
          f"{rep.n_tokens:,} tokens in {dt:.1f} s = {rep.n_tokens / dt:,.0f} tok/s; a bare forward of the same "
          f"{n_tok:,} tokens {n_tok / bare:,.0f} tok/s (one trajectory per forward)")


@part("rollout on the GPU")
def rollout(args) -> None:
    from latentsift.rollout.folder import STATES_DIR, TRAJECTORIES
    from latentsift.states.model import load_policy
    from latentsift.states.channel import render
    from latentsift.states.states import replay
    from latentsift.states.store import SHARDS, StateStore
    from latentsift.trajectories.trajectory import load_jsonl

    tmp = Path(tempfile.mkdtemp(prefix="cuda-rollout-"))
    base = [sys.executable, "-m", "latentsift.cli", "rollout", "--model", str(args.model), "--device", DEV,
            "--tasks", str(args.rollout_tasks), "--samples", "4", "--max-new-tokens", "96", "--turns", "2"]
    runs = {"bf16-a": [], "bf16-b": [], "fp32": ["--dtype", "float32"]}
    procs = {n: subprocess.Popen(base + ["--out", str(tmp / n)] + extra, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for n, extra in runs.items()}
    for n, p in procs.items():
        out, err = p.communicate(timeout=900)
        if p.returncode:
            raise RuntimeError(f"{n}: {err[-2000:]}")
        print(f"{n}: " + " | ".join(line.strip() for line in err.splitlines()
                                     if line.startswith("model:") or "tasks run" in line)[:600])

    def digest(n: str) -> tuple[str, str]:
        trajs = gzip.decompress((tmp / n / TRAJECTORIES).read_bytes())
        shards = sorted((tmp / n / STATES_DIR / SHARDS).glob("*"))
        return hashlib.sha256(trajs).hexdigest(), hashlib.sha256(b"".join(p.read_bytes() for p in shards)).hexdigest()
    a, b = digest("bf16-a"), digest("bf16-b")
    print(f"two bf16 rollouts in fresh processes: trajectories {'same' if a[0] == b[0] else 'DIFFER'}, "
          f"state shards {'same' if a[1] == b[1] else 'DIFFER'}")
    pol = load_policy(args.model, dtype="float32", device=DEV)
    trajs = load_jsonl(tmp / "fp32" / TRAJECTORIES)
    online = StateStore(tmp / "fp32" / STATES_DIR).load(dtype="float32")
    rel = np.concatenate([rel_err(online[t.traj_id].layers, replay(pol, render(t, pol.tokenizer)).layers).ravel()
                          for t in trajs])
    print(f"float32 online capture vs a float32 replay on the GPU, {len(trajs)} trajectories: |a-b|/|b| "
          f"median {np.median(rel):.2e}, max {rel.max():.2e} (the store keeps float16: about 5e-4)")


def _first_difference(a: list, b: list) -> str:
    """Where two rollouts' trajectories (same ids) first part: how many differ, and the first one's step,
    field and character."""
    differ = [(x, y) for x, y in zip(a, b) if x.to_dict() != y.to_dict()]
    if not differ:
        return "all the same"
    x, y = differ[0]
    for i, (sx, sy) in enumerate(zip(x.steps, y.steps)):
        for f in ("cot", "fn", "obs"):
            u, v = getattr(sx, f), getattr(sy, f)
            if u != v:
                c = next((j for j, (p, q) in enumerate(zip(u, v)) if p != q), min(len(u), len(v)))
                return (f"{len(differ)}/{len(a)} differ; the first, {x.traj_id}, at step {i} {f} char {c}: "
                        f"{u[max(0, c - 20):c + 20]!r} vs {v[max(0, c - 20):c + 20]!r}")
    return f"{len(differ)}/{len(a)} differ; the first, {x.traj_id}: {len(x.steps)} vs {len(y.steps)} steps"


#: rollout variants run twice each (side by side): the code as it is (FlashAttention or the math kernel, see
#: ``_core.attention``), and PyTorch's default kernels, which our forwards would use without that
VARIANTS = {
    "as is": "",
    "torch default": ("import latentsift._core.attention as a, contextlib; "
                      "a.exact_attention = lambda device: contextlib.nullcontext(); "
                      "import latentsift.states.states as s, latentsift.states.online as o; "
                      "s.exact_attention = o.exact_attention = a.exact_attention; "),
}


@part("rollout repeatability on the GPU (one task, K = 4: in this process twice, then fresh processes)")
def rollout_repeat(args) -> None:
    from latentsift.rollout.folder import TRAJECTORIES, sandbox_env
    from latentsift.states.model import load_policy
    from latentsift.rollout.agent import RolloutSettings, rollout_task
    from latentsift.rollout.tasks import load_tasks
    from latentsift.trajectories.trajectory import load_jsonl

    settings = RolloutSettings(k=4, max_turns=2, max_new_tokens=96)
    pol = load_policy(args.model, dtype="auto", device=DEV)
    task = load_tasks()[0]
    run_examples, judge = sandbox_env()
    got = [[r.trajectory for r in rollout_task(pol, task, settings, run_examples, judge, run="r", agent="a",
                                                fingerprint="f")[0]] for _ in range(2)]
    print(f"in this process, twice: {_first_difference(*got)}")
    tmp = Path(tempfile.mkdtemp(prefix="cuda-repeat-"))
    argv = ["rollout", "--model", str(args.model), "--device", DEV, "--tasks", "1", "--k", "4",
            "--max-new-tokens", "96", "--turns", "2"]
    procs = {}
    for name, pre in VARIANTS.items():
        for i in range(2):
            out = tmp / f"{name.replace(' ', '-')}-{i}"
            cli = ["latentsift", *argv, "--out", str(out)]
            code = pre + f"import sys; from latentsift.cli import main; sys.argv = {cli!r}; main()"
            procs[(name, i)] = (out, subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE, text=True))
    for (name, i), (out, p) in procs.items():
        _, err = p.communicate(timeout=900)
        if p.returncode:
            print(f"{name} {i}: failed: {err[-1500:]}")
    for name in VARIANTS:
        outs = [tmp / f"{name.replace(' ', '-')}-{i}" / TRAJECTORIES for i in range(2)]
        if all(o.is_file() for o in outs):
            print(f"{name:14s} two fresh processes: {_first_difference(*(load_jsonl(o) for o in outs))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="local HF model directory or .gguf (default: the embedded SmolLM2)")
    ap.add_argument("--pools", type=Path, default=POOLS, help="canonical trajectory JSONL (.gz allowed)")
    ap.add_argument("--n", type=int, default=256, help="trajectories timed")
    ap.add_argument("--check", type=int, default=12, help="trajectories compared (bytes, CPU agreement)")
    ap.add_argument("--rollout-tasks", type=int, default=2)
    ap.add_argument("--only", help="comma-separated parts to run (facts,pooling,same,agreement,rate,rollout,repeat)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global DEV
    DEV = args.device
    if args.model is None:
        from latentsift.states.model import default_model_path
        args.model = default_model_path()
    if args.child:
        child(args)
        return
    import torch

    if DEV == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/cuda.py needs a CUDA device.")
    from latentsift.states.model import load_policy
    from latentsift.trajectories.trajectory import load_jsonl

    only = set((args.only or "facts,pooling,same,agreement,rate,rollout,repeat").split(","))
    if "facts" in only:
        facts()
    if "pooling" in only:
        pooling()
    t0 = time.perf_counter()
    policies = {d: load_policy(args.model, dtype=d, device=DEV) for d in ("auto", "float32")}
    print(f"\nmodel {args.model.name}: loaded on {DEV} in auto and float32 in {time.perf_counter() - t0:.1f} s; "
          f"auto = {policies['auto'].dtype_choice.dtype} ({policies['auto'].dtype_choice.reason})")
    trajs = load_jsonl(args.pools)
    print(f"{len(trajs)} trajectories in {args.pools}")
    for name, fn in (("same", same_bytes), ("agreement", agreement), ("rate", rate)):
        if name in only:
            fn(args, policies, trajs)
    if "rollout" in only:
        rollout(args)
    if "repeat" in only:
        rollout_repeat(args)


if __name__ == "__main__":
    main()
