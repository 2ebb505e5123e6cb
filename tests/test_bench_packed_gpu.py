"""bench/packed_gpu.py, the prepared GPU script of issue 52, run on a CPU before any GPU sees it: tiny shapes, in
a Python that sees only torch, transformers, numpy, what they require, and latentsift's source (as on the GPU
machine, where nothing can be installed), without pydantic and threadpoolctl (the script's stand-ins take their
place). It must give every mode a rate, and the library's packed states must equal the one-per-forward ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "packed_gpu.py"
ON_THE_GPU_MACHINE = ("torch", "transformers", "numpy")
LEFT_OUT = {"pydantic", "pydantic-core", "threadpoolctl"}   # latentsift's, not theirs: maybe absent there


def _distributions(roots) -> list:
    """``roots`` and everything they require (extras left out), as installed here, less LEFT_OUT."""
    todo, seen, dists = list(roots), set(), []
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen or name in LEFT_OUT:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        dists.append(dist)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dists


def _bare_site(folder: Path) -> Path:
    """A site folder with links to the files of :func:`_distributions` only."""
    folder.mkdir()
    for dist in _distributions(ON_THE_GPU_MACHINE):
        for top in {Path(f).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (folder / top).exists():
                (folder / top).symlink_to(src)
    return folder


def test_the_gpu_script_runs_on_a_cpu_with_only_torch_transformers_and_numpy(tmp_path):
    site = _bare_site(tmp_path / "site")
    out = tmp_path / "packed.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT / "src")])
    argv = ["--device", "cpu", "--tiny", "--threads", "1", "--budget-tokens", "1500", "--pack", "512,2048",
            "--long-n", "1", "--long-tokens", "2500", "--rounds", "2", "--out", str(out)]
    # -S: no site-packages but the bare folder; the check fails if the script or latentsift imports anything else
    proc = subprocess.run([sys.executable, "-S", str(SCRIPT), *argv], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert sorted(res["facts"]["stand_ins"]) == ["pydantic", "threadpoolctl"]
    assert set(res["shapes"]) == {"smollm2", "qwen1.5b"}
    for shape, r in res["shapes"].items():
        assert "error" not in r and not r["skipped"], (shape, r)
        modes = r["modes"]
        for name in ("bound@512", "bound@2048", "bound-loop@2048", "rows@2048", "bare-single", "single", "packed@512", "packed@2048",
                     "long", "long@32768"):
            assert modes[name]["tok_s"] > 0 and len(modes[name]["seconds"]) == 2, (shape, name)
        assert modes["single"]["tokens"] == modes["packed@2048"]["tokens"] == modes["bound@2048"]["tokens"] >= 1500
        assert set(r["ratios"]) >= {"packed@2048 / bound@2048", "packed@2048 / single"}
        # the library's packed states are the one-per-forward states (float32), every round the same bytes
        for name in ("packed@512", "packed@2048"):
            assert r["agreement"][name]["span_layers"] > 0 and r["agreement"][name]["max_rel"] <= 1e-5
        assert all(r["same_bytes_every_round"].values())
        assert r["team_replay_hours"]["long"] > 0
    assert "240 M tokens" in proc.stdout and "computed from the measured rates" in proc.stdout


def test_the_scripts_table_prints_a_run_of_some_modes_only():
    """``--modes packed,single,long`` (the fresh-process check): no bound mode, and the table still prints."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("packed_gpu", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rates = {"single": 30000.0, "packed@65536": 120000.0, "long": 60000.0}
    shape = {"dtype": "bfloat16", "sequences": 3, "tokens": 2000, "bound_attention": "FlashAttention varlen",
             "modes": {n: {"tok_s": r, "seconds": [1.0]} for n, r in rates.items()}, "skipped": {}, "ratios": {},
             "agreement": {}, "same_bytes_every_round": {n: True for n in rates}, "pack_tokens_recorded": {},
             "team_replay_hours": bench.team_rows(rates)}
    text = bench.table({"facts": {"device": "cuda"}, "shapes": {"smollm2": shape}})
    assert "2.22 h at single; 1.11 h at long; 0.56 h at packed@65536" in text
