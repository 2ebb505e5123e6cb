"""The ``latentsift`` command line: argument parsing and progress only; logic lives in the library.

Each command group lives in ``latentsift._cli.<name>`` and exposes ``register(app)``.
"""
from __future__ import annotations

import importlib
import sys

import typer

from ._validation import LatentSiftError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="LatentSift: token-free Stage-1 filtering of SWE-agent candidates.")

_COMMANDS = ("import_", "extract", "bank", "filter", "evaluate", "reproduce", "crossval", "fit",
             "explore", "transfer")
for _name in _COMMANDS:
    try:
        _mod = importlib.import_module(f"latentsift._cli.{_name}")
    except ModuleNotFoundError as e:  # a command group not written yet
        if e.name != f"latentsift._cli.{_name}":
            raise
        continue
    _mod.register(app)


def main() -> None:  # pragma: no cover - thin wrapper
    try:
        app()
    except LatentSiftError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
