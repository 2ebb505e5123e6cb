"""The command line reads as click's: metavars (``PATH``, ``INTEGER``, ``[repo|agent|instance]``, ``POOLS...``),
not typer's annotations (``<list[Path]>``, ``<str>``), and the filter's tables fit the terminal's width."""
from __future__ import annotations

import json
import re

import pytest
from synthetic import write_single_policy
from typer.testing import CliRunner

from latentsift.cli import COMMANDS, app

#: Every command path (a group's subcommands by name).
PATHS = [p.split() for p in ("import", "extract", "filter", "evaluate", "verify", "reproduce", "crossval", "premise",
                             "fit", "explore", "transfer", "rollout run", "rollout export", "bank build",
                             "scorer train", "policy fetch", "policy check")]


def _help(*path: str) -> str:
    r = CliRunner().invoke(app, [*path, "--help"], prog_name="latentsift", env={"COLUMNS": "200"}, terminal_width=200)
    assert r.exit_code == 0, r.output
    return r.output


def test_every_command_is_listed_and_shown_with_click_metavars():
    assert {p[0] for p in PATHS} == set(COMMANDS)
    for path in PATHS:
        text = _help(*path)
        assert not re.search(r"<(list\[|str|int|float|path|Path)", text), (path, text)
        assert not re.search(r"\{[A-Z_]+\}", text.splitlines()[0]), (path, text)   # typer's {POOLS}...


def test_metavars_name_the_type_the_choices_and_the_repeat():
    text = _help("crossval")
    assert text.splitlines()[0] == "Usage: latentsift crossval [OPTIONS] POOLS..."
    for shown in ("POOLS...  ", "--states PATH ", "--out PATH ", "--group-by [repo|agent|instance]",
                  "--folds INTEGER ", "--guard-false-alarm FLOAT ", "--gen-test-key TEXT "):
        assert shown in text, shown
    text = _help("import")
    assert "--format [auto|canonical|r2egym|...]" in text      # the first words where they are many
    assert "--labels PATH " in text and "INPUT...  " in text
    assert _help("rollout", "run").splitlines()[0] == "Usage: latentsift rollout run [OPTIONS] [TASKS]"
    assert "--dtype [auto|bfloat16|float16|float32]" in _help("extract")


@pytest.fixture(scope="module")
def filtered(tmp_path_factory):
    """A fitted sifter and new pools of another agent: (filter's arguments but --out, the output folder)."""
    d = tmp_path_factory.mktemp("width")
    pools, states = write_single_policy(d / "bank", n_instances=8, k=4, agent="a-rather-long-agent-name")
    r = CliRunner().invoke(app, ["fit", str(pools), "--states", str(states), "--out", str(d / "sifter"),
                                 "--scorer-epochs", "2"])
    assert r.exit_code == 0, r.output
    pools, states = write_single_policy(d / "new", n_instances=3, k=4, agent="another-agent-with-a-long-name",
                                        prefix="Other", seed=1)
    return ["filter", str(pools), "--sifter", str(d / "sifter"), "--states", str(states)], d


@pytest.mark.parametrize("columns", [80, 200])
def test_filter_tables_fit_the_terminal(filtered, columns):
    args, d = filtered
    out = d / f"f{columns}.json"
    r = CliRunner().invoke(app, [*args, "--out", str(out)], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    tables = [n for n, line in enumerate(lines) if re.match(r"Other/\d: keep \d of 4", line)]
    assert len(tables) == 3
    for n in tables:      # title, blank, header, rule, one or more lines per candidate, blank
        block = lines[n:n + 4]
        assert all(len(line) <= columns for line in block), block
        header = block[2].split()
        assert header[0] == "candidate" and header[-2:] == ["s", "kept"]
    body = lines[tables[0] + 4:tables[1]]
    assert all(len(line) <= columns for line in body), body
    pool = json.loads(out.read_text())["pools"][0]
    best = max(pool["candidates"], key=lambda c: c["s"])
    ids = "".join(line.split()[0] for line in body if line.strip() and not line.startswith("("))
    assert ids.startswith(best["traj_id"])       # an id too long for its column folds, whole, onto the next line
    if columns == 200:
        assert "q_cot" in lines[tables[0] + 2] and "r_fn" in lines[tables[0] + 2]
        assert "left out" not in r.output
    else:
        assert "q_cot" not in lines[tables[0] + 2]
        assert "(columns q_cot, q_fn, q_obs, r_cot, r_fn, r_obs left out to fit 80 columns" in r.output
