"""Typer options shared by the commands: one flag name, type and help text per option, defined once.

Each is an ``Annotated`` type; a command declares ``seed: Seed = _D["seed"]``, its default read from the
declaration in its settings object (``_D = CrossvalOptions.defaults()``, ``latentsift._core.params``), so
the same option reads the same in every command's ``--help`` and a default is written once::

    def crossval_cmd(states: StatesDirs, folds: Folds = _D["folds"], k: Ks = _D["k"], seed: Seed = _D["seed"]): ...

An option whose help differs between commands (``--out``) stays in its command; each name has one meaning
in every command (``_vocabulary.MEANINGS``, docs/cli-vocabulary.md).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from .._jobs.crossval import TARGET_RECALLS
from .._jobs.extract import AUTO_DTYPE, DTYPES

# --- inputs -------------------------------------------------------------------------------------
StatesDirs = Annotated[List[Path], typer.Option(
    "--states", help="STATES_DIR holding the candidates' states ('latentsift extract'); repeat for several "
                     "stores of the same model and settings.")]
StatesDir = Annotated[Optional[Path], typer.Option(
    "--states", help="STATES_DIR holding the candidates' states ('latentsift extract').")]
FirstInstances = Annotated[Optional[int], typer.Option(
    "--max-instances", help="Only the first N instances, in instance-id order.")]
Channels = Annotated[str, typer.Option("--channels", help="Channels, comma-separated: cot, obs, fn.")]

# --- the evaluation protocol --------------------------------------------------------------------
Folds = Annotated[int, typer.Option("--folds", help="Number of disjoint folds: no bank holds a repository (or "
                                                    "the group of --group-by) of the pools it scores.")]
Ks = Annotated[List[int], typer.Option("--k", help="K values: candidates drawn per instance (repeat).")]
Draws = Annotated[int, typer.Option("--draws", help="Seeded draws of K candidates per instance and K.")]
Boot = Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples of instances for the intervals.")]
ScorerEpochs = Annotated[int, typer.Option("--scorer-epochs", help="Epochs of the gated linear scorer (0 = the "
                                                                   "distance branch only).")]
Variants = Annotated[bool, typer.Option("--variants/--no-variants", help="Also evaluate the beyond-paper "
                                                                         "variants and the inner-CV default.")]
GuardFalseAlarm = Annotated[float, typer.Option(
    "--guard-false-alarm", help="The shift guard's stated false-alarm rate: its threshold is the 1 - RATE quantile "
                                "of the bank's own pools (each fold bank's in crossval, which measures the actual "
                                "rates).")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the draws, splits, shuffling and tie rule.")]
GenTestKey = Annotated[Optional[str], typer.Option(
    "--gen-test-key", help="The trajectories' 'tests' key holding each candidate's generated-test score: the "
                           "cascade's Stage 3 (rollouts: examples_passed, the docstring's examples, which cost no "
                           "generation tokens). Default: no Stage 3 scores.")]
TestgenTokens = Annotated[float, typer.Option(
    "--testgen-tokens", help="Tokens charged per pool when Stage 3 is reached (writing its tests).")]
TargetRecalls = Annotated[Optional[List[float]], typer.Option(
    "--target-recall", help="Target pool recalls of the operating-points evaluation (repeat; default "
                            f"{', '.join(f'{r:g}' for r in TARGET_RECALLS)}); the paper's selection stays the "
                            "report's default.")]

# --- the calibration of a recall-targeted keep rule (filter and fit --target-recall) --------------
CalibrationStates = Annotated[Optional[Path], typer.Option(
    "--calibration-states", help="States of the calibration candidates (default: the --states store).")]
Confidence = Annotated[Optional[float], typer.Option(
    "--confidence", help="With --target-recall: the high-probability mode, P(pool recall >= R) >= this (1 - delta; "
                         "Learn then Test), instead of expected pool recall >= R. Needs more calibration pools "
                         "(printed).")]
CalibrationMethod = Annotated[str, typer.Option(
    "--calibration-method", help="Score -> P(resolved) map, a registered calibration method: "
                                 "{calibrations}.")]
CalibrationEpochs = Annotated[int, typer.Option(
    "--calibration-epochs", help="Scorer epochs per half when the calibration pools are in the bank (cross-fitted "
                                 "over two repository halves).")]

# --- the policy model ---------------------------------------------------------------------------
Model = Annotated[Optional[Path], typer.Option(
    "--model", help="Local HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct GGUF).")]
Dtype = Annotated[str, typer.Option(
    "--dtype", help=f"Model dtype: {AUTO_DTYPE} (bfloat16 on CUDA and on CPUs with native bf16, else float32), "
                    + ", ".join(DTYPES) + ".")]
Device = Annotated[Optional[str], typer.Option(
    "--device", help="cpu or cuda (default: cuda when present).")]
Threads = Annotated[Optional[int], typer.Option(
    "--threads", help="torch CPU threads (default: torch's choice): the model runs that many trajectories or "
                      "prompts at once, each at one thread, so results do not depend on it; 1 is faster on a "
                      "machine shared with other jobs.")]


def command_options(ctx: typer.Context) -> dict:
    """The options of the running command as parsed (parameter name -> value): what its settings object is
    built from (its fields bear the command's parameter names)."""
    return dict(ctx.params)


def csv_list(value: Optional[str]) -> Optional[list[str]]:
    """A comma-separated option value as a list of its non-empty items (None stays None)."""
    if value is None:
        return None
    return [x.strip() for x in value.split(",") if x.strip()]
