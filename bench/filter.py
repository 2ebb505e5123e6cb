"""Wall time of the Stage-1 filter on one K = 16 pool against banks of 10k, 100k and 1M states.

Random data (d = 576, the packaged model's width): each candidate has ``--steps`` steps with a
cot, obs and fn state each, so one channel has K x steps query states. A bank of N states holds N
states per channel, half positive and half negative. To keep memory at one bank's worth, the three
channels share the same random matrices (the work is the same as with three different ones).

The floor is the pure GEMM of the same shapes, measured in the same run: for every channel and
both classes, ``torch.matmul(queries, bank_block.T, out=buf)`` over the bank in the blocks the
filter uses (no norms, no minimum, no margins). The filter's time is ``LatentSift.score`` with the
distance branch only (``--with-scorer`` adds the learned head on 30-layer span states).

    .venv/bin/python bench/filter.py                  # 10k, 100k, 1M
    .venv/bin/python bench/filter.py --sizes 10000,100000 --repeat 3
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from latentsift.bank.bank import Bank
from latentsift.bank.knn import nearest_distances
from latentsift.states.model import Fingerprint
from latentsift.sift.scorer import LinearScorer
from latentsift.sift.sift import LatentSift
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNELS, Pool, Step, Trajectory

D_MODEL = 576
N_LAYERS = 30


def make_candidates(k: int, steps: int, layers: int, rng) -> tuple[Pool, dict[str, TrajectoryStates]]:
    states, cands = {}, []
    for i in range(k):
        t = f"bench/cand-{i:02d}"
        n = steps * len(CHANNELS)
        states[t] = TrajectoryStates(t, rng.standard_normal((n, layers, D_MODEL), dtype=np.float32),
                                     np.repeat(np.arange(steps, dtype=np.int32), len(CHANNELS)),
                                     np.tile(np.arange(len(CHANNELS), dtype=np.int8), steps), n_tokens=1000)
        cands.append(Trajectory(traj_id=t, instance_id="bench__pool", repo="bench/eval", task_prompt="",
                                steps=[Step(cot="c", fn="f", obs="o") for _ in range(steps)]))
    return Pool("bench__pool", cands), states


def make_bank(n_states: int, fp: Fingerprint, rng) -> Bank:
    """A fitted Bank whose per-channel matrices are random (n_states / 2 per class, shared by channels)."""
    tiny = {f"b{y}": TrajectoryStates(f"b{y}", np.zeros((3, 1, D_MODEL), np.float32), np.zeros(3, np.int32),
                                      np.arange(3, dtype=np.int8)) for y in (0, 1)}
    bank = Bank().fit(tiny, {"b0": 0, "b1": 1}, {"b0": "i0", "b1": "i1"}, {"b0": "r", "b1": "r"}, fp)
    half = n_states // 2
    for cls in ("pos", "neg"):
        rows = rng.standard_normal((half, D_MODEL), dtype=np.float32)
        owner = np.full(half, 1 if cls == "pos" else 0, np.int32)
        step = np.zeros(half, np.int32)
        setattr(bank, f"{cls}_", {c: rows for c in CHANNELS})
        setattr(bank, f"{cls}_owner_", {c: owner for c in CHANNELS})
        setattr(bank, f"{cls}_step_", {c: step for c in CHANNELS})
    return bank


def gemm_floor(queries: np.ndarray, bank: Bank, block_b: int = 16384) -> float:
    """Seconds of the bare GEMMs queries x bank^T (every channel, both classes), blocked like knn."""
    Q = torch.from_numpy(queries)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for c in CHANNELS:
            for B in (torch.from_numpy(bank.pos_[c]), torch.from_numpy(bank.neg_[c])):
                buf = torch.empty(Q.shape[0], min(block_b, B.shape[0]))
                for j in range(0, B.shape[0], block_b):
                    bj = B[j:j + block_b]
                    torch.matmul(Q, bj.T, out=buf[:, :bj.shape[0]])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="bank sizes (states per channel)")
    ap.add_argument("--k", type=int, default=16, help="candidates in the pool")
    ap.add_argument("--steps", type=int, default=50, help="steps per candidate")
    ap.add_argument("--repeat", type=int, default=2, help="timed repetitions (best kept)")
    ap.add_argument("--with-scorer", action="store_true", help="also time the fused filter with the scorer")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    fp = Fingerprint("bench", N_LAYERS, D_MODEL, "t", "t", "w", "float32")
    layers = N_LAYERS if args.with_scorer else 1
    pool, states = make_candidates(args.k, args.steps, layers, rng)
    q = np.concatenate([s.distance_states()[s.channel == 0] for s in states.values()])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; pool K={args.k}, {args.steps} steps, "
          f"{q.shape[0]} query states per channel, d={D_MODEL}")
    scorer = None
    if args.with_scorer:
        scorer = LinearScorer(max_epochs=1).fit(list(states.values()), {t: i % 2 for i, t in enumerate(states)},
                                                fingerprint=fp)
    print(f"{'bank states':>12} {'filter s':>10} {'GEMM floor s':>13} {'ratio':>7}")
    for n in [int(x) for x in args.sizes.split(",")]:
        bank = make_bank(n, fp, rng)
        sift = LatentSift(bank, scorer, branches="both" if scorer else "distance")
        nearest_distances(q[:8], bank.pos_["cot"][:1024])  # warm-up
        t_f, t_g = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = sift.score(pool, states, fingerprint=fp)
            t_f.append(time.perf_counter() - t0)
            t_g.append(gemm_floor(q, bank))
        assert res.n_keep == 8
        f, g = min(t_f), min(t_g)
        print(f"{n:>12,} {f:>10.3f} {g:>13.3f} {f / g:>7.2f}x", flush=True)
        del bank, sift


if __name__ == "__main__":
    main()
