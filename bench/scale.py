"""Benchmark of the Ray scale-out, in one run, side by side:

1. extraction tokens/s: single process vs Ray with 1 and 2 workers (the packaged SmolLM2, real
   trajectories, 1 torch thread per process, float32 store);
2. exact search of one K=16 pool's queries against 1M and 4M synthetic bank states: the
   single-process blocked GEMM (``knn.nearest_distances``, the floor) vs 1 and 2 Ray bank shards;
3. approximate FAISS search (IVF, HNSW) at 1M states: recall@1 and queries/s against exact search.

    .venv/bin/python bench/scale.py [--n 16] [--max-tokens 1024] [--d 256] [--sizes 1000000,4000000]
                                    [--queries 512] [--approx ivf,hnsw]

Synthetic bank states are a mixture of Gaussians (``--d`` wide, 4 bytes a value: 4M x 256 = 4 GiB;
the driver's array and the shards' copies in Ray's object store must both fit). CPU only here;
pass ``--device cuda`` on a GPU machine for the extraction part.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DATA = Path(os.environ.get("LATENTSIFT_DATA", ROOT.parent / "shared" / "datasets" / "swebench-lite-pools"))


def bench_extract(args, ray) -> None:
    import torch

    from latentsift.trajectories.importers import import_paths
    from latentsift.states.model import load_policy
    from latentsift.states.extract import extract_pools
    from latentsift.scale import RayBackend

    torch.set_num_threads(1)
    trajs = import_paths(DATA / "r2egym" / "acr-run-1.jsonl.gz").trajectories[:args.n]
    kw = dict(max_tokens=args.max_tokens, max_span_tokens=args.max_span_tokens, store_dtype="float32", shard_size=1)
    pol = load_policy(args.model, dtype="float32", device=args.device)
    print(f"== extraction: {len(trajs)} trajectories, max_tokens={args.max_tokens}, {pol.describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        rep = extract_pools(pol, trajs, Path(tmp) / "single", **kw)
        print(f"single process        {rep.n_tokens:7,d} tokens  {rep.seconds:6.1f} s  {rep.tokens_per_s:8,.0f} tok/s")
        base = rep.tokens_per_s
        for w in (1, 2):
            start = []
            backend = RayBackend(args.model, workers=w, dtype="float32", device=args.device, cpus_per_worker=0.9,
                                 gpus_per_worker=args.gpus)
            rep = extract_pools(backend, trajs, Path(tmp) / f"ray{w}",
                                progress=lambda p: start.append(p.elapsed) if p.done == 0 else None, **kw)
            steady = rep.n_tokens / (rep.seconds - start[0])
            print(f"ray, {w} worker(s)      {rep.n_tokens:7,d} tokens  {rep.seconds:6.1f} s  "
                  f"{steady:8,.0f} tok/s after the workers loaded the model ({steady / base:.2f}x single; "
                  f"{start[0]:.1f} s start-up, {rep.tokens_per_s:,.0f} tok/s with it)")


def synthetic(n: int, d: int, seed: int, centers: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, d), np.float32)
    step = 1 << 18
    for a in range(0, n, step):
        m = min(step, n - a)
        out[a:a + m] = centers[rng.integers(0, len(centers), m)]
        out[a:a + m] += 0.5 * rng.standard_normal((m, d), dtype=np.float32)
    return out


def bench_bank(args, ray) -> None:
    import torch

    from latentsift.bank.knn import bank_sqnorms, nearest_distances
    from latentsift.scale.bank import BankShard, _bounds, merge_nearest

    torch.set_num_threads(1)
    d = args.d
    centers = np.random.default_rng(0).standard_normal((256, d)).astype(np.float32)
    q = synthetic(args.queries, d, 99, centers)
    print(f"== exact search: one K=16 pool = {args.queries} query states of d={d} (1 torch thread per process)")
    for n in args.sizes:
        bank = synthetic(n, d, n, centers)
        sq = bank_sqnorms(bank)
        nearest_distances(q[:8], bank[:100000], sqnorms=sq[:100000], validate_bank=False)  # warm-up
        t0 = time.perf_counter()
        D0, I0 = nearest_distances(q, bank, return_index=True, sqnorms=sq, validate_bank=False)
        floor = time.perf_counter() - t0
        print(f"{n:>9,d} states  single-process GEMM floor  {floor:7.2f} s  "
              f"({2 * n * d * len(q) / floor / 1e9:5.1f} GFLOP/s)")
        for k in (1, 2):
            refs = [ray.put({("pos", "cot"): (bank[a:b], a)}) for a, b in _bounds(n, k)]
            actors = [ray.remote(BankShard).options(num_cpus=0.9).remote(r, 1) for r in refs]
            ray.get([a.search.remote(("pos", "cot"), q[:8]) for a in actors])  # loaded and warm
            t0 = time.perf_counter()
            D, I = merge_nearest(ray.get([a.search.remote(("pos", "cot"), q) for a in actors]))
            t = time.perf_counter() - t0
            same = np.array_equal(D, D0) and np.array_equal(I, I0)
            print(f"{n:>9,d} states  ray, {k} shard(s)            {t:7.2f} s  ({floor / t:.2f}x floor; "
                  f"same distances and rows: {same})")
            for a in actors:
                ray.kill(a)
            del refs, actors
        if n == args.approx_size and args.approx:
            bench_approx(args, bank, q, D0, I0)
        del bank, sq


def bench_approx(args, bank, q, D0, I0) -> None:
    from latentsift.scale.approx import build_index, recall_at_1, search

    n = len(bank)
    for kind in args.approx:
        t0 = time.perf_counter()
        index = build_index(bank, kind, **({"nlist": args.nlist} if kind == "ivf" else {"hnsw_m": args.hnsw_m}))
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        D, I = search(index, bank, q)
        t = time.perf_counter() - t0
        par = f"nlist={args.nlist}, nprobe=16" if kind == "ivf" else f"M={args.hnsw_m}, efSearch=64"
        print(f"{n:>9,d} states  approx {kind:4s} {par} (build {build:6.1f} s)  recall@1 {recall_at_1(I, I0, D0, D):.3f}  "
              f"{len(q) / t:9,.0f} queries/s  (exact floor: see above)")
        del index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--max-span-tokens", type=int, default=32)
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gpus", type=float, default=0)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--sizes", default="1000000,4000000")
    ap.add_argument("--queries", type=int, default=512)
    ap.add_argument("--approx", default="ivf,hnsw")
    ap.add_argument("--approx-size", type=int, default=1000000)
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--hnsw-m", type=int, default=16)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: extract, bank")
    args = ap.parse_args()
    args.sizes = [int(float(x)) for x in args.sizes.split(",")]
    args.approx = [x for x in args.approx.split(",") if x]
    from latentsift.scale import connect

    ray = connect("local", num_cpus=os.cpu_count())
    print(f"Ray {ray.__version__}, local cluster of {os.cpu_count()} CPUs (loopback)")
    if "extract" not in args.skip:
        bench_extract(args, ray)
    if "bank" not in args.skip:
        bench_bank(args, ray)
    ray.shutdown()


if __name__ == "__main__":
    main()
