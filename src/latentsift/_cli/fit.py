"""``latentsift fit``: a saved sifter from every labelled candidate of one or several pools files (parsing and printing only)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.filter import calibration_methods
from .._jobs.operating import FitOptions, fit_command
from .._jobs.sifter import method_line, method_names
from ._help import listed
from ._options import (CalibrationEpochs, CalibrationMethod, CalibrationStates, Confidence, FirstInstances,
                       GuardFalseAlarm, ScorerEpochs, Seed, StatesDirs, command_options)
from ._progress import messages

#: The declared defaults (FitOptions): the command line shows these.
_D = FitOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("fit", cls=listed(FitOptions, calibrations=calibration_methods, methods=method_names))(fit_cmd)


def fit_cmd(
    ctx: typer.Context,
    pools: List[Path] = typer.Argument(..., metavar="POOLS",
                                       help="Canonical JSONL of labelled candidates (every candidate has a "
                                       "reward); several files (runs) make one sifter."),
    states: StatesDirs = list(_D["states"]),
    out: Path = typer.Option(..., "--out", help="SIFTER_DIR to write (replaced only once complete)."),
    method: str = typer.Option(_D["method"], "--method", help="The method the sifter deploys, a registered filter: "
                               "{methods} (auto: the one with the best inner-CV within-pool AUC on these runs, ties "
                               "to the cheaper; a free rule needs no --states)."),
    scorer_epochs: ScorerEpochs = _D["scorer_epochs"],
    seed: Seed = _D["seed"],
    instances: FirstInstances = _D["instances"],
    per_agent: bool = typer.Option(_D["per_agent"], "--per-agent", help="Also keep a bank and scorer per agent (and "
                                   "per scaffold where they differ) for 'filter --bank-choice nearest'."),
    guard_false_alarm: GuardFalseAlarm = _D["guard_false_alarm"],
    guard_reference: str = typer.Option(_D["guard_reference"], "--guard-reference", help="The guard's in-bank "
                                        "reference: repo (each bank pool against the bank without its repository) or "
                                        "instance."),
    target_recall: Optional[float] = typer.Option(_D["target_recall"], "--target-recall", help="Also fit the "
                                                  "recall-targeted keep rule for pool recall R on --calibration and "
                                                  "save it as SIFTER_DIR/operating_point.json (docs/operating.md)."),
    calibration: Optional[Path] = typer.Option(_D["calibration"], "--calibration", help="Labelled pools JSONL for "
                                               "--target-recall."),
    calibration_states: CalibrationStates = _D["calibration_states"],
    confidence: Confidence = _D["confidence"],
    calibration_method: CalibrationMethod = _D["calibration_method"],
    calibration_epochs: CalibrationEpochs = _D["calibration_epochs"],
) -> None:
    """Fit the bank and the scorer on all given trajectories and save them as one sifter directory."""
    options = FitOptions(**command_options(ctx))  # every option checked here, before any file is read
    console = messages()
    sifter, rec = fit_command(options, log=console.print)
    ev = sifter.config_["evidence"].get("paper-distance_within_pool_auc")
    seen = sifter.seen_
    bank = "" if sifter.bank is None else ("; in-bank within-pool AUC of the distance branch "
                                           f"{'n/a' if ev is None else f'{ev:.3f}'}")
    console.print(f"[bold green]Sifter:[/] {out} ({seen['n_trajectories']} trajectories of {seen['n_instances']} "
                  f"instances; agents {seen['agents']}{bank})")
    console.print(method_line(sifter.config_))
    for sub in sifter.library_:
        console.print(f"  sub-bank {sub.name}: {sub.n_trajectories} trajectories {sub.label_counts}")
    for sk in sifter.library_skipped_:
        console.print(f"  [yellow]no sub-bank {sk['name']}: {sk['reason']}[/yellow]")
    if rec is not None:
        rule = rec["rule"]
        console.print(f"[bold green]Operating point:[/] {out / 'operating_point.json'} (threshold {rule['threshold']} "
                      f"({rule['threshold_meaning']}), {rule['n_calibration_pools']} calibration pools with a resolved "
                      f"candidate, {rec['calibration_pools']['how'].split(':')[0]}"
                      + (f"; not guaranteed: {'; '.join(rec['not_guaranteed'])}" if rec["not_guaranteed"] else "")
                      + ")")
