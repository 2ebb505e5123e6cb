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
from ._core.errors import user_message


class _Commands(TyperGroup):
    """The top-level group: an error the user can fix (``_core.errors.user_message``) becomes one line on
    stderr and exit code 2, for every command (also under ``CliRunner``); a bug keeps its traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - mapped or re-raised unchanged
            if not _report(e):
                raise
            ctx.exit(2)


def _report(e: BaseException) -> bool:
    """Print the one-line message of a user-fixable error (``_core.errors.user_message``); False for a bug."""
    message = user_message(e)
    if message is None:
        return False
    typer.secho(f"error: {' '.join(message.split())}", fg="red", err=True)
    return True


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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
