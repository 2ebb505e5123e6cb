"""Rebuild the quickstart's example pools from the committed own-policy dataset (README.md beside this file).

    python examples/data/build.py        # rewrites examples/data/runs.jsonl.gz and new.jsonl.gz

Pools are tasks of data/own-policy/qwen2.5-coder-1.5b whose K = 8 candidates have both outcomes, taken in
the dataset's task order: the first RUNS of them, labelled, are "your runs"; the next NEW, with the
labels removed (``reward`` and ``tests.hidden_passed``), are "new pools". The records are otherwise
unchanged. The gzip headers carry no time stamp, so a rebuild is byte-identical (tests/test_quickstart.py).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "data" / "own-policy" / "qwen2.5-coder-1.5b" / "trajectories.jsonl.gz"
RUNS, NEW = 24, 4


def mixed_pools(source: Path = SOURCE) -> list[list[dict]]:
    """The source's pools (one per task, in file order) whose candidates have both outcomes."""
    pools: dict[str, list[dict]] = {}
    with gzip.open(source, "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            pools.setdefault(record["instance_id"], []).append(record)
    return [pool for pool in pools.values() if 0 < sum(r["reward"] for r in pool) < len(pool)]


def unlabelled(record: dict) -> dict:
    """The record as a new pool's candidate: no reward, no hidden-test result (the docstring examples stay)."""
    tests = {k: v for k, v in record["tests"].items() if k != "hidden_passed"}
    return {**record, "reward": None, "tests": tests}


def write(path: Path, records: list[dict]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(text.encode("utf-8"))


def build(out: Path = HERE, source: Path = SOURCE) -> tuple[Path, Path]:
    pools = mixed_pools(source)
    if len(pools) < RUNS + NEW:
        raise SystemExit(f"{source}: {len(pools)} pools with both outcomes, {RUNS + NEW} needed")
    runs, new = out / "runs.jsonl.gz", out / "new.jsonl.gz"
    write(runs, [r for pool in pools[:RUNS] for r in pool])
    write(new, [unlabelled(r) for pool in pools[RUNS:RUNS + NEW] for r in pool])
    return runs, new


if __name__ == "__main__":
    for path in build():
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
