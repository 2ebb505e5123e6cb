"""Throughput of nearest_distances vs a plain torch.matmul of the same shape, measured side by side.

Prints achieved GFLOP/s (2 * n_q * n_b * d flops for the product), the ratio, and peak memory
(resident set growth) of the blocked search. Target: ratio >= 0.9 on all threads with peak memory < 2 GiB.
The search shares fixed one-thread blocks among the caller's torch threads (results independent of the
thread count); it is compared with the matmul on all threads, and at one thread with a one-thread matmul.
Timings interleave the two (load from other processes hits both alike); best of --repeats.
Usage: python bench/knn.py [--nq 2000] [--nb 100000] [--d 576] [--repeats 3]
"""
from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from latentsift import nearest_distances


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nq", type=int, default=2000)
    ap.add_argument("--nb", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=576)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((a.nq, a.d), dtype=np.float32)
    b = rng.standard_normal((a.nb, a.d), dtype=np.float32)
    flops = 2.0 * a.nq * a.nb * a.d
    print(f"threads={torch.get_num_threads()} queries={a.nq} bank={a.nb} d={a.d}")

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    nearest_distances(q[:64], b)  # warm-up
    best_of(lambda: nearest_distances(q, b), 1)
    rss_knn = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Q, B = torch.from_numpy(q), torch.from_numpy(b)
    torch.matmul(Q[:64], B.T)
    n = torch.get_num_threads()
    pairs = {n: ([], []), 1: ([], [])}
    for _ in range(a.repeats):  # interleaved
        for m, (tk, tm) in pairs.items():
            torch.set_num_threads(m)
            tk.append(best_of(lambda: nearest_distances(q, b), 1))
            tm.append(best_of(lambda: torch.matmul(Q, B.T), 1))  # materialises the full n_q x n_b output
    torch.set_num_threads(n)
    for m, (tk, tm) in pairs.items():
        g_knn, g_mm = flops / min(tk) / 1e9, flops / min(tm) / 1e9
        print(f"-- {m} thread(s)")
        print(f"nearest_distances : {min(tk):8.3f} s  {g_knn:8.1f} GFLOP/s")
        print(f"torch.matmul      : {min(tm):8.3f} s  {g_mm:8.1f} GFLOP/s")
        print(f"ratio knn/matmul  : {g_knn / g_mm:8.3f}  (target >= 0.9)")
    inputs = (q.nbytes + b.nbytes) / 2**30
    print(f"peak RSS growth during nearest_distances: {(rss_knn - rss0) / 2**20:.2f} GiB "
          f"(inputs {inputs:.2f} GiB held by the caller; target < 2 GiB)")


if __name__ == "__main__":
    main()
