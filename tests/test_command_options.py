"""Generated from the declared options of the large commands (``latentsift._core.params``).

Every command with more than a dozen options (and ``filter``) has a settings object, a ``CommandOptions``,
whose fields are the command's parameters, each declared once with the values it allows. Here every
declared parameter gets a value its constraints refuse (``Param.bad_value``), given on the real command
line: exit code 2, one ``error:`` line naming the option as the user writes it, what it allows and the
value, and nothing written. Validation happens when the settings object is built, before any file is read
or model loaded, so the whole walk takes seconds.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import typer
from click.testing import CliRunner
from conftest import refused

from latentsift._cli._vocabulary import name_of, parameters as cli_parameters
from latentsift._core.params import Kind, options_classes, parameters
from latentsift.cli import app

ROOT = typer.main.get_command(app)
#: The command path of a settings object's command where they differ ('latentsift rollout' runs 'rollout run').
CLI_PATH = {"rollout": "rollout run"}
#: command -> a valid command line: {file} an (empty) existing file, {dir} an existing folder, {tmp} the output's.
BASE = {
    "filter": ["filter", "{file}", "--out", "{tmp}/f.json"],
    "extract": ["extract", "{file}", "--out", "{tmp}/s"],
    "evaluate": ["evaluate", "{file}", "--scores", "{file}", "--out", "{tmp}/r"],
    "verify": ["verify", "{file}", "--out", "{tmp}/v"],
    "fit": ["fit", "{file}", "--states", "{dir}", "--out", "{tmp}/s"],
    "crossval": ["crossval", "{file}", "--states", "{dir}", "--out", "{tmp}/c"],
    "premise": ["premise", "{file}", "--states", "{dir}", "--out", "{tmp}/p"],
    "reproduce": ["reproduce", "--data", "{dir}", "--out", "{tmp}/r"],
    "rollout": ["rollout", "{file}", "--out", "{tmp}/o"],
}
CLASSES = {cls.command: cls for cls in options_classes()}
CASES = [(command, name) for command, cls in sorted(CLASSES.items()) for name, p in parameters(cls).items()
         if p.bad_value() is not None]


def _command_params(command: str) -> dict[str, object]:
    path = CLI_PATH.get(command, command)
    return {p.name: p for cmd, p in cli_parameters(ROOT) if cmd == path}


def test_every_large_command_has_a_settings_object_with_every_option_declared_once():
    """Each command of more than 12 options (and filter) has one; its fields are exactly the command's
    parameters, each declared with the flag (or metavar) the command shows and the default it shows."""
    counts: dict[str, int] = {}
    for path, _ in cli_parameters(ROOT):
        counts[path] = counts.get(path, 0) + 1
    large = {path for path, n in counts.items() if n > 12} | {"filter"}
    have = {CLI_PATH.get(c, c) for c in CLASSES}
    assert large <= have, f"no settings object for {sorted(large - have)}"
    assert set(BASE) == set(CLASSES)
    for command, cls in CLASSES.items():
        declared = {name: p.flag for name, p in parameters(cls).items()}
        params = _command_params(command)
        assert declared == {name: name_of(p) for name, p in params.items()}, command
        defaults = cls.defaults()   # the command line's defaults are the declared ones; required where none is
        for name, p in params.items():
            assert p.required == (name not in defaults), (command, name)
            if name in defaults:
                got = p.default() if callable(p.default) else p.default
                want = defaults[name]
                assert (tuple(got) if isinstance(got, (list, tuple)) else got) == \
                    (tuple(want) if isinstance(want, (list, tuple)) else want), (command, name, got, want)


def test_no_default_is_written_in_a_command_signature():
    """Each parameter of a command with a settings object is required (``...``) or reads its default from the
    declaration by its own name (``_D["seed"]``, ``_D = FilterOptions.defaults()``): a default is written once,
    in the settings object, and the command line cannot drift from it."""
    for command, cls in CLASSES.items():
        cmd = ROOT
        for part in CLI_PATH.get(command, command).split():
            cmd = cmd.commands[part]
        fn = inspect.unwrap(cmd.callback)
        args = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].args
        defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults))
        assert set(defaults) == set(parameters(cls)), command
        for name, node in defaults.items():
            if isinstance(node, ast.Call):  # typer.Option(DEFAULT, "--flag", ...) / typer.Argument(DEFAULT, ...)
                node = node.args[0]
            if isinstance(node, ast.Constant) and node.value is Ellipsis:
                assert name not in cls.defaults(), (command, name)
                continue
            assert isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name), (command, name, ast.unparse(node))
            assert ast.literal_eval(node.slice) == name, (command, name, ast.unparse(node))
            assert fn.__globals__[node.value.id] == cls.defaults(), (command, name, node.value.id)


#: The options every value of which is valid (flags, outputs, names looked up in the inputs, state stores
#: a job opens after taking its output); any other option without an invalid value has lost its constraint.
FREE = {
    "crossval": ("--states", "--out", "--variants", "--agent-transfer", "--gen-test-key"),
    "evaluate": ("--scores", "--out", "--final-verifier", "--reference", "--exact", "--stop-when-single",
                 "--no-filter", "--headline", "--distributions"),
    "extract": ("--out", "--per-step"),
    "filter": ("--out", "--distance-only", "--learned-only"),
    "fit": ("--out", "--per-agent"),
    "premise": ("--states", "--proxy-states", "--out", "--gen-test-key"),
    "reproduce": ("--out", "--full", "--include-leaky", "--variants"),
    "rollout": ("--out", "--run"),
    "verify": ("--out", "--api-model", "--cache"),
}


def test_only_flags_outputs_and_names_have_no_invalid_value():
    """The parameters without an invalid value are exactly ``FREE``, each declared as any value of a type
    (``Kind``); removing another's constraint fails here (and a declaration without one refuses every value)."""
    free = {command: tuple(p.flag for p in parameters(cls).values() if p.bad_value() is None)
            for command, cls in sorted(CLASSES.items())}
    assert free == FREE
    for cls in CLASSES.values():
        for p in parameters(cls).values():
            if p.bad_value() is None:
                kinds = {type(getattr(c, "item", c)) for c in p.constraints if c is not None}
                assert kinds == {Kind}, p
    total = sum(len(parameters(cls)) for cls in CLASSES.values())
    assert len(CASES) == total - sum(map(len, FREE.values())) == 146, (len(CASES), total)


@pytest.mark.parametrize("command, name", CASES)
def test_an_invalid_value_of_every_declared_option_is_one_line_naming_it(tmp_path, command, name):
    p = parameters(CLASSES[command])[name]
    bad = p.bad_value()
    item = bad[0] if isinstance(bad, list) else bad
    (tmp_path / "in.jsonl").write_text("")
    (tmp_path / "in").mkdir()
    subs = {"{file}": str(tmp_path / "in.jsonl"), "{dir}": str(tmp_path / "in")}
    args = [subs.get(a, a.replace("{tmp}", str(tmp_path))) for a in BASE[command]]
    if p.flag.startswith("--"):
        args += [p.flag, str(item)]
    else:  # the positional input
        args[args.index(subs["{file}"])] = str(item)
    before = sorted(x.name for x in tmp_path.iterdir())
    r = CliRunner().invoke(ROOT, args)   # the command built once (typer rebuilds it on every invoke of app)
    refused(r, f"{command} ({p.flag}): {p.flag} must be ", "Got ")
    line = next(x for x in r.output.splitlines() if x.startswith("error: "))
    shown = line.partition("Got ")[2]
    assert shown.startswith(repr(str(item)) if isinstance(item, str) or not isinstance(item, (int, float))
                            else (repr(item), repr(float(item)))), line
    assert sorted(x.name for x in tmp_path.iterdir()) == before   # nothing written
