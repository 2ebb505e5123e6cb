"""Shared fixtures: the real dataset beside the checkout and the packaged model (loaded once)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LATENTSIFT_DATA", ROOT.parent / "shared" / "datasets" / "swebench-lite-pools"))


def pytest_configure(config):
    """The converted-model cache of this session: a fresh folder (the first load converts the GGUF
    file, later loads and the subprocesses the tests start read the copy), removed at the end. The
    workers of ``pytest -n`` (pytest-xdist) share their controller's: they inherit its environment,
    and a copy is written to a temporary folder and renamed, so two workers converting at once is safe."""
    import tempfile
    from latentsift.states.model import CACHE_ENV
    if hasattr(config, "workerinput") and os.environ.get(CACHE_ENV):
        config._latentsift_cache = os.environ[CACHE_ENV]
        return
    config._latentsift_cache = tempfile.mkdtemp(prefix="latentsift-test-cache-")
    config._latentsift_cache_owned = True
    os.environ[CACHE_ENV] = config._latentsift_cache


def pytest_unconfigure(config):
    import shutil
    if getattr(config, "_latentsift_cache_owned", False):
        shutil.rmtree(config._latentsift_cache, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)     # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (the Makefile's), except that the files using the session's ``tiny_run`` or
    ``shared_pools`` are one unit of work, run by one worker: a session fixture is made once per worker, and
    these 14 files spread over both workers made each run the tiny reproduction (553 s of setup alone on
    this busy 2-core Xeon) and import the shared pools (15 s). A file is one of them when its text names
    either fixture."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    family = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
              if any(name in p.read_text() for name in ("tiny_run", "shared_pools"))}

    class SharedRunsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/(the files using tiny_run or shared_pools)" if scope in family else scope

    return SharedRunsTogether(config, log)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "candidates.csv").is_file():
        pytest.fail(f"The shared dataset is missing at {DATA}; put ../shared beside the checkout "
                    "or set LATENTSIFT_DATA.")
    return DATA


@pytest.fixture(scope="session")
def policy():
    from latentsift.states.model import load_policy
    return load_policy()


@pytest.fixture(scope="module")
def policy32():
    """The packaged model in float32 (rollouts: online capture and replay agree to float32 rounding)."""
    from latentsift.states.model import load_policy
    return load_policy(dtype="float32")


@pytest.fixture(scope="module")
def tasks():
    """The first two HumanEval tasks (a module may define its own ``tasks``)."""
    from latentsift.rollout.tasks import load_tasks
    return load_tasks()[:2]


@pytest.fixture(scope="module")
def env():
    """The rollout's sandbox: the agent's tool and the judge."""
    from latentsift.rollout.folder import sandbox_env
    return sandbox_env()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module (restored after): on a 2-core machine, 2 OpenMP threads next
    to any other busy process run 10-25x slower (measured: 153 tokens 7.5 s vs 0.28 s)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@contextlib.contextmanager
def at_threads(n: int):
    """Run the block with ``n`` torch threads and ``n`` BLAS/OpenMP threads (numpy, scipy, sklearn),
    restoring both after: results must not depend on either (test_reproduce compares 1 and 2)."""
    import torch
    from threadpoolctl import threadpool_limits

    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        torch.set_num_threads(prev)


# The tiny end-to-end run (4 instances, 2 folds, every stage with the packaged model), made once per
# session and shared: test_reproduce checks it and its rerun, test_explore/test_protocol/test_shift reuse its
# pools, states and verifier results instead of extracting again. The sweep's patch-writing step keeps 64
# tokens per span (8 times the other spans'; the default 1,024 made its extraction 24,812 tokens, 227 of
# the run's 496 s under load).
TINY_RUN = dict(max_instances=4, n_unresolved=1, n_folds=2, max_span_tokens=8, max_prompt_tokens=16,
                verifier_max_tokens=512, ks=(2, 3), n_draws=10, n_boot=50, scorer_epochs=2, variants=False,
                sweep=("patch",), sweep_patch_tokens=64)


@pytest.fixture(scope="session")
def tiny_run(data_dir, tmp_path_factory, policy):
    """{"settings", "out", "report", "summary"}: the tiny reproduce run (at two threads: the model's
    forwards run two at a time, each at one thread) and its first summary.json text."""
    from latentsift.protocol.reproduction import ReproduceSettings, reproduce

    out = tmp_path_factory.mktemp("tiny") / "run"
    settings = dict(data=str(data_dir), out=str(out), **TINY_RUN)
    with at_threads(2):
        report = reproduce(ReproduceSettings(**settings), log=lambda m: None)
    return {"settings": settings, "out": out, "report": report, "summary": (report / "summary.json").read_text()}


def refused(r, *words: str) -> None:
    """Exit code 2, one ``error:`` line naming the problem, no traceback."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit), r.output
    lines = [l for l in r.output.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, r.output
    for w in words:
        assert w in lines[0], r.output


@pytest.fixture(scope="session")
def shared_import(data_dir):
    """The whole shared dataset imported with its labels (every run; an ImportResult), once a session: test_importers
    checks it, ``shared_pools`` and test_reproduce select from it (none of them changes a trajectory)."""
    from latentsift.trajectories.importers import import_paths
    return import_paths([data_dir / "r2egym", data_dir / "sweagent"], labels=data_dir / "candidates.csv")


@pytest.fixture(scope="session")
def shared_pools(shared_import):
    """The shared SWE-bench Lite pools of the default runs (no label-leaking run), every instance: (run, trajs,
    folds, rule filters) with 4 repository folds (test_operating, test_keep_adaptive)."""
    from latentsift.protocol.reproduction import CLEAN_RUNS
    from latentsift.protocol.crossval import CrossvalSettings
    from latentsift.protocol.run import Run
    from latentsift.protocol.stage1 import rule_scorers
    from latentsift.trajectories.trajectory import group_pools
    trajs = [t for t in shared_import.trajectories if t.run in CLEAN_RUNS]
    s = CrossvalSettings(pools="-", states="-", out="-", n_folds=4, variants=False, agent_transfer=False,
                         n_boot=100, ks=(3,), target_recalls=(0.9, 0.95))
    run = Run(s, log=lambda m: None)
    return run, trajs, run.folds(trajs), rule_scorers(group_pools(trajs), seed=s.seed)
