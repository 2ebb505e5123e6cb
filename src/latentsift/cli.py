"""The ``latentsift`` command line: argument parsing and progress only; logic lives in the library.

Each command group lives in ``latentsift._cli.<module>`` and exposes ``register(app)``. The top-level group
(:data:`COMMANDS`: each command's module and one-line summary) imports a command's module only when that
command is run or its help is shown (click's lazily loaded subcommands): ``latentsift --help``,
``--version`` and one command's argument error import no other command's library, and a model's libraries
(torch, transformers) load only in the commands that run one. This by-name import is the command line's
dispatch, as ``_core.registry`` loads plugins by name; every module it names is in ``COMMANDS``, and
tests/test_imports.py reads its edges from there.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from importlib.metadata import version as _version

import click
import typer
from typer.core import TyperGroup

from ._cli._vocabulary import advise, in_option_words
from ._core.errors import LatentSiftError, user_message

#: command -> (its module in ``latentsift._cli``, its line in ``latentsift --help``), in the help's order.
COMMANDS: dict[str, tuple[str, str]] = {
    "import": ("import_", "Import trajectories into canonical JSONL and print a summary."),
    "extract": ("extract", "Replay trajectories through the policy; store hidden states."),
    "filter": ("filter", "Score candidate pools (LatentSift or a baseline); keep the best."),
    "evaluate": ("evaluate", "The four-stage cascade for every Stage-1 filter, and its report."),
    "verify": ("evaluate", "Score trajectories with the execution-free verifier."),
    "reproduce": ("reproduce", "The paper's pipeline on the shared SWE-bench Lite pools."),
    "crossval": ("crossval", "Cross-validate LatentSift and baselines on your labelled pools."),
    "premise": ("premise", "Do the policy's own states beat length?"),
    "fit": ("fit", "Fit bank, scorer and shift guard on labelled pools as one sifter."),
    "explore": ("explore", "Write a static HTML site of a filter's pools and evidence."),
    "transfer": ("transfer", "Banks from other agents on each agent's pools."),
    "rollout": ("rollout", "The policy as a small coding agent, and its shareable dataset."),
    "bank": ("bank", "Positive/negative banks of distance states."),
    "scorer": ("bank", "The learned linear scorer."),
    "policy": ("policy", "Code policies pinned on PyPI: fetch and check."),
}
#: Commands built so far (each built once per process, whichever group asks).
_BUILT: dict[str, click.Command] = {}


def _built(name: str) -> click.Command:
    """The click command ``name``: its module imported and registered on an app of its own."""
    if name not in _BUILT:
        module = importlib.import_module(f"{__package__}._cli.{COMMANDS[name][0]}")
        own = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)
        own.callback()(lambda: None)
        module.register(own)
        _BUILT.update(typer.main.get_group(own).commands)
    return _BUILT[name]


class _Lazy(Mapping):
    """The group's commands by name: a command is built on first access (``_built``)."""

    def __getitem__(self, name: str) -> click.Command:
        if name not in COMMANDS:
            raise KeyError(name)
        return _built(name)

    def __iter__(self):
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class _Commands(TyperGroup):
    """The top-level group: an error the user can fix (``_core.errors.user_message``) becomes one line on
    stderr and exit code 2, for every command (also under ``CliRunner``); a bug keeps its traceback. Its
    commands are :data:`COMMANDS`, each imported when it is run or its help shown; ``latentsift --help``
    lists their summaries from there."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = _Lazy()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in COMMANDS.items()])

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Old option names become new ones, with one line of advice each (``_cli._vocabulary``). Refuse
        ``--k 4 8`` in one line: an option given once per value (``--k 4 --k 8``) would take the
        4, and the command would read the 8 as one of its files (any repeatable option followed by two
        numbers: none of ours takes a number and then a positional one)."""
        try:
            args = advise(args, lambda line: typer.secho(f"note: {line}", fg="yellow", err=True))
        except LatentSiftError as e:   # an old name beside its new one with another value
            _report(e)
            ctx.exit(2)
        command = self.get_command(ctx, args[0]) if args else None
        if command is not None:
            repeat = {o for p in command.params if getattr(p, "multiple", False) for o in getattr(p, "opts", ())}
            for i, a in enumerate(args[:-2]):
                if a in repeat and _number(args[i + 1]) and _number(args[i + 2]):
                    x, y = args[i + 1], args[i + 2]
                    _report(LatentSiftError(f"{a} takes one value per flag: write {a} {x} {a} {y}, not {a} {x} {y}."))
                    ctx.exit(2)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - mapped or re-raised unchanged
            if not _report(e):
                raise
            ctx.exit(2)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _report(e: BaseException) -> bool:
    """Print the one-line message of a user-fixable error (``_core.errors.user_message``); False for a bug."""
    message = user_message(e)
    if message is None:
        return False
    typer.secho(f"error: {' '.join(in_option_words(message).split())}", fg="red", err=True)
    return True


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # click's layout wraps at any width; rich's cut long names with an ellipsis
                  help="LatentSift: token-free Stage-1 filtering of SWE-agent candidates.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"{__package__} {_version(__package__)}")
        raise typer.Exit()


@app.callback()
def _top(version: bool = typer.Option(False, "--version", is_eager=True, expose_value=False,
                                      callback=_print_version, help="Print the version and exit.")) -> None:
    """LatentSift: token-free Stage-1 filtering of SWE-agent candidates."""


def main() -> None:  # pragma: no cover - thin wrapper
    try:
        app()
    except Exception as e:  # an error raised outside a command (e.g. while parsing)
        if not _report(e):
            raise
        sys.exit(2)


if __name__ == "__main__":
    main()
