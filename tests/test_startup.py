"""The command line starts fast: ``latentsift --help``, ``--version`` and a command's argument errors import
no model library (torch, transformers), and a command imports only its own job (``latentsift.cli.COMMANDS``).

Each check runs in a fresh interpreter (``sys.modules`` of this one holds whatever other tests imported);
a time is the best of three runs, so a busy CI machine's stall does not fail it.
"""
from __future__ import annotations

import resource
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import latentsift

FIXTURES = Path(__file__).parent / "fixtures"
MODEL_LIBRARIES = ("torch", "transformers")
#: Runs the command line on sys.argv[2:] in this interpreter, then prints the model libraries it imported.
RUN = ("import sys\nfrom latentsift.cli import app\nsys.argv = ['latentsift', *sys.argv[2:]]\n"
       "try:\n    app()\nexcept SystemExit as e:\n    code = e.code\n"
       f"print('imported:', sorted(m for m in {MODEL_LIBRARIES!r} if m in sys.modules))\n"
       "sys.exit(code)\n")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, "--", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def _best_of_3(*args: str, cpu: bool = False) -> float:
    """Seconds of ``latentsift ARGS`` in a fresh interpreter, the best of three: wall-clock time, or with
    ``cpu`` the CPU time it spent (user + system; a loaded machine stretches the wall clock, not that)."""
    best = float("inf")
    for _ in range(3):
        t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "latentsift.cli", *map(str, args)], capture_output=True, check=False,
                       timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) if cpu else \
            time.perf_counter() - t
        best = min(best, spent)
    return best


def test_help_and_version_take_under_half_a_second():
    assert _best_of_3("--help") < 0.5
    assert _best_of_3("--version") < 0.5


def test_version_is_the_package_metadata():
    r = subprocess.run([sys.executable, "-m", "latentsift.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0
    assert r.stdout == f"latentsift {version('latentsift')}\n"
    assert version("latentsift") == latentsift.__version__


def test_importing_the_package_imports_no_model_library_and_no_numpy():
    code = ("import sys, latentsift\n"
            "print(sorted(m for m in ('numpy', 'torch', 'transformers', 'pydantic') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout == "[]\n"


def test_help_lists_every_command_without_importing_one():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom latentsift.cli import COMMANDS, app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "assert all(f'  {name} ' in r.output for name in COMMANDS), r.output\n"
            "print(sorted(m for m in sys.modules if m.startswith(('latentsift._jobs', 'latentsift._cli.', 'numpy'))"
            " and m != 'latentsift._cli._vocabulary'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n"


def test_the_import_command_runs_without_a_model_library(tmp_path):
    r = _run("import", FIXTURES / "trajectories" / "openai_toolcalls.jsonl", "--out", tmp_path / "t.jsonl")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "t.jsonl").stat().st_size > 0
    assert r.stdout.splitlines()[-1] == "imported: []"


def test_crossval_argument_errors_import_no_model_library_and_come_within_two_seconds(tmp_path):
    pools = tmp_path / "pools.jsonl"
    pools.write_text("")
    for args, words in [(["crossval"], "Missing argument 'POOLS'"),
                        (["crossval", pools, "--out", tmp_path / "c"], "Missing option '--states'"),
                        (["crossval", pools, "--states", tmp_path, "--out", tmp_path / "c", "--folds", "0"],
                         "--folds must be a positive integer")]:
        r = _run(*args)
        assert r.returncode == 2, r.stderr
        assert words in r.stderr
        assert r.stdout.splitlines()[-1] == "imported: []"
    assert not (tmp_path / "c").exists()
    # the command's declarations and checks load in a fresh interpreter within 2 s of CPU (its library, no model's)
    assert _best_of_3("crossval", pools, "--states", tmp_path, "--out", tmp_path / "c", "--folds", "0", cpu=True) < 2.0
