"""``latentsift bank build`` and ``latentsift scorer train``.

Parsing and progress only; the logic is ``latentsift._jobs.bank`` and ``latentsift._jobs.scorer``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .._jobs.bank import TORCH_KNN, build_bank_to_file, knn_backends
from ._help import listed
from .._jobs.scorer import CURVE_PNG, train_scorer_to_file
from .._core.validation import LatentSiftError
from ._options import Channels, Seed, StatesDir, csv_list
from ._vocabulary import ORDER_ALIASES, order_advice
from ._progress import StageProgress, messages

bank_app = typer.Typer(add_completion=False, no_args_is_help=True,
                       help="Positive/negative banks of distance states.")
scorer_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="The learned linear scorer.")


def register(app: typer.Typer) -> None:
    app.add_typer(bank_app, name="bank")
    app.add_typer(scorer_app, name="scorer")


def _opt_choice(value: str) -> Optional[str]:
    return None if value.lower() == "none" else value


@bank_app.command("build", cls=listed(knn_backends=knn_backends))
def build_cmd(
    pools: Path = typer.Argument(..., metavar="POOLS", help="Canonical JSONL of the labelled bank trajectories."),
    states: StatesDir = None,
    old_pools: Optional[Path] = typer.Option(None, "--pools", hidden=True),
    out: Path = typer.Option(..., "--out", help="BANK_DIR to write (manifest.json + bank.safetensors)."),
    repos: Optional[str] = typer.Option(None, "--repos", help="Only these repositories (comma-separated)."),
    exclude_repos: Optional[str] = typer.Option(None, "--exclude-repos",
                                                help="Leave these repositories out (e.g. the evaluation ones)."),
    layer: int = typer.Option(-1, "--layer", help="Index into the stored layers for distance states "
                              "(-1 = final, the paper)."),
    normalize: str = typer.Option("none", "--normalize", help="none (paper), l2 or whiten (ZCA fitted on the bank)."),
    center: str = typer.Option("none", "--center", help="none (paper) or mean (subtract the bank mean)."),
    channels: Channels = "cot,obs,fn",
    backend: str = typer.Option(TORCH_KNN, "--backend", help="Nearest-neighbour backend: {knn_backends}."),
) -> None:
    """Build positive and negative banks from stored states and outcome labels."""
    console = messages()
    if old_pools is not None and states is not None:   # the old order's first argument is the states: one is lost
        old, new = ORDER_ALIASES["bank build"]
        raise LatentSiftError(f"bank build: --pools belongs to the old order ({old}), whose first argument is the "
                              f"states; with --states {states} give the new one ({new}), without --pools.")
    if old_pools is not None:   # the old order: STATES_DIR --pools POOLS
        typer.secho(f"note: {order_advice('bank build')}", fg="yellow", err=True)
        states, pools = pools, old_pools
    if states is None:
        raise LatentSiftError("bank build needs --states STATES_DIR (the store of these trajectories' states).")
    params = dict(layer=layer, normalize=_opt_choice(normalize), center=_opt_choice(center),
                  channels=tuple(csv_list(channels) or ()), backend=backend)
    with console.status("loading states and building the banks ..."):
        bank = build_bank_to_file(states, pools, out, repos=csv_list(repos), exclude_repos=csv_list(exclude_repos),
                                  **params)
    lc, sc = bank.label_counts(), bank.state_counts()
    console.print(f"bank: {lc['pos']} positive and {lc['neg']} negative trajectories from "
                  f"{len(bank.repo_names_)} repositories; states per channel: "
                  + ", ".join(f"{c} {v['pos']}+/{v['neg']}-" for c, v in sc.items()) + f". Written to {out}.")


@scorer_app.command("train", cls=listed())
def train_cmd(
    bank_dir: Path = typer.Argument(..., metavar="BANK_DIR", help="BANK_DIR from 'latentsift bank build'."),
    out: Path = typer.Option(..., "--out", help="SCORER_DIR to write (scorer.json, scorer.safetensors, PNG)."),
    states: Optional[Path] = typer.Option(None, "--states", help="STATES_DIR (default: the one the bank was "
                                          "built from)."),
    lr: float = typer.Option(3e-6, "--lr", help="AdamW learning rate."),
    weight_decay: float = typer.Option(1e-5, "--weight-decay", help="AdamW weight decay."),
    accumulation: int = typer.Option(16, "--accumulation", help="Trajectories per optimizer step."),
    max_epochs: int = typer.Option(40, "--max-epochs", help="At most this many epochs."),
    val_frac: float = typer.Option(0.2, "--val-frac", help="Validation fraction of the bank trajectories."),
    seed: Seed = 0,
    init: str = typer.Option("zeros", "--init", help="zeros (W = 0, bias at the base-rate logit) or torch."),
    patience: Optional[int] = typer.Option(None, "--patience", help="Stop after N epochs without a better "
                                           "validation loss (default: never)."),
) -> None:
    """Train the gated linear scorer on the bank trajectories; keep the best validation checkpoint."""
    console = messages()
    with StageProgress(console) as bar:
        bar.update("train", 0, max_epochs, "loading states ...")

        def progress(entry: dict) -> None:
            bar.update("train", entry["epoch"], max_epochs, f"train {entry['train_loss']:.4f}"
                       + (f"  val {entry['val_loss']:.4f}" if val_frac > 0 else ""))

        scorer = train_scorer_to_file(bank_dir, out, states_dir=states, callback=progress, log=bar.print, lr=lr,
                                      weight_decay=weight_decay, accumulation=accumulation, max_epochs=max_epochs,
                                      val_frac=val_frac, seed=seed, init=init, patience=patience)
    h0, hb = scorer.history_[0], scorer.history_[scorer.best_epoch_]
    kept = (f"kept epoch {scorer.best_epoch_}: val loss {hb['val_loss']:.4f} (init {h0['val_loss']:.4f}), "
            if scorer.val_ids_ else f"kept the last epoch, {scorer.best_epoch_} (no validation split): ")
    console.print(f"{kept}train loss {hb['train_loss']:.4f} (init {h0['train_loss']:.4f}) on "
                  f"{len(scorer.train_ids_)} trajectories. Curve: {out / CURVE_PNG}.")
