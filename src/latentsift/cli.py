"""The ``latentsift`` command line: argument parsing and progress only; logic lives in the library.

Each command group lives in ``latentsift._cli.<name>`` and exposes ``register(app)``.
"""
from __future__ import annotations

import sys

import click
import typer
from typer.core import TyperGroup

from ._cli import (bank, crossval, evaluate, explore, extract, fit, import_, policy, premise, reproduce, rollout,
                   transfer)
from ._cli import filter as filter_
from ._cli._vocabulary import advise
from ._core.errors import user_message
from ._core.validation import LatentSiftError


class _Commands(TyperGroup):
    """The top-level group: an error the user can fix (``_core.errors.user_message``) becomes one line on
    stderr and exit code 2, for every command (also under ``CliRunner``); a bug keeps its traceback."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Old option names become new ones, with one line of advice each (``_cli._vocabulary``). Refuse
        ``--k 4 8`` in one line: an option given once per value (``--k 4 --k 8``) would take the
        4, and the command would read the 8 as one of its files (any repeatable option followed by two
        numbers: none of ours takes a number and then a positional one)."""
        args = advise(args, lambda line: typer.secho(f"note: {line}", fg="yellow", err=True))
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
    typer.secho(f"error: {' '.join(message.split())}", fg="red", err=True)
    return True


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # click's layout wraps at any width; rich's cut long names with an ellipsis
                  help="LatentSift: token-free Stage-1 filtering of SWE-agent candidates.")

for _commands in (import_, extract, rollout, bank, filter_, evaluate, reproduce, crossval, premise, fit, explore,
                  transfer, policy):
    _commands.register(app)


def main() -> None:  # pragma: no cover - thin wrapper
    try:
        app()
    except Exception as e:  # an error raised outside a command (e.g. while parsing)
        if not _report(e):
            raise
        sys.exit(2)


if __name__ == "__main__":
    main()
