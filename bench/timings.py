"""Where the time of a finished run goes: its recorded per-stage wall times, with each stage's share.

    .venv/bin/python bench/timings.py [RUN ...]      (default: runs/demo, the folder `make demo` writes)

Reads RUN/timings.json, which `latentsift reproduce` (and `crossval`) write when the protocol ends
(seconds per stage, in the order they ran, and ``total``: from the start of the command to the report;
the report's figures and the explorer come after it and are not counted). Prints one table: a row
per stage, seconds and share of the total per run, and the time outside the named stages. Nothing is
run or timed here: a run's times are those of its machine and hour (compare code changes side by side,
as the other benches do).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = "timings.json"


def read(run: Path) -> dict[str, float]:
    path = run / TIMINGS if run.is_dir() else run
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        sys.exit(f"{path}: no such file; finish a run first (make demo writes runs/demo/{TIMINGS}).")
    except json.JSONDecodeError as e:
        sys.exit(f"{path}: not JSON ({e}).")
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        sys.exit(f"{path}: expected an object of stage -> seconds.")
    return {str(k): float(v) for k, v in data.items()}


def table(runs: dict[str, dict[str, float]]) -> list[str]:
    stages: list[str] = []
    for t in runs.values():
        stages += [s for s in t if s != "total" and s not in stages]
    totals = {name: t.get("total", sum(v for k, v in t.items() if k != "total")) for name, t in runs.items()}
    head = "| stage | " + " | ".join(f"{name} s | share" for name in runs) + " |"
    lines = [head, "| --- |" + " ---: | ---: |" * len(runs)]
    for s in stages:
        cells = [f"{t[s]:,.1f} | {t[s] / totals[n]:.1%}" if s in t else "- | -" for n, t in runs.items()]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    other = [totals[n] - sum(v for k, v in t.items() if k != "total") for n, t in runs.items()]
    lines.append("| (outside the stages) | " + " | ".join(f"{o:,.1f} | {o / totals[n]:.1%}"
                                                       for o, n in zip(other, runs)) + " |")
    lines.append("| total | " + " | ".join(f"{totals[n]:,.1f} | 100.0%" for n in runs) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=[ROOT / "runs" / "demo"],
                    help="run folders (or timings.json files); several give one column pair each")
    a = ap.parse_args()
    runs = {str(r): read(r) for r in a.runs}
    print("\n".join(table(runs)))
    for name, t in runs.items():
        top = sorted((v, k) for k, v in t.items() if k != "total")[::-1][:2]
        total = t.get("total") or sum(v for k, v in t.items() if k != "total")
        print(f"{name}: {' and '.join(k for _, k in top)} take {sum(v for v, _ in top) / total:.0%} of the total")


if __name__ == "__main__":
    main()
