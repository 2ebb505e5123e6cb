"""The demo's stages over extraction's time, in one run each, for this code and a base commit side by side.

    .venv/bin/python bench/stages.py [--instances 24] [--full] [--base e7d4d80] [--rounds 1] [--keep]

Runs ``latentsift reproduce`` as the demo does (``make demo``: the shared SWE-bench Lite pools, the default
settings) into a fresh folder per run, so that every stage runs cold (extraction, the EF verifier and the
fold fits included; the model's files and the ``dtype="auto"`` choice stay cached between runs), on the
``--instances`` first instances of the default selection (hash order, ``reproduce --max-instances``) or,
with ``--full``, on the whole demo. Each run is a subprocess of this ``.venv``'s Python with ``PYTHONPATH``
set to the code's ``src``: this worktree's, and the base commit's exported with ``git archive`` into
``runs/bench-stages/base-<commit>/`` (the same installed libraries). The two codes alternate (round r
runs this code first when r is even, the base first when odd), so load from other processes hits both.

Printed per stage (RUN/timings.json, the stages as ``reproduce`` names them): seconds and seconds over
extraction's seconds in the same run (the best round's ratio per stage), for both codes; then the stages
after extraction together (every stage but ``import`` and ``extract``, through the report) over
extraction (the issue's goal: <= 0.5), and the seconds after the report (figures, the explorer) and
start-up, which ``timings.json`` leaves out. The runs' ``report/summary.json`` are compared: identical
bytes or not, once the run folder's path (recorded in its settings) reads OUT (two codes that differ
in what they report differ here; say why).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "datasets" / "swebench-lite-pools"
BASE = "e7d4d80"
BEFORE = ("import", "extract")  # the stages up to the states; every other stage runs after extraction


def base_src(commit: str, where: Path) -> Path:
    """``src`` of ``commit`` exported into ``where`` (once; reused by a later run)."""
    src = where / f"base-{commit}"
    if not (src / "src" / "latentsift").is_dir():
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], check=True,
                              capture_output=True).stdout
        shutil.rmtree(src, ignore_errors=True)
        with tarfile.open(fileobj=BytesIO(blob)) as tar:
            tar.extractall(src, filter="data")
    return src / "src"


def run_demo(src: Path, out: Path, data: Path, instances: int | None, quiet: bool) -> tuple[dict, float, bytes]:
    """(timings.json, wall seconds of the command, summary.json bytes with the run folder's path as OUT) of one
    cold reproduce run."""
    shutil.rmtree(out, ignore_errors=True)
    env = os.environ | {"PYTHONPATH": str(src)}
    cmd = [sys.executable, "-c", "import sys; from latentsift.cli import main; sys.exit(main())", "reproduce",
           "--data", str(data), "--out", str(out)] + (["--max-instances", str(instances)] if instances else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL if quiet else None,
                          stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[3:])} (PYTHONPATH={src}) failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = (out / "report" / "summary.json").read_bytes().replace(json.dumps(str(out))[1:-1].encode(), b"OUT")
    return json.loads((out / "timings.json").read_text()), wall, summary


def after_extraction(t: dict) -> float:
    return sum(v for k, v in t.items() if k not in BEFORE and k != "total")


def table(codes: dict[str, list[tuple[dict, float]]]) -> list[str]:
    """Per stage: seconds and seconds / extraction of each code (the round with the smallest ratio)."""
    stages: list[str] = []
    for runs in codes.values():
        for t, _ in runs:
            stages += [s for s in t if s != "total" and s not in stages]
    lines = ["| stage | " + " | ".join(f"{c} s | {c} / extract" for c in codes) + " |",
             "| --- |" + " ---: | ---: |" * len(codes)]

    def cell(runs, value) -> str:
        vals = [(value(t, w) / t["extract"], value(t, w)) for t, w in runs if value(t, w) is not None]
        if not vals:
            return "- | -"
        ratio, sec = min(vals)
        return f"{sec:,.1f} | {ratio:.3f}"

    for s in stages:
        lines.append(f"| {s} | " + " | ".join(cell(r, lambda t, w: t.get(s)) for r in codes.values()) + " |")
    lines.append("| **after extraction** | " + " | ".join(cell(r, lambda t, w: after_extraction(t))
                                                         for r in codes.values()) + " |")
    lines.append("| (figures, explorer, start-up) | " + " | ".join(cell(r, lambda t, w: w - t["total"])
                                                                   for r in codes.values()) + " |")
    lines.append("| total (command's wall) | " + " | ".join(cell(r, lambda t, w: w) for r in codes.values()) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--instances", type=int, default=24, help="instances of the default selection (hash order)")
    ap.add_argument("--full", action="store_true", help="the whole demo (every instance of the default selection)")
    ap.add_argument("--base", default=BASE, help="the commit compared side by side ('' = this code alone)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each code (alternating)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-stages")
    ap.add_argument("--keep", action="store_true", help="keep the run folders (default: removed at the end)")
    ap.add_argument("--verbose", action="store_true", help="show the runs' logs")
    a = ap.parse_args()
    instances = None if a.full else a.instances
    a.out.mkdir(parents=True, exist_ok=True)
    srcs = {"this": ROOT / "src"}
    if a.base:
        srcs[a.base] = base_src(a.base, a.out)
    codes: dict[str, list[tuple[dict, float]]] = {c: [] for c in srcs}
    summaries: dict[str, list[bytes]] = {c: [] for c in srcs}
    for r in range(a.rounds):
        order = list(srcs) if r % 2 == 0 else list(srcs)[::-1]
        for c in order:
            out = a.out / f"run-{c}-{r}"
            print(f"round {r + 1}/{a.rounds}: {c} ({srcs[c]}) -> {out}", file=sys.stderr, flush=True)
            t, wall, summary = run_demo(srcs[c], out, a.data, instances, quiet=not a.verbose)
            codes[c].append((t, wall))
            summaries[c].append(summary)
            if not a.keep:
                shutil.rmtree(out, ignore_errors=True)
    what = "the whole demo" if a.full else f"the first {a.instances} instances of the demo's selection"
    print(f"reproduce on {what}, {a.rounds} round(s) per code, fresh run folders (ratios: stage / extract in "
          f"the same run; the best round per stage)")
    print("\n".join(table(codes)))
    for c, runs in codes.items():
        best = min(after_extraction(t) / t["extract"] for t, _ in runs)
        print(f"{c}: the stages after extraction take {best:.2f} of extraction's time (goal <= 0.5)")
    flat = [(c, s) for c, ss in summaries.items() for s in ss]
    same = all(s == flat[0][1] for _, s in flat)
    print("summary.json: " + ("identical bytes in every run" if same else
                              "differs between runs: " + ", ".join(f"{c} {len(s)} bytes" for c, s in flat)))


if __name__ == "__main__":
    main()
