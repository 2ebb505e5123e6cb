"""Per-run cost of the sandbox's label (``execution.label``: one candidate against its hidden test),
this checkout's code against a baseline commit's, side by side in one run:

    .venv/bin/python bench/sandbox.py [--tasks 20] [--rounds 3] [--baseline e7d4d80]

The workload: the reference solutions of HumanEval's first ``--tasks`` tasks, labelled one at a time
(one worker). Each run is timed around the whole call (the temporary folder, ``unshare``, the
confinement, the program and the test, the clean-up). The baseline runs the same workload in a
subprocess on that commit's ``src`` (``git archive``), rounds alternating with this code's, so that
the machine's load falls on both alike. Printed: the median seconds per run of each, and their
ratio (the acceptance of issue 65: within 1.2 of the baseline's).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The workload, run as a script (here, or in a subprocess on the baseline's ``src``): one line of JSON,
#: the seconds of each run.
WORKLOAD = """
import json, sys, time
from latentsift.rollout.execution import label
from latentsift.rollout.tasks import load_tasks
tasks = load_tasks(check=False)[:int(sys.argv[1])]
label(tasks[0], tasks[0].canonical_solution)  # warm: the isolation probe, the page cache
seconds = []
for task in tasks:
    t0 = time.perf_counter()
    r = label(task, task.canonical_solution)
    seconds.append(time.perf_counter() - t0)
    assert r.passed, (task.task_id, r)
print(json.dumps(seconds))
"""


def run_workload(src: Path, n_tasks: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", WORKLOAD, str(n_tasks)], env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def baseline_src(commit: str, into: Path) -> Path:
    """``commit``'s ``src`` folder, unpacked under ``into``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default="e7d4d80", help="the commit to compare with ('' for none)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="latentsift-bench-") as tmp:
        old_src = baseline_src(args.baseline, Path(tmp)) if args.baseline else None
        now, old = [], []
        for _ in range(args.rounds):
            now += run_workload(ROOT / "src", args.tasks)
            if old_src is not None:
                old += run_workload(old_src, args.tasks)
    med = statistics.median(now)
    print(f"this code: median {med:.3f} s per label run ({len(now)} runs, {args.rounds} rounds of {args.tasks})")
    if old:
        base = statistics.median(old)
        print(f"{args.baseline}: median {base:.3f} s per label run ({len(old)} runs)")
        print(f"ratio {med / base:.2f} (this code / {args.baseline})")
    print(f"({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
