"""Import every shared trajectory (R2E-Gym JSONL + SWE-agent archives + candidates.csv) and time it;
then time ``render`` with the packaged SmolLM2 tokenizer on a sample.

    .venv/bin/python bench/import_all.py [--data DIR] [--render N]

Prints the import wall time (acceptance: under a minute), the summary, and ms per render.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "LATENTSIFT_DATA", ROOT.parent / "shared" / "datasets" / "swebench-lite-pools")))
    ap.add_argument("--render", type=int, default=200, help="trajectories to render (0 = skip)")
    args = ap.parse_args()
    from latentsift.trajectories.importers import import_paths
    from latentsift.trajectories.trajectory import load_jsonl, save_jsonl

    t0 = time.perf_counter()
    res = import_paths([args.data / "r2egym", args.data / "sweagent"], labels=args.data / "candidates.csv")
    t_import = time.perf_counter() - t0
    print(res.summary.to_text())
    print(f"\nimport of {len(res.trajectories)} trajectories: {t_import:.2f} s "
          f"({'under' if t_import < 60 else 'OVER'} the one-minute budget)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pools.jsonl"
        t0 = time.perf_counter()
        save_jsonl(res.trajectories, out)
        t_save = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = load_jsonl(out)
        t_load = time.perf_counter() - t0
        print(f"save canonical JSONL: {t_save:.2f} s ({out.stat().st_size / 1e6:.0f} MB); "
              f"load: {t_load:.2f} s ({len(back)} trajectories)")
    if args.render:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        from latentsift.states.channel import render
        from latentsift.states.model import default_model_path
        p = default_model_path()
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
        trajs = res.trajectories
        sample = trajs[:: max(1, len(trajs) // args.render)][: args.render]
        for budget in (None, 512):
            t0 = time.perf_counter()
            n_tok = sum(render(t, tok, max_span_tokens=budget).n_tokens for t in sample)
            dt = time.perf_counter() - t0
            print(f"render (SmolLM2 template, max_span_tokens={budget}): {1000 * dt / len(sample):.1f} ms per "
                  f"trajectory, {n_tok / len(sample):.0f} tokens on average ({len(sample)} trajectories)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
