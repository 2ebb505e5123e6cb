"""The command line's vocabulary: one meaning per name in every command, old names kept with one line of
advice, and every ``--help`` readable at 80 columns (issue: one name per idea)."""
from __future__ import annotations

import re
import typing
from collections import defaultdict
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from latentsift._cli._vocabulary import (ALIASES, COMMAND_ALIASES, MEANINGS, VALUE_ALIASES, advise, command_path,
                                         markdown_tables, name_of, order_advice, parameters)
from latentsift.cli import app

ROOT = typer.main.get_command(app)
DOC = Path(__file__).resolve().parents[1] / "docs" / "cli-vocabulary.md"


def _command(path: str):
    cmd = ROOT
    for part in path.split():
        cmd = cmd.commands[part]
    return cmd


def _base(annotation) -> str:
    """The value type of an annotation: ``Optional[List[int]]`` -> 'int'."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return _base(args[0]) if args else getattr(annotation, "__name__", str(annotation))


def _by_name() -> dict[str, list[tuple[str, object]]]:
    by = defaultdict(list)
    for path, p in parameters(ROOT):
        by[name_of(p)].append((path, p))
    return by


def test_every_name_is_declared_with_one_meaning_and_one_type():
    """What is tested: each option (and positional argument) of every command is declared in the vocabulary,
    and commands that share a name give it values of one type (a count here and a list of ids there fails)."""
    by = _by_name()
    assert sorted(set(by) - set(MEANINGS)) == []          # a new name needs its meaning declared
    assert sorted(set(MEANINGS) - set(by)) == []          # no stale entry
    types = {name: {_base(p.type_descriptor.annotation) for _, p in uses} for name, uses in by.items()}
    assert {n: t for n, t in types.items() if len(t) > 1} == {}
    assert len(by) > 100 and len(by["--seed"]) >= 8       # the walk reached every command


def test_no_two_option_names_share_a_meaning():
    """What is tested: synonyms (--boot and --bootstrap, --false-alarm and --guard-false-alarm) are gone: no two
    option names are declared with the same meaning."""
    seen = defaultdict(list)
    for name, meaning in MEANINGS.items():
        if name.startswith("--"):
            seen[meaning].append(name)
    assert {m: n for m, n in seen.items() if len(n) > 1} == {}


def test_the_documented_table_is_the_generated_one():
    text = DOC.read_text(encoding="utf-8")
    for table in markdown_tables(ROOT):
        assert table in text


def test_an_old_name_is_no_longer_a_visible_option_of_its_command():
    visible = {(path, name_of(p)) for path, p in parameters(ROOT)}
    for (command, old), new in ALIASES.items():
        assert (command, old) not in visible
        assert (command, new or "POOLS") in visible, (command, new)


CASES = [  # (old command line, the parameter it sets, its value)
    (["extract", "p.jsonl", "--out", "o", "--instances", "2"], "instances", 2),
    (["fit", "p.jsonl", "--states", "s", "--out", "o", "--instances", "2"], "instances", 2),
    (["crossval", "p.jsonl", "--states", "s", "--out", "o", "--instances", "2"], "instances", 2),
    (["filter", "p.jsonl", "--out", "o", "--instances", "a,b"], "instances", "a,b"),
    (["rollout", "--out", "o", "--k", "3"], "k", 3),
    (["crossval", "p.jsonl", "--states", "s", "--out", "o", "--boot", "50"], "boot", 50),
    (["premise", "p.jsonl", "--states", "s", "--out", "o", "--boot", "50"], "boot", 50),
    (["transfer", "p.jsonl", "--states", "s", "--out", "o", "--boot", "50"], "boot", 50),
    (["fit", "p.jsonl", "--states", "s", "--out", "o", "--false-alarm", "0.1"], "guard_false_alarm", 0.1),
    (["fit", "p.jsonl", "--states", "s", "--out", "o", "--reference", "instance"], "guard_reference", "instance"),
    (["evaluate", "--pools", "p.jsonl", "--scores", "s", "--out", "o"], "pools", Path("p.jsonl")),
    (["verify", "--trajectories=p.jsonl", "--out", "o"], "pools", Path("p.jsonl")),
    (["verify", "p.jsonl", "--out", "o", "--max-prompt-tokens", "512"], "max_prompt_tokens", 512),
    (["fit", "p.jsonl", "--states", "s", "--out", "o", "--guard-reference", "repository"], "guard_reference", "repo"),
    (["policy", "verify", "m.gguf", "--pin", "x"], "model", Path("m.gguf")),
]


@pytest.mark.parametrize("args, param, value", CASES, ids=[" ".join(c[0][:2]) + " " + c[0][-2] for c in CASES])
def test_an_old_name_still_works_with_one_line_of_advice(args, param, value):
    """What is tested: the old command line parses to the new parameter with the same value, and one line of
    advice names the old and the new name."""
    notes: list[str] = []
    new = advise(args, notes.append)
    path = command_path(new)
    rest = new[len(path.split()):] if new[:len(path.split())] == path.split() else new[1:]   # 'rollout' runs 'run'
    ctx = _command(path).make_context(path.split()[-1], rest)
    assert ctx.params[param] == value
    assert len(notes) == 1 and notes[0].endswith("it works for now."), notes
    assert [a.split("=")[0] for a in args if a not in new][0] in notes[0]   # the old name (or value) is named


def test_every_alias_has_a_case():
    covered = {(command_path(c[0]), a.split("=")[0]) for c in CASES for a in c[0]}
    assert set(ALIASES) <= covered
    assert {(c, o) for c, o, _ in VALUE_ALIASES} <= covered and set(COMMAND_ALIASES) <= {tuple(c[0][:2]) for c in CASES}


def test_old_names_run_end_to_end_with_their_advice_on_stderr(tmp_path):
    """What is tested: through the real command line, an old name prints its note and the command runs as the new
    one (here refusing a bad value by the new name; bank build's old order reads its inputs the old way)."""
    r = CliRunner().invoke(app, ["fit", str(tmp_path / "p.jsonl"), "--states", str(tmp_path), "--out",
                                 str(tmp_path / "o"), "--reference", "nosuch"])
    assert r.exit_code == 2
    assert "note: --reference is now --guard-reference in fit; it works for now." in r.stderr
    assert "error:" in r.stderr and "--guard-reference" in r.stderr.split("error:")[1]
    r = CliRunner().invoke(app, ["bank", "build", str(tmp_path / "states"), "--pools", str(tmp_path / "p.jsonl"),
                                 "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and f"note: {order_advice('bank build')}" in r.stderr
    assert str(tmp_path / "p.jsonl") in r.stderr.split("error:")[1]    # read as the pools file


# ------------------------------------------------------------------------------------------- help at 80 columns
#: Names of the library's code that a help text must not show (a user cannot type them).
INTERNAL = ("export_dataset", "load_policy", "RolloutSettings", "SandboxLimits", "Sampling(", "Sampling.",
            "RecallKeep",
            "LinearScorer", "Sifter(", "_jobs", "_cli", "run_filter", "run_extract", "min_keep")
GROUPS = sorted({" ".join(path.split()[:i]) for path, _ in parameters(ROOT) for i in range(len(path.split()))})
COMMANDS = sorted({path for path, _ in parameters(ROOT)})


@pytest.mark.parametrize("path", GROUPS + COMMANDS)
def test_help_fits_80_columns_without_cut_names_or_internal_names(path):
    r = CliRunner().invoke(app, path.split() + ["--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "…" not in r.output, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80, r.output
    assert [w for w in INTERNAL if w in r.output] == [], r.output
    if path in COMMANDS:
        flat = " ".join(r.output.split())
        for p in _command(path).params:
            if not p.hidden and p.param_type_name == "option":
                assert all(o in flat for o in p.opts + p.secondary_opts), (path, p.opts)


def test_no_doc_writes_an_old_name_in_a_command_line():
    """What is tested: README.md and docs/*.md write each command with its new names (an old one works, but a
    reader copying it gets a note); a command line is a 'latentsift COMMAND' line and its continuation lines."""
    root = DOC.parents[1]
    old = []
    for doc in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        if doc == DOC:
            continue
        command = None
        for i, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            found = re.findall(r"latentsift ((?:bank|scorer|policy) \w+|\w+)", line)
            command = found[-1] if found else (command if line.startswith(" ") else None)
            if command is None:
                continue
            tokens = set(re.findall(r"--[\w-]+", line))
            where = f"{doc.relative_to(root)}:{i}"
            old += [f"{where}: {command} {name}" for (c, name) in ALIASES if c == command and name in tokens]
            old += [f"{where}: {c} {o}" for (c, o) in COMMAND_ALIASES if f"latentsift {c} {o}" in line]
    assert old == []
