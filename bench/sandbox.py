"""Per-run cost of the sandbox's label (``execution.label``: one candidate against its hidden test),
this checkout's code against a baseline commit's, side by side in one run:

    .venv/bin/python bench/sandbox.py [--tasks 20] [--rounds 3] [--baseline e7d4d80]

The workload: the reference solutions of HumanEval's first ``--tasks`` tasks, labelled one at a time.
Each run is timed around the whole call (the temporary folder, ``unshare``, the confinement, the
program and the test, the clean-up). The baseline's code runs in a second worker process on that
commit's ``src`` (``git archive``); each task is labelled by one worker right after the other, so
that the machine's load (a shared machine's) falls on both alike. Printed: the median seconds per run of each, and their
ratio (the acceptance of issue 65: within 1.2 of the baseline's).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The worker, run as a script on one ``src``: after a warm-up it reads a task index per line of
#: stdin, labels that task's reference and prints the seconds of the whole call.
WORKER = """
import sys, time
from latentsift.rollout.execution import label
from latentsift.rollout.tasks import load_tasks
tasks = load_tasks(check=False)
label(tasks[0], tasks[0].canonical_solution)  # warm: the isolation probe, the page cache
print("ready", flush=True)
for line in sys.stdin:
    task = tasks[int(line)]
    t0 = time.perf_counter()
    r = label(task, task.canonical_solution)
    print(time.perf_counter() - t0 if r.passed else f"not passed {task.task_id}: {r}", flush=True)
"""


def start_worker(src: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WORKER], env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def one_run(proc: subprocess.Popen, index: int) -> float:
    proc.stdin.write(f"{index}\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


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
        workers = {"now": start_worker(ROOT / "src")}
        if args.baseline:
            workers["old"] = start_worker(baseline_src(args.baseline, Path(tmp)))
        times: dict[str, list[float]] = {k: [] for k in workers}
        for _ in range(args.rounds):
            for index in range(args.tasks):
                for name, proc in workers.items():  # the same task on each, one right after the other
                    times[name].append(one_run(proc, index))
        for proc in workers.values():
            proc.stdin.close()
            proc.wait()
    now, old = times["now"], times.get("old", [])
    med = statistics.median(now)
    print(f"this code: median {med:.3f} s per label run ({len(now)} runs: {args.rounds} rounds of {args.tasks} tasks)")
    if old:
        base = statistics.median(old)
        print(f"{args.baseline}: median {base:.3f} s per label run ({len(old)} runs)")
        print(f"ratio {med / base:.2f} (this code / {args.baseline})")
    print(f"({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
