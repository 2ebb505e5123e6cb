"""The shift guard's error rates (``latentsift.protocol.protocol_guard``) on a finished run's folds.

Reads RUN_DIR (a finished ``reproduce`` run: pools.jsonl, states/, folds/fold-k/{paper,agent-*}/bank)
and never writes there: the fold banks are loaded from the cache, not refitted (a run made before
the guard's rates were part of the report gets them without re-running). Writes OUT/shift_guard.json
and prints the report's table.

Usage: .venv/bin/python bench/guard_rates.py RUN_DIR OUT
"""
import json
import sys
from pathlib import Path

from latentsift.bank.bank import Bank
from latentsift.protocol import Run, protocol_guard
from latentsift.protocol import ReproduceSettings
from latentsift.states.store import StateStore
from latentsift.trajectories.trajectory import load_jsonl

demo = Path(sys.argv[1]).resolve()
s = json.loads((demo / "manifest.json").read_text())["settings"]


class ReadOnly(Run):
    def fit_fold(self, k, bank_trajs, states, fingerprint, bank_params, name="paper"):
        d = demo / "folds" / f"fold-{k}" / name
        b = Bank.load(d / "bank")
        if set(b.traj_ids_) != {t.traj_id for t in bank_trajs}:
            raise SystemExit(f"{d}: the cached bank is not this fold's (rerun reproduce on RUN_DIR first)")
        return b, None


st = ReproduceSettings(**{k: v for k, v in s.items() if k in ReproduceSettings.__dataclass_fields__} | {"out": sys.argv[2]})
run = ReadOnly(st, log=print)
trajs = load_jsonl(demo / "pools.jsonl")
store = StateStore(demo / "states").open()
states = store.load([t.traj_id for t in trajs])
g = protocol_guard(run, trajs, run.folds(trajs), states, store.fingerprint, n_boot=1000, seed=0)
Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[2]) / "shift_guard.json").write_text(json.dumps(g, indent=1))
from latentsift.report.sections import _shift_guard_markdown
print("\n".join(_shift_guard_markdown({"shift_guard": g})))
