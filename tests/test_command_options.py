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

from types import SimpleNamespace

import pytest
import typer
from click.testing import CliRunner
from conftest import refused

from latentsift._cli._vocabulary import name_of, parameters as cli_parameters
from latentsift._core.params import Kind, options_classes, parameters
from latentsift._core.registry import registry_add, registry_remove
from latentsift.cli import app

ROOT = typer.main.get_command(app)
dict(ROOT.commands)   # the command line imports a command's module when it runs: here every one, for its settings
#: The command path of a settings object's command where they differ ('latentsift rollout' runs 'rollout run').
CLI_PATH = {"rollout": "rollout run"}
#: command -> a valid command line: {file} an (empty) existing file, {dir} an existing folder, {tmp} the output's.
BASE = {
    "filter": ["filter", "{file}", "--out", "{tmp}/f.json"],
    "extract": ["extract", "{file}", "--out", "{tmp}/s"],
    "evaluate": ["evaluate", "{file}", "--scores", "{file}", "--out", "{tmp}/r"],
    "verify": ["verify", "{file}", "--out", "{tmp}/v"],
    "fit": ["fit", "{file}", "--method", "shortest-chars", "--out", "{tmp}/s"],
    "crossval": ["crossval", "{file}", "--states", "{dir}", "--out", "{tmp}/c"],
    "premise": ["premise", "{file}", "--states", "{dir}", "--out", "{tmp}/p"],
    "reproduce": ["reproduce", "--data", "{dir}", "--out", "{tmp}/r"],
    "rollout": ["rollout", "{file}", "--out", "{tmp}/o"],
    "transfer": ["transfer", "{file}", "--states", "{dir}", "--out", "{tmp}/t"],
}
CLASSES = {cls.command: cls for cls in options_classes()}
CASES = [(command, name) for command, cls in sorted(CLASSES.items()) for name, p in parameters(cls).items()
         if p.bad_value() is not None]


def _click_command(command: str):
    """The click command of a settings object's command."""
    cmd = ROOT
    for part in CLI_PATH.get(command, command).split():
        cmd = cmd.commands[part]
    return cmd


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
        fn = inspect.unwrap(_click_command(command).callback)
        args = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].args
        defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults))
        assert set(defaults) == set(parameters(cls)), command
        for name, node in defaults.items():
            if isinstance(node, ast.Call):  # typer.Option(DEFAULT, "--flag", ...) / typer.Argument(DEFAULT, ...)
                node = node.args[0]
            if isinstance(node, ast.Constant) and node.value is Ellipsis:
                assert name not in cls.defaults(), (command, name)
                continue
            shown = (command, name, ast.unparse(node))
            assert isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name), shown
            assert ast.literal_eval(node.slice) == name, shown
            assert fn.__globals__[node.value.id] == cls.defaults(), (command, name, node.value.id)


#: (command, the rule's place in its ``rules``) -> options that break that rule and no earlier one, added to ``BASE``.
RULE_CASES = {
    ("extract", 0): ["--per-step", "--renderer", "test-plain"],  # a renderer registered by the test
    ("extract", 1): ["--device-map", "auto", "--device", "cpu"],
    ("filter", 0): ["--distance-only", "--learned-only"],
    ("filter", 1): ["--ray", "local", "--approx", "ivf"],
    ("filter", 2): ["--bank-choice", "nearest"],
    ("filter", 3): ["--sifter", "{dir}", "--bank", "{dir}"],
    ("filter", 4): ["--sifter", "{dir}", "--bank-shards", "2"],
    ("filter", 5): ["--sifter", "{dir}", "--distance", "pos", "--fusion-weight", "0.2"],
    ("filter", 6): ["--cost", "tokens"],
    ("filter", 7): ["--max-keep", "2"],
    ("filter", 8): ["--target-recall", "0.9", "--min-keep", "3", "--max-keep", "2"],
    ("fit", 0): ["--states", "{dir}", "--states", "{dir}", "--target-recall", "0.9"],
    ("fit", 1): ["--method", "variant:probe"],   # a state method without --states
}


def _plain_renderer(traj, tokenizer, **settings):
    """A renderer for ``extract --renderer test-plain`` (never called: the rule refuses first)."""
    raise AssertionError("not reached")


def _args(command: str, tmp_path, extra=()) -> list[str]:
    (tmp_path / "in.jsonl").write_text("")
    (tmp_path / "in").mkdir(exist_ok=True)
    subs = {"{file}": str(tmp_path / "in.jsonl"), "{dir}": str(tmp_path / "in")}
    return [subs.get(a, a.replace("{tmp}", str(tmp_path))) for a in [*BASE[command], *extra]]


def test_every_declared_rule_has_a_case():
    assert set(RULE_CASES) == {(command, i) for command, cls in CLASSES.items() for i in range(len(cls.rules))}


@pytest.mark.parametrize("command, i", sorted(RULE_CASES))
def test_a_broken_rule_of_every_command_is_its_one_line(tmp_path, command, i):
    """Each declared cross-option rule, broken on the real command line: exit code 2, its message as the one
    ``error:`` line (a message that names the values: as the rule writes it for the parsed options), nothing
    written."""
    rule = CLASSES[command].rules[i]
    args = _args(command, tmp_path, RULE_CASES[command, i])
    path = CLI_PATH.get(command, command).split()
    params = _click_command(command).make_context(path[-1], args[len(path):]).params
    message = rule.message(SimpleNamespace(**params)) if callable(rule.message) else rule.message
    before = sorted(x.name for x in tmp_path.iterdir())
    registry_add("renderer", "test-plain", _plain_renderer)
    try:
        r = CliRunner().invoke(ROOT, args)
    finally:
        registry_remove("renderer", "test-plain")
    refused(r)
    assert f"error: {' '.join(message.split())}" in r.output.splitlines(), (r.output, message)
    assert sorted(x.name for x in tmp_path.iterdir()) == before   # nothing written


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
    "transfer": ("--states", "--out"),
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
    assert len(CASES) == total - sum(map(len, FREE.values())) == 155, (len(CASES), total)


@pytest.mark.parametrize("command, name", CASES)
def test_an_invalid_value_of_every_declared_option_is_one_line_naming_it(tmp_path, command, name):
    p = parameters(CLASSES[command])[name]
    bad = p.bad_value()
    item = bad[0] if isinstance(bad, list) else bad
    args = _args(command, tmp_path)
    if p.flag.startswith("--"):
        args += [p.flag, str(item)]
    else:  # the positional input
        args[args.index(str(tmp_path / "in.jsonl"))] = str(item)
    before = sorted(x.name for x in tmp_path.iterdir())
    r = CliRunner().invoke(ROOT, args)   # the command built once (typer rebuilds it on every invoke of app)
    refused(r, f"{command} ({p.flag}): {p.flag} must be ", "Got ")
    line = next(x for x in r.output.splitlines() if x.startswith("error: "))
    shown = line.partition("Got ")[2]
    assert shown.startswith(repr(str(item)) if isinstance(item, str) or not isinstance(item, (int, float))
                            else (repr(item), repr(float(item)))), line
    assert sorted(x.name for x in tmp_path.iterdir()) == before   # nothing written
