"""Sensitivity controls: can the pipeline see an outcome that is in the text? (A control, never a result.)

Planted control: the pools of a finished ``reproduce`` run folder are copied with each candidate's
hidden-test outcome written at the head of its observation spans (``latentsift.protocol.control.plant_pools``;
RUN_DIR is only read), the copies are extracted with the run's span settings into OUT/planted/states,
and ``crossval`` (the run's folds and settings, no variants, no agent transfer, no verifier: Stage-1
numbers only) runs on the original and on the planted pools. Printed per Stage-1 filter: within-pool
AUC with its 95% interval and retention at each K, original -> planted. The state filters should rise
towards 1, the length rules must not move (the sentences have the same form for both outcomes).

Leaky-runs control (--leaky, expensive: extracts two more runs): ``reproduce --include-leaky
--no-variants`` into OUT/leaky and the same rows against the original run folder. OUT/leaky/states
and its verifier cache start as copies of the run's (same model and settings), so only the two leaky runs
are extracted and judged.

Usage:

    .venv/bin/python bench/control.py RUN_DIR --out OUT [--steps all|last] [--boot 1000] [--leaky] [--no-planted]
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from latentsift.protocol.control import plant_pools
from latentsift.states.model import load_policy
from latentsift.protocol import crossval
from latentsift.states.extract import extract_pools
from latentsift.protocol import ReproduceSettings, reproduce
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl


def _rows(a: dict, b: dict, names: tuple[str, str] = ("original", "planted")) -> list[str]:
    sa, sb = a["selection"]["diagnostics"]["scores"], b["selection"]["diagnostics"]["scores"]
    ks = [str(k) for k in a["settings"]["ks"]]
    head = f"| Stage-1 filter | within-pool AUC: {names[0]} | {names[1]} | " + " | ".join(
        f"retention K={k}: {names[0]} -> {names[1]}" for k in ks) + " |"
    out = [head, "|" + "---|" * (3 + len(ks))]

    def auc(s):
        x = s["auc"]
        return "-" if x["auc"] is None else f"{x['auc']:.3f} [{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]"

    def ret(d, f, k):
        r = d["retention"].get(f, {}).get(k)
        return "-" if r is None else f"{100 * r['mean']:.1f} [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}]"

    for f in sa:
        if f.startswith("curve:") or f not in sb:
            continue
        out.append(f"| {f} | {auc(sa[f])} | {auc(sb[f])} | " + " | ".join(
            f"{ret(a, f, k)} -> {ret(b, f, k)}" for k in ks) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished reproduce RUN_DIR (read only)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", default="all", help="plant in every step's observation (all) or the last (last)")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--leaky", action="store_true", help="also the leaky-runs control (reproduce --include-leaky)")
    ap.add_argument("--no-planted", action="store_true", help="skip the planted control (with --leaky: that one only)")
    args = ap.parse_args()
    run, out = args.run.resolve(), args.out.resolve()
    if out == run or run in out.parents:
        raise SystemExit("--out must lie outside RUN_DIR (the run folder is an input)")
    s = json.loads((run / "manifest.json").read_text())["settings"]
    out.mkdir(parents=True, exist_ok=True)
    # the run's states' dtype (its fingerprint), so new states differ from the run's by the text only
    dtype = json.loads((run / "states" / "manifest.json").read_text())["fingerprint"]["dtype"]
    if not args.no_planted:
        planted = out / "planted" / "pools.jsonl"
        planted.parent.mkdir(parents=True, exist_ok=True)
        trajs = load_jsonl(run / "pools.jsonl")
        save_jsonl(plant_pools(trajs, steps=args.steps), planted)
        t0 = time.perf_counter()
        rep = extract_pools(load_policy(s.get("model"), dtype=dtype), load_jsonl(planted), out / "planted" / "states",
                            max_span_tokens=s["max_span_tokens"], max_prompt_tokens=s["max_prompt_tokens"])
        print(f"extracted {len(trajs)} planted candidates in {time.perf_counter() - t0:.0f} s ({rep})", flush=True)
        kw = dict(group_by=s.get("group_by", "repo"), n_folds=s["n_folds"], ks=tuple(s["ks"]), n_draws=s["n_draws"],
                  seed=s["seed"], n_boot=args.boot, scorer_epochs=s["scorer_epochs"], variants=False,
                  agent_transfer=False, log=lambda m: None)
        summaries = {}
        for name, pools, states in (("original", run / "pools.jsonl", run / "states"),
                                    ("planted", planted, out / "planted" / "states")):
            t0 = time.perf_counter()
            rdir = crossval(pools, states, out / name / "crossval", **kw)
            summaries[name] = json.loads((rdir / "summary.json").read_text())
            print(f"crossval {name}: {time.perf_counter() - t0:.0f} s", flush=True)
        print(f"\nPlanted control ({args.steps} steps; {len(trajs)} candidates of {run}):\n")
        print("\n".join(_rows(summaries["original"], summaries["planted"])))
    if args.leaky:
        leaky = {k: v for k, v in s.items() if k in ReproduceSettings.__dataclass_fields__}
        leaky |= {"out": str(out / "leaky"), "include_leaky": True, "variants": False, "dtype": dtype}
        for part in ("states", "verifier/cache"):  # the run's own states and verdicts: only the leaky runs are new
            if (run / part).is_dir() and not (out / "leaky" / part).exists():
                shutil.copytree(run / part, out / "leaky" / part)
        t0 = time.perf_counter()
        rdir = reproduce(ReproduceSettings(**leaky), log=lambda m: None)
        base = json.loads((run / "report" / "summary.json").read_text())
        print(f"reproduce --include-leaky --no-variants: {time.perf_counter() - t0:.0f} s", flush=True)
        print("\nLeaky-runs control (acr-val-only and acr-val-sbfl included; original run -> with them):\n")
        print("\n".join(_rows(base, json.loads((rdir / "summary.json").read_text()), ("without", "with leaky runs"))))


if __name__ == "__main__":
    main()
