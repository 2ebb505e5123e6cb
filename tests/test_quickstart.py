"""docs/quickstart.md runs as written, from a folder holding only what a fresh clone holds of it.

Every ```bash block of the page, in order, is run as one script by bash (-e, -o pipefail) in a temporary
folder with a copy of examples/data/ and nothing beside it (no ../shared), with the ``latentsift`` script of
this interpreter's environment first on PATH and, in a source checkout, its src/ first on PYTHONPATH. Then
each step's output is read back: the pools, both state stores, the cross-validated verdict, the sifter and
the filtered new pools. (The page's install commands are ```sh blocks: not run here.)
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart.md"
DATA = ROOT / "examples" / "data"
BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
pytestmark = pytest.mark.model      # the page's commands load the packaged SmolLM2


def _records(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _env() -> dict[str, str]:
    """This environment's ``latentsift`` first on PATH; in a source checkout, its src/ first on PYTHONPATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "100"}
    if (ROOT / "src" / "latentsift").is_dir():      # a source checkout: its code, not an installed copy
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The page's bash blocks, run once; returns (folder, CPU seconds of the commands)."""
    blocks = BASH.findall(PAGE.read_text())
    assert len(blocks) >= 5, "import, extract, crossval, fit, filter"
    where = tmp_path_factory.mktemp("clone")
    shutil.copytree(DATA, where / "examples" / "data", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (where / "quickstart.sh").write_text("\n".join(blocks))
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "quickstart.sh"], cwd=where, env=_env(),
                          capture_output=True, text=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert done.returncode == 0, f"the page's commands failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    print(f"docs/quickstart.md: {time.perf_counter() - start:.0f} s wall, {cpu:.0f} s CPU")
    return where, cpu


def test_the_example_is_small_and_rebuilt_from_the_own_policy_data(tmp_path):
    """A few hundred KB, and exactly what examples/data/build.py makes of data/own-policy (when present)."""
    files = sorted(p.name for p in DATA.glob("*.jsonl.gz"))
    assert files == ["new.jsonl.gz", "runs.jsonl.gz"]
    assert sum(p.stat().st_size for p in DATA.glob("*.jsonl.gz")) < 300_000
    source = ROOT / "data" / "own-policy" / "qwen2.5-coder-1.5b" / "trajectories.jsonl.gz"
    if not source.exists():
        pytest.skip("no data/own-policy here (an installed copy)")
    spec = importlib.util.spec_from_file_location("examples_data_build", DATA / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    build.build(tmp_path, source)
    for name in files:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), f"{name} differs from build.py's"


def test_the_commands_run_the_installed_script_on_this_code(run):
    where, _ = run
    env = _env()
    assert Path(shutil.which("latentsift", path=env["PATH"])).parent == Path(sys.executable).parent
    package = subprocess.run([sys.executable, "-c", "import latentsift; print(latentsift.__file__)"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    if (ROOT / "src" / "latentsift").is_dir():
        assert Path(package).is_relative_to(ROOT / "src"), package
    assert not (where.parent / "shared").exists() and not (where / "src").exists()


def test_import_writes_the_pools(run):
    where, _ = run
    runs, new = _records(where / "qs" / "runs.jsonl"), _records(where / "qs" / "new.jsonl")
    assert len({r["instance_id"] for r in runs}) == 24 and len(runs) == 24 * 8
    assert all(r["reward"] in (0.0, 1.0) for r in runs)
    assert len({r["instance_id"] for r in new}) == 4 and all(r["reward"] is None for r in new)


def test_extract_stores_a_state_for_every_candidate(run):
    where, _ = run
    import pyarrow.parquet as pq
    for store, pools in (("states", "runs.jsonl"), ("new-states", "new.jsonl")):
        ids = {r["traj_id"] for r in _records(where / "qs" / pools)}
        index = pq.read_table(where / "qs" / store / "index.parquet").to_pydict()
        assert set(index["traj_id"]) == ids, store
        settings = json.loads((where / "qs" / store / "manifest.json").read_text())["settings"]
        assert settings["max_span_tokens"] == 16 and settings["max_prompt_tokens"] == 32


def test_crossval_answers_the_question(run):
    """The verdict against the length rule is one of the three outcomes, from the 24 labelled pools."""
    where, _ = run
    summary = json.loads((where / "qs" / "cv" / "report" / "summary.json").read_text())
    assert summary["pools"]["n_instances"] == 24 and summary["pools"]["n_mixed"] == 24
    paper = summary["decision"]["auc"]["scores"]["latentsift"]
    assert 0.5 < paper["auc"]["auc"] <= 1.0 and paper["auc"]["n_instances"] == 24
    vs_length = paper["vs"]["shortest_chars"]
    assert vs_length["outcome"] in ("higher", "lower", "undetermined")
    assert vs_length["lo"] <= vs_length["estimate"] <= vs_length["hi"]
    assert (where / "qs" / "cv" / "report" / "report.md").read_text().startswith("# ")


def test_fit_saves_a_sifter_of_all_runs(run):
    where, _ = run
    sifter = json.loads((where / "qs" / "sifter" / "sifter.json").read_text())
    assert sifter["fingerprint"] == json.loads((where / "qs" / "states" / "manifest.json").read_text())["fingerprint"]


def test_filter_keeps_half_of_each_new_pool(run):
    """Stage 1 keeps max(3, floor(K / 2)) = 4 of each new pool's 8 candidates, the 4 highest scores."""
    where, _ = run
    result = json.loads((where / "qs" / "filter.json").read_text())
    new: dict[str, set[str]] = {}
    for r in _records(where / "qs" / "new.jsonl"):
        new.setdefault(r["instance_id"], set()).add(r["traj_id"])
    assert {p["instance_id"] for p in result["pools"]} == set(new) and result["n_retained"] == 16
    for pool in result["pools"]:
        scores = {c["traj_id"]: c["s"] for c in pool["candidates"]}
        kept = set(pool["retained"])
        assert set(scores) == new[pool["instance_id"]] and len(kept) == 4 and kept <= set(scores)
        assert min(scores[t] for t in kept) >= max(s for t, s in scores.items() if t not in kept)


def test_it_takes_a_few_cpu_minutes(run):
    """The page says minutes on 2 cores: its commands took 204 s of CPU (the wall time depends on the load)."""
    _, cpu = run
    assert cpu < 450, f"the page's commands took {cpu:.0f} s of CPU (measured: 204 s)"
