"""``latentsift bank build`` and ``latentsift scorer train``.

Parsing and progress only; the logic is ``latentsift._jobs.bank.build_bank`` and
``latentsift.sift.scorer.train_scorer``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .._core.guard import check_output
from .._core.io import output_lock
from .._core.validation import LatentSiftError
from .._jobs.bank import build_bank
from ..sift.scorer import CURVE_PNG, LinearScorer, train_scorer
from ._options import Channels, Seed, csv_list
from ._progress import StageProgress

bank_app = typer.Typer(add_completion=False, no_args_is_help=True,
                       help="Positive/negative banks of distance states.")
scorer_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="The learned linear scorer.")


def register(app: typer.Typer) -> None:
    app.add_typer(bank_app, name="bank")
    app.add_typer(scorer_app, name="scorer")


def _opt_choice(value: str) -> Optional[str]:
    return None if value.lower() == "none" else value


@bank_app.command("build")
def build_cmd(
    states_dir: Path = typer.Argument(..., help="STATES_DIR written by 'latentsift extract'."),
    pools: Path = typer.Option(..., "--pools", help="Canonical JSONL of the labelled bank trajectories."),
    out: Path = typer.Option(..., "--out", help="BANK_DIR to write (manifest.json + bank.safetensors)."),
    repos: Optional[str] = typer.Option(None, "--repos", help="Only these repositories (comma-separated)."),
    exclude_repos: Optional[str] = typer.Option(None, "--exclude-repos",
                                                help="Leave these repositories out (e.g. the evaluation ones)."),
    layer: int = typer.Option(-1, "--layer", help="Index into the stored layers for distance states "
                              "(-1 = final, the paper)."),
    normalize: str = typer.Option("none", "--normalize", help="none (paper), l2 or whiten (ZCA fitted on the bank)."),
    center: str = typer.Option("none", "--center", help="none (paper) or mean (subtract the bank mean)."),
    channels: Channels = "cot,obs,fn",
    backend: str = typer.Option("torch", "--backend", help="Nearest-neighbour backend: torch or faiss."),
) -> None:
    """Build positive and negative banks from stored states and outcome labels."""
    console = Console(stderr=True)
    if repos is not None and exclude_repos is not None:
        raise LatentSiftError("Pass either --repos or --exclude-repos, not both.")
    check_output(out, [states_dir, pools], kind="bank")
    params = dict(layer=layer, normalize=_opt_choice(normalize), center=_opt_choice(center),
                  channels=tuple(csv_list(channels) or ()), backend=backend)
    with output_lock(out), console.status("loading states and building the banks ..."):  # one writer per --out
        bank = build_bank(states_dir, pools, repos=csv_list(repos), exclude_repos=csv_list(exclude_repos), **params)
        bank.save(out)
    lc, sc = bank.label_counts(), bank.state_counts()
    console.print(f"bank: {lc['pos']} positive and {lc['neg']} negative trajectories from "
                  f"{len(bank.repo_names_)} repositories; states per channel: "
                  + ", ".join(f"{c} {v['pos']}+/{v['neg']}-" for c, v in sc.items()) + f". Written to {out}.")


@scorer_app.command("train")
def train_cmd(
    bank_dir: Path = typer.Argument(..., help="BANK_DIR from 'latentsift bank build'."),
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
    check_output(out, [bank_dir, states], kind="scorer")
    if not 0.0 <= val_frac < 1.0:
        raise LatentSiftError(f"--val-frac is the share of bank trajectories held out for validation and must "
                              f"lie in [0, 1) (the paper: 0.2). Got {val_frac:g} instead.")
    console = Console(stderr=True)
    scorer = LinearScorer(lr=lr, weight_decay=weight_decay, accumulation=accumulation, max_epochs=max_epochs,
                          val_frac=val_frac, seed=seed, init=init, patience=patience)
    scorer._check_params()  # every option refused before the bank and the states load
    with output_lock(out):  # a second 'scorer train' to the same --out is refused, not lost
        with StageProgress(console) as bar:
            bar.update("train", 0, max_epochs, "loading states ...")

            def progress(entry: dict) -> None:
                bar.update("train", entry["epoch"], max_epochs, f"train {entry['train_loss']:.4f}"
                           + (f"  val {entry['val_loss']:.4f}" if val_frac > 0 else ""))

            scorer = train_scorer(bank_dir, states_dir=states, scorer=scorer, callback=progress, log=bar.print)
        scorer.save(out)
    h0, hb = scorer.history_[0], scorer.history_[scorer.best_epoch_]
    kept = (f"kept epoch {scorer.best_epoch_}: val loss {hb['val_loss']:.4f} (init {h0['val_loss']:.4f}), "
            if scorer.val_ids_ else f"kept the last epoch, {scorer.best_epoch_} (no validation split): ")
    console.print(f"{kept}train loss {hb['train_loss']:.4f} (init {h0['train_loss']:.4f}) on "
                  f"{len(scorer.train_ids_)} trajectories. Curve: {out / CURVE_PNG}.")
