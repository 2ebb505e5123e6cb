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
    runs, new = _records(where / "runs" / "qs" / "runs.jsonl"), _records(where / "runs" / "qs" / "new.jsonl")
    assert len({r["instance_id"] for r in runs}) == 24 and len(runs) == 24 * 8
    assert all(r["reward"] in (0.0, 1.0) for r in runs)
    assert len({r["instance_id"] for r in new}) == 4 and all(r["reward"] is None for r in new)


def test_extract_stores_a_state_for_every_candidate(run):
    where, _ = run
    import pyarrow.parquet as pq
    for store, pools in (("states", "runs.jsonl"), ("new-states", "new.jsonl")):
        ids = {r["traj_id"] for r in _records(where / "runs" / "qs" / pools)}
        index = pq.read_table(where / "runs" / "qs" / store / "index.parquet").to_pydict()
        assert set(index["traj_id"]) == ids, store
        settings = json.loads((where / "runs" / "qs" / store / "manifest.json").read_text())["settings"]
        assert settings["max_span_tokens"] == 16 and settings["max_prompt_tokens"] == 32


#: The page's numbers (section 3), as it states them: extracted in float32, 3 decimals.
PAGE_NUMBERS = {"auc": (0.721, 0.648, 0.802), "vs_length": (-0.111, -0.183, -0.043, "lower"), "length_auc": 0.832,
                "learned": (0.740, -0.092, -0.167, -0.018, "lower"), "vs_random": (0.260, "higher"),
                "length_removed": (0.538, 0.038, -0.023, 0.102, "undetermined")}


def test_the_page_states_its_numbers_and_its_dtype():
    page = " ".join(PAGE.read_text().split())
    assert all(block.count("--dtype float32") == block.count("latentsift extract")
               for block in BASH.findall(PAGE.read_text()))
    auc, lo, hi = PAGE_NUMBERS["auc"]
    d, dlo, dhi, outcome = PAGE_NUMBERS["vs_length"]
    assert f"{auc:.3f} [{lo:.3f}, {hi:.3f}]" in page and f"{PAGE_NUMBERS['length_auc']:.3f}" in page
    assert f"{d:.3f} [{dlo:.3f}, {dhi:+.3f}], *{outcome}*" in page
    auc, d, dlo, dhi, outcome = PAGE_NUMBERS["learned"]
    assert f"{auc:.3f}, is *{outcome}*" in page and f"({d:.3f} [{dlo:.3f}, {dhi:.3f}])" in page
    auc, d, dlo, dhi, outcome = PAGE_NUMBERS["length_removed"]
    assert f"{auc:.3f}, {d:+.3f} [{dlo:+.3f}, {dhi:+.3f}]" in page and f"*{outcome}*" in page
    assert f"{PAGE_NUMBERS['vs_random'][0]:+.3f}" in page


def test_crossval_gives_the_page_s_numbers(run):
    """The verdict and every number of the page's section 3, from the 24 labelled pools extracted in float32."""
    where, _ = run
    summary = json.loads((where / "runs" / "qs" / "cv" / "report" / "summary.json").read_text())
    assert summary["pools"]["n_instances"] == 24 and summary["pools"]["n_mixed"] == 24
    assert json.loads((where / "runs" / "qs" / "states" / "manifest.json").read_text())["fingerprint"]["dtype"] \
        == "float32"
    scores = summary["decision"]["auc"]["scores"]
    paper, learned = scores["latentsift"], scores["branch:learned"]
    r3 = lambda x: round(x, 3)   # noqa: E731 - the page's precision
    auc = paper["auc"]
    assert (r3(auc["auc"]), r3(auc["ci"][0]), r3(auc["ci"][1])) == PAGE_NUMBERS["auc"] and auc["n_instances"] == 24
    v = paper["vs"]["shortest_chars"]
    assert (r3(v["estimate"]), r3(v["lo"]), r3(v["hi"]), v["outcome"]) == PAGE_NUMBERS["vs_length"]
    assert r3(summary["decision"]["auc"]["reference_aucs"]["shortest_chars"]["auc"]) == PAGE_NUMBERS["length_auc"]
    v = learned["vs"]["shortest_chars"]
    assert (r3(learned["auc"]["auc"]), r3(v["estimate"]), r3(v["lo"]), r3(v["hi"]), v["outcome"]) == \
        PAGE_NUMBERS["learned"]
    v = paper["vs"]["random"]
    assert (r3(v["estimate"]), v["outcome"]) == PAGE_NUMBERS["vs_random"]
    lr = paper["length_removed"]
    m = lr["minus_half"]
    assert (r3(lr["auc"]["auc"]), r3(m["estimate"]), r3(m["lo"]), r3(m["hi"]), lr["outcome"]) == \
        PAGE_NUMBERS["length_removed"]
    assert (where / "runs" / "qs" / "cv" / "report" / "report.md").read_text().startswith("# ")


def test_fit_saves_a_sifter_of_all_runs(run):
    where, _ = run
    sifter = json.loads((where / "runs" / "qs" / "sifter" / "sifter.json").read_text())
    assert sifter["fingerprint"] == json.loads((where / "runs" / "qs" / "states" / "manifest.json").read_text())["fingerprint"]


def test_auto_recommends_what_the_page_says_and_filters_without_states(run):
    """fit --method auto: the page's printed line, read back from the run's sifter.json; its filter ran without
    --states and kept the shortest candidates."""
    where, _ = run
    config = json.loads((where / "runs" / "qs" / "auto" / "sifter.json").read_text())["config"]
    auc = config["choice"]["candidates"][config["method"]]
    line = f"Method: {config['method']} (chosen by --method auto: highest inner-CV within-pool AUC {auc:.3f}; " \
           "needs no states)"
    assert line in PAGE.read_text() and config["method"] == "shortest-chars"
    assert f"inner-CV AUC is {config['choice']['candidates']['latentsift']:.3f}" in " ".join(PAGE.read_text().split())
    result = json.loads((where / "runs" / "qs" / "filter-auto.json").read_text())
    assert result["inputs"]["states_dir"] is None and result["n_retained"] == 16
    for pool in result["pools"]:
        raw = {c["traj_id"]: c["raw"] for c in pool["candidates"]}
        assert min(raw[t] for t in pool["retained"]) >= max(v for t, v in raw.items() if t not in pool["retained"])


def test_filter_keeps_half_of_each_new_pool(run):
    """Stage 1 keeps max(3, floor(K / 2)) = 4 of each new pool's 8 candidates, the 4 highest scores."""
    where, _ = run
    result = json.loads((where / "runs" / "qs" / "filter.json").read_text())
    new: dict[str, set[str]] = {}
    for r in _records(where / "runs" / "qs" / "new.jsonl"):
        new.setdefault(r["instance_id"], set()).add(r["traj_id"])
    assert {p["instance_id"] for p in result["pools"]} == set(new) and result["n_retained"] == 16
    for pool in result["pools"]:
        scores = {c["traj_id"]: c["s"] for c in pool["candidates"]}
        kept = set(pool["retained"])
        assert set(scores) == new[pool["instance_id"]] and len(kept) == 4 and kept <= set(scores)
        assert min(scores[t] for t in kept) >= max(s for t, s in scores.items() if t not in kept)


def test_it_takes_a_few_cpu_minutes(run):
    """The page says minutes on 2 cores: its commands took 131 s of CPU (the wall time depends on the load)."""
    _, cpu = run
    assert cpu < 450, f"the page's commands took {cpu:.0f} s of CPU (measured: 131 s)"
