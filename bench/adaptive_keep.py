"""Adaptive scores: does a keep rule on the score's value across pools buy verifier calls at equal realized recall?

On the shared SWE-bench Lite pools (the default runs, no label-leaking run, every instance), 4 repository
folds, the label-free rule filters (no bank: no states needed; their calibration is clean as it stands,
the other folds' pools), three score maps of the recall-targeted rule (``latentsift.sift.keep``,
``latentsift.sift.keep_adaptive``):

- rank: the protocol's within-pool normalised rank (the default);
- value: the filter's value across pools (a rule's raw score), keep what reaches the threshold;
- gap: keep what lies within the threshold of the pool's best value.

Printed, per filter and map:

1. the operating points (``protocol.operating.operating_points`` and its ``adaptive`` section): at each
   target R the realized pool recall (pooled over the folds) and the verifier calls per pool, and the
   paired per-pool difference of calls and of recall against the rank map (95% bootstrap over pools);
2. the frontier, which removes the calibration's noise: one threshold swept over all held-out pools,
   the fewest calls per pool at which the realized pool recall reaches 0.8, 0.9 and 0.95 (what each score
   map could buy at equal realized recall, were its threshold known).

And the process CPU time of the whole (the machine may be shared). Writes nothing.

    .venv/bin/python bench/adaptive_keep.py [--data DIR] [--n-boot 1000]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from latentsift.protocol import CLEAN_RUNS
from latentsift.protocol.crossval import CrossvalSettings
from latentsift.protocol.operating import filter_table, filter_values, operating_points
from latentsift.protocol.run import Run
from latentsift.protocol.stage1 import rule_scorers
from latentsift.sift.keep import keep_mask
from latentsift.sift.keep_adaptive import gap_scores
from latentsift.trajectories.importers import import_paths
from latentsift.trajectories.trajectory import group_pools

LEVELS = (0.8, 0.9, 0.95)


def frontier(pools, table, labels, transform=None) -> dict[float, float]:
    """Realized recall level -> the fewest calls per pool of one threshold over every pool reaching it."""
    ids = [sorted(c.traj_id for c in p.candidates) for p in pools]
    sc = [np.array([table[p.instance_id][t] for t in i], dtype=np.float64) for p, i in zip(pools, ids)]
    if transform is not None:
        sc = [transform(x) for x in sc]
    ys = [np.array([labels[t] for t in i]) for i in ids]
    grid = np.unique(np.concatenate([x[np.isfinite(x)] for x in sc]))
    pos = [y.any() for y in ys]
    best = {lv: np.inf for lv in LEVELS}
    for tau in np.append(grid, np.inf):
        calls, hits = 0.0, []
        for i, x, y, p in zip(ids, sc, ys, pos):
            m = keep_mask(x, i, tau)
            calls += m.sum()
            if p:
                hits.append(bool((m & (y == 1)).any()))
        rec, c = float(np.mean(hits)), calls / len(ids)
        for lv in LEVELS:
            if rec >= lv:
                best[lv] = min(best[lv], c)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "datasets" /
                                          "swebench-lite-pools"))
    ap.add_argument("--n-boot", type=int, default=1000)
    a = ap.parse_args()
    t0 = time.process_time()
    d = Path(a.data)
    res = import_paths([d / "r2egym", d / "sweagent"], labels=d / "candidates.csv")
    trajs = [t for t in res.trajectories if t.run in CLEAN_RUNS]
    pools = group_pools(trajs)
    labels = {t.traj_id: int(t.label) for t in trajs}
    s = CrossvalSettings(pools="-", states="-", out="-", n_folds=4, variants=False, agent_transfer=False,
                         n_boot=a.n_boot, ks=(3,), target_recalls=(0.9, 0.95))
    run = Run(s, log=lambda m: None)
    folds = run.folds(trajs)
    filters = rule_scorers(pools, seed=s.seed)
    t1 = time.process_time()
    op = operating_points(run, trajs, folds, filters, None, targets=(0.8, 0.9, 0.95))
    t2 = time.process_time()
    print(f"{len(pools)} pools, {sum(any(c.label == 1 for c in p.candidates) for p in pools)} with a resolved "
          f"candidate, 4 repository folds; CPU: import {t1 - t0:.1f} s, operating points with the adaptive maps "
          f"{t2 - t1:.1f} s")
    fmt = (lambda d: f"{d['mean']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]")
    print(f"m = {op['adaptive']['multiplicity']['m']} comparisons, Bonferroni level "
          f"{100 * op['adaptive']['multiplicity']['level']:.2f}%")
    print("\n1. operating points (calibrated on the other folds): realized recall / calls per pool; "
          "difference against the rank map: calls, recall")
    for name in filters:
        e, ad = op["filters"][name], op["adaptive"]["filters"].get(name, {})
        for r in ("0.8", "0.9", "0.95"):
            row = e["targets"][r]
            cells = [f"rank {row['realized_recall']['pooled']['mean']:.3f} / {row['verifier_calls']['mean']:.2f}"]
            for mp, rows in ad.items():
                x = rows[r]
                d = x["difference_vs_rank"]
                cells.append(f"{mp} {x['realized_recall']['mean']:.3f} / {x['verifier_calls']['mean']:.2f} "
                             f"(calls {fmt(d['verifier_calls'])}, Bonferroni {fmt(d['verifier_calls_adjusted'])}, "
                             f"recall {fmt(d['realized_recall'])})")
            print(f"  {name:15s} R={r:4s} " + "; ".join(cells))
    print("\n2. frontier (one threshold over all held-out pools): fewest calls per pool at realized recall >= "
          + ", ".join(f"{lv:g}" for lv in LEVELS))
    for name, filt in filters.items():
        rank, val = filter_table(filt, pools), filter_values(filt, pools)
        for mp, tab, tr in (("rank", rank, None), ("value", val, None), ("gap", val, gap_scores)):
            b = frontier(pools, tab, labels, tr)
            print(f"  {name:15s} {mp:5s} " + "  ".join(f"{b[lv]:.2f}" for lv in LEVELS))
    print(f"\nCPU time in all: {time.process_time() - t0:.1f} s")


if __name__ == "__main__":
    main()
