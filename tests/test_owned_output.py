"""Every command that writes takes its output one way (``latentsift._core.outputs.owned_output``): the output
checked, then its writer lock. Tried on the command line, command by command: while another process writes
the same --out, the command is refused at once (one ``error:`` line, nothing written, no model loaded), and a
file or folder of the user's at --out is refused, untouched. The table of commands is checked against the command
line itself, so a new command that writes an --out must join it."""
from __future__ import annotations

from pathlib import Path

import pytest
import typer.main

from conftest import refused  # tests/conftest.py
from test_faults import canonical, cli  # noqa: F401 (canonical: a fixture shared with test_faults)
from latentsift._core.io import output_lock
from latentsift._core.outputs import owned_output
from latentsift.cli import app


def _leaves(group=None, path=()):
    group = group or typer.main.get_command(app)
    for name, cmd in sorted(group.commands.items()):
        if hasattr(cmd, "commands"):
            yield from _leaves(cmd, (*path, name))
        else:
            yield (*path, name), cmd


#: command -> its arguments but --out, given (the pools file, a scratch folder); inputs need not exist: the
#: output is taken before any input is read.
ARGS = {
    ("bank", "build"): lambda p, d: [p, "--states", d / "states"],
    ("crossval",): lambda p, d: [p, "--states", d / "states"],
    ("evaluate",): lambda p, d: [p, "--scores", d / "f.json"],
    ("explore",): lambda p, d: [d / "f.json", "--pools", p],
    ("extract",): lambda p, d: [p],
    ("filter",): lambda p, d: [p, "--method", "random"],
    ("fit",): lambda p, d: [p, "--states", d / "states"],
    ("import",): lambda p, d: [p],
    ("premise",): lambda p, d: [p, "--states", d / "states"],
    ("reproduce",): lambda p, d: ["--data", d / "data"],
    ("rollout", "run"): lambda p, d: [],
    ("rollout", "export"): lambda p, d: [d / "run"],
    ("scorer", "train"): lambda p, d: [d / "bank"],
    ("transfer",): lambda p, d: [p, "--states", d / "states"],
    ("verify",): lambda p, d: [p],
}
#: commands whose output is a single file (the others write a folder)
FILE_OUTPUTS = {("filter",), ("import",)}


def test_the_table_names_every_command_that_writes_an_out():
    writing = {path for path, cmd in _leaves() if any("--out" in getattr(o, "opts", ()) for o in cmd.params)}
    assert writing == set(ARGS)


@pytest.mark.parametrize("path", sorted(ARGS), ids=" ".join)
def test_a_second_writer_and_a_file_of_the_user_are_refused(path, canonical, tmp_path):
    out = tmp_path / ("out.json" if path in FILE_OUTPUTS else "out")
    args = [*path, *ARGS[path](canonical, tmp_path), "--out", out]
    with output_lock(out):  # another process writing the same --out
        refused(cli(*args), f"Another process is writing to {out}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, the lock file gone too
    out.write_text("the user's notes")
    refused(cli(*args), str(out))
    assert out.read_text() == "the user's notes" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    if path not in FILE_OUTPUTS:  # a folder of the user's
        out.unlink()
        out.mkdir()
        (out / "notes.txt").write_text("the user's notes")
        refused(cli(*args), str(out), "non-empty folder")
        assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_owned_output_checks_then_locks_and_writes_atomically(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n")
    with pytest.raises(Exception, match="is the input"):
        with owned_output(src, [src], file="pools"):
            pass
    out = tmp_path / "report"
    with owned_output(out, [src], kind="report") as o:
        assert o.path == out.resolve() and (tmp_path / ".report.lock").is_file()
        with pytest.raises(Exception, match="Another process is writing"):
            with owned_output(out, [src], kind="report"):
                pass
        o.write_json({"a": 1}, "summary.json")
        o.write_text("# r\n", "report.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "report"]
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "summary.json"]
    with owned_output(out, [src], kind="report"):  # its own earlier output: taken again
        pass
    assert not (tmp_path / ".report.lock").exists()
    with pytest.raises(Exception, match="is a report folder"):
        with owned_output(out, [src], kind="site"):
            pass
    assert Path(out / "summary.json").read_text() == '{\n  "a": 1\n}\n'
