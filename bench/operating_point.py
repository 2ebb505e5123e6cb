"""Wall time of ``filter --target-recall`` with a saved operating point against today's refit, side by side.

Synthetic states (``--layers`` layers of width ``--width``, 3 steps per candidate, 4 candidates per pool):
a sifter fitted on ``--bank`` pools, a calibration file of ``--cal`` pools, ``--pools`` pools to filter.
``latentsift fit --target-recall 0.9 --calibration CAL`` saves the operating point beside the sifter
(timed once). Then, alternating, ``repeats`` times each (in-process, through the command line):

- refit: ``filter --sifter S --target-recall 0.9 --calibration CAL`` (scores the calibration pools,
  fits the calibration map and the threshold, then filters);
- saved: ``filter --sifter S --target-recall 0.9`` (reads SIFTER_DIR/operating_point.json, filters).

Printed: best and median wall time of each, their ratio, and whether the two kept the same candidates.
Writes only into a temporary folder, removed at the end.

    .venv/bin/python bench/operating_point.py [--cal 200] [--pools 20] [--bank 200] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from latentsift.cli import app
from latentsift.states.model import Fingerprint
from latentsift.states.states import TrajectoryStates
from latentsift.states.store import StateStore
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS, Step, Trajectory, save_jsonl


def write_inputs(d: Path, n: dict[str, int], layers: int, width: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    direction = np.linspace(-1, 1, width).astype(np.float32)
    fp = Fingerprint("BenchArch", layers, width, "tok", "tpl", "w", "float32")
    store = StateStore(d / "states").create(fp, {"layers": list(range(1, layers + 1)), "store_dtype": "float32"})
    for name, count in n.items():
        trajs, states = [], []
        for i in range(count):
            q = rng.standard_normal(4)
            y = (rng.random(4) < 1 / (1 + np.exp(-(2 * q - 0.5)))).astype(int)
            if name != "pools" and y.sum() in (0, 4):
                y[:2] = [1, 0]
            for j in range(4):
                tid = f"a{j}/{name}__{i}"
                steps = [t for t in range(3) for _ in CHANNELS]
                chans = [CHANNEL_ID[c] for _ in range(3) for c in CHANNELS]
                x = 0.3 * rng.standard_normal((len(steps), layers, width)).astype(np.float32)
                x += np.float32(0.08 * q[j] + 0.04 * (2 * y[j] - 1)) * direction
                states.append(TrajectoryStates(tid, x, np.array(steps, np.int32), np.array(chans, np.int8),
                                               n_tokens=150))
                trajs.append(Trajectory(traj_id=tid, instance_id=f"{name}__{i}", repo=f"org/{name}{i % 5}",
                                        task_prompt="fix it", reward=float(y[j]), agent="acr",
                                        steps=[Step(cot="think " * (s + 1 + j), fn=f"cmd{s}", obs="out")
                                               for s in range(3)]))
        store.write(states, [t.instance_id for t in trajs])
        save_jsonl(trajs, d / f"{name}.jsonl")


def cli(*args) -> float:
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exit_code != 0:
        raise SystemExit(r.output)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cal", type=int, default=200)
    ap.add_argument("--pools", type=int, default=20)
    ap.add_argument("--bank", type=int, default=200)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_inputs(d, {"bank": a.bank, "cal": a.cal, "pools": a.pools}, a.layers, a.width)
        t_fit = cli("fit", d / "bank.jsonl", "--states", d / "states", "--out", d / "sifter", "--scorer-epochs", "3",
                    "--target-recall", "0.9", "--calibration", d / "cal.jsonl")
        base = ["filter", d / "pools.jsonl", "--states", d / "states", "--sifter", d / "sifter", "--target-recall",
                "0.9", "--on-shift", "warn", "--show", "0"]
        times: dict[str, list[float]] = {"refit": [], "saved": []}
        for i in range(a.repeats):
            for mode in ("refit", "saved"):
                extra = ["--calibration", d / "cal.jsonl"] if mode == "refit" else []
                times[mode].append(cli(*base, *extra, "--out", d / f"{mode}-{i}.json"))
        kept = {m: [p["retained"] for p in json.loads((d / f"{m}-0.json").read_text())["pools"]] for m in times}
        print(f"fit with --target-recall (sifter + operating point): {t_fit:.2f} s")
        print(f"| filter ({a.pools} pools; calibration {a.cal} pools) | best s | median s |")
        print("| --- | ---: | ---: |")
        for m, ts in times.items():
            print(f"| {m} | {min(ts):.3f} | {statistics.median(ts):.3f} |")
        print(f"refit / saved (best): {min(times['refit']) / min(times['saved']):.2f}x; "
              f"same candidates kept: {kept['refit'] == kept['saved']}")


if __name__ == "__main__":
    main()
