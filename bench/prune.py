"""Cost of the early-pruning evaluation that ``reproduce`` adds, and the Pruner's per-step latency.

On the real shared pools: the ``--instances`` first instances of the default selection (hash order,
as ``reproduce --max-instances``), states extracted with the demo's settings into ``--out``
(cached; not timed), one fold (the repository with most candidates evaluated, the others as the
bank; a small selection rarely has resolved candidates in every fold of a k-fold split), its bank and scorers fitted and cached first (``reproduce`` has them
already when the pruning block runs; not timed). Then, timed side by side in this run:

- token counting (policy tokenizer over every step; cached by reproduce after the first run);
- ``reproduce_pruning`` (every policy, both schedules, every threshold, in-bank threshold choice
  with the inner-fold fits) without the cascade's Best@K column (needs the EF verifier);
- the Stage-1 filter alone on the same pools (``LatentSift.prepare_many``), as a yardstick;
- ``Pruner.step`` at a checkpoint on one pool of K candidates (LatentSift with fold 0's bank and
  scorer), the online per-step latency.

The per-trajectory cost is scaled to the default demo's number of trajectories (printed).

    PYTHONPATH=src .venv/bin/python bench/prune.py --instances 8
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
                                          / "swebench-lite-pools"))
    ap.add_argument("--out", default="runs/bench-prune")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="Pruner.step repetitions")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    from latentsift.protocol import reproduce_pruning
    from latentsift.sift.prune import Pruner, step_tokens
    from latentsift.protocol import ReproduceSettings, prepare_run, select_trajectories
    from latentsift.sift.sift import LatentSift
    from latentsift.trajectories.trajectory import group_pools

    s = ReproduceSettings(data=a.data, out=a.out, max_instances=a.instances)
    run, trajs, policy, store = prepare_run(s, log=lambda m: None)
    states = store.load([t.traj_id for t in trajs])
    # one fold: the repository with the most candidates is evaluated, the others form the bank (a small
    # selection rarely has resolved candidates in every fold of a k-fold split)
    repos = sorted({t.repo for t in trajs}, key=lambda r: (-sum(t.repo == r for t in trajs), r))
    folds = [(repos[1:], repos[:1])]
    fitted = {}
    for k, (bank_repos, eval_repos) in enumerate(folds):
        bank_trajs = [t for t in trajs if t.repo in set(bank_repos)]
        fitted[k] = run.fit_fold(k, bank_trajs, states, store.fingerprint, {}, "paper")
    n_states = sum(st.n_spans for st in states.values())
    demo_n = len(select_trajectories(
        __import__("latentsift.trajectories.importers", fromlist=["import_paths"]).import_paths(
            [Path(a.data) / "r2egym", Path(a.data) / "sweagent"], labels=Path(a.data) / "candidates.csv").trajectories,
        ReproduceSettings(data=a.data, out="x"))[0])
    print(f"{len(trajs)} trajectories, {len({t.instance_id for t in trajs})} instances, {n_states} span states, "
          f"{len(folds)} folds; torch threads {a.threads}; default demo: {demo_n} trajectories")

    t0 = time.perf_counter()
    step_tokens(trajs, policy.tokenizer)
    t_tok = time.perf_counter() - t0
    import shutil
    for d in run.out.glob("folds/fold-*/prune-inner-*"):  # the first run fits the inner banks and scorers
        shutil.rmtree(d)
    (run.out / "prune" / "tokens.json").unlink(missing_ok=True)
    t0 = time.perf_counter()
    res = reproduce_pruning(run, trajs, store, policy.tokenizer, folds)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    reproduce_pruning(run, trajs, store, policy.tokenizer, folds)
    t_cached = time.perf_counter() - t0
    t0 = time.perf_counter()
    pools = group_pools(trajs)
    for k, (_, eval_repos) in enumerate(folds):
        ev = [p for p in pools if p.candidates[0].repo in set(eval_repos)]
        if ev:
            LatentSift(*fitted[k], n_evidence=0).prepare_many(ev, states, fingerprint=store.fingerprint)
    t_stage1 = time.perf_counter() - t0
    print(f"token counting:                    {t_tok:7.2f} s")
    print(f"reproduce_pruning, first run:      {t_first:7.2f} s (token counts, inner fits, evaluation; "
          f"{len(res['rows'])} rows)")
    print(f"reproduce_pruning, cached rerun:   {t_cached:7.2f} s (token counts and inner fits from the cache)")
    print(f"Stage-1 LatentSift alone (yardstick): {t_stage1:5.2f} s  -> pruning / Stage 1 = {t_cached / t_stage1:.1f}x")
    scale = demo_n / len(trajs)
    print(f"scaled to the default demo ({scale:.1f}x the trajectories; linear estimate): first run "
          f"~{t_first * scale:.0f} s, cached ~{t_cached * scale:.0f} s")

    # online: Pruner.step on one pool of the first fold with evaluation pools
    k, (_, eval_repos) = next((k, f) for k, f in enumerate(folds)
                              if any(p.candidates[0].repo in set(f[1]) for p in pools))
    pool = max((p for p in pools if p.candidates[0].repo in set(eval_repos)), key=lambda p: p.k)
    filt = LatentSift(*fitted[k])
    lat = []
    for _ in range(a.repeat):
        pr = Pruner(filt, [c.traj_id for c in pool.candidates], checkpoints=(4,), instance_id=pool.instance_id,
                    fingerprint=store.fingerprint)
        for c in pool.candidates:
            pr.update(c.traj_id, states[c.traj_id])
        t0 = time.perf_counter()
        pr.step(4)
        lat.append(time.perf_counter() - t0)
    n_bank = sum(v for c in fitted[k][0].state_counts().values() for v in c.values())
    print(f"Pruner.step at a checkpoint, K={pool.k}, bank of {n_bank} states: "
          f"median {1000 * float(np.median(lat)):.1f} ms over {a.repeat}")
    print(res["verdict"]["sentence"])


if __name__ == "__main__":
    main()
