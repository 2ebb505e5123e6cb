"""Size of the explorer site for the default reproduce run's pools (budget: under 25 MB).

    .venv/bin/python bench/explore_size.py [--data DIR] [--out DIR]

Uses the real pools of the default run (``ReproduceSettings`` defaults: every instance with a
resolved candidate + the unresolved sample) and the real retained sets of the length baselines,
with no model: the per-candidate scores come from the shortest-chars filter. Evidence needs the
model, so a size bound stands in for it: every candidate gets 9 evidence entries (3 per channel,
the filter's default) on its 9 longest steps, each pointing at the two longest steps of other
trajectories as its nearest bank steps, which keeps the longest texts the budgets allow. Prints
the site's size by part, and the same site without evidence, measured in one run.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "LATENTSIFT_DATA", ROOT.parent / "shared" / "datasets" / "swebench-lite-pools")))
    ap.add_argument("--out", type=Path, default=None, help="keep the site here (default: a temporary folder)")
    args = ap.parse_args()
    from latentsift.report.explore import Limits, write_site
    from latentsift.trajectories.importers import import_paths
    from latentsift.protocol import ReproduceSettings, select_trajectories
    from latentsift.sift.rules import make_baseline
    from latentsift.trajectories.trajectory import group_pools

    res = import_paths([args.data / "r2egym", args.data / "sweagent"], labels=args.data / "candidates.csv")
    trajs, _ = select_trajectories(res.trajectories, ReproduceSettings(data=str(args.data), out="unused"))
    pools = group_pools(trajs)
    kept = {}
    for name in ("shortest-chars", "fewest-steps", "random"):
        results = make_baseline(name).score_pools(pools)
        kept[name] = {r.instance_id: r.retained for r in results}
        if name == "shortest-chars":
            detail = {"method": name, "settings": {}, "pools": [r.to_dict() for r in results]}
    longest = sorted(((len(s.cot) + len(s.obs) + len(s.fn), t.traj_id, i) for t in trajs
                      for i, s in enumerate(t.steps)), reverse=True)
    for p in detail["pools"]:
        for c in p["candidates"]:
            t = next(x for x in trajs if x.traj_id == c["traj_id"])
            steps = sorted(range(t.n_steps), key=lambda i: -len(t.steps[i].obs))[:9]
            others = [x for x in longest[:50] if x[1] != t.traj_id][:2]
            c["evidence"] = [{"channel": ("cot", "obs", "fn")[j % 3], "step": s, "evidence": 0.1, "contribution": 0.01,
                              "d_pos": 1.0, "d_neg": 1.1, "pos_traj": others[0][1], "pos_step": others[0][2],
                              "neg_traj": others[1][1], "neg_step": others[1][2]} for j, s in enumerate(steps)]
    n_chars = sum(t.n_chars + len(t.task_prompt) + len(t.patch) for t in trajs)
    print(f"default run: {len({t.instance_id for t in trajs})} instances, {len(trajs)} candidates, "
          f"{n_chars / 1e6:.1f} M characters of trajectory text")
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or Path(tmp)
        rows = []
        for label, limits, det in (("default budgets", Limits(), detail),
                                   ("no evidence", Limits(), {**detail, "pools": [
                                       {**p, "candidates": [{**c, "evidence": []} for c in p["candidates"]]}
                                       for p in detail["pools"]]})):
            t0 = time.perf_counter()
            index = write_site(base / label.replace(" ", "-"), trajs, detail=det, kept=kept, limits=limits)
            dt = time.perf_counter() - t0
            site = index.parent
            rows.append((label, _size(site), _size(site / "instances"), _size(site / "static"), dt))
        print(f"{'site':<16}{'total MB':>10}{'instances/ MB':>15}{'static/ MB':>12}{'write s':>9}")
        for label, tot, inst, st, dt in rows:
            print(f"{label:<16}{tot / 1e6:>10.2f}{inst / 1e6:>15.2f}{st / 1e6:>12.2f}{dt:>9.1f}")
        print(f"budget: 25 MB -> default {'OK' if rows[0][1] < 25e6 else 'OVER'}; the text budgets "
              f"(Limits()) keep the pages at {rows[0][2] / n_chars:.2f} bytes per character of trajectory text; "
              f"evidence (size bound) adds {(rows[0][1] - rows[1][1]) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
