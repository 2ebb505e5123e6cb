"""``latentsift premise``: the premise test on one policy's pools (parsing and progress only)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.premise import PremiseOptions, premise_command
from ._options import Boot, Draws, Folds, Ks, ScorerEpochs, Seed, TestgenTokens, command_options
from ._help import listed
from ._progress import StageProgress, messages

#: The declared defaults (PremiseOptions): the command line shows these.
_D = PremiseOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("premise", cls=listed(PremiseOptions))(premise_cmd)


def premise_cmd(
    ctx: typer.Context,
    pools: Path = typer.Argument(..., metavar="POOLS",
                                 help="Canonical JSONL of one policy's labelled candidate pools."),
    states: List[Path] = typer.Option(..., "--states", help="STATES_DIR of the policy's own states of these "
                                      "candidates (repeat for the stores of several rollout shards)."),
    proxy_states: Optional[List[Path]] = typer.Option(_D["proxy_states"], "--proxy-states", help="STATES_DIR of the "
                                                      "SAME candidates encoded by another model (e.g. SmolLM2 "
                                                      "replay): adds own - proxy (repeat for several stores)."),
    out: Path = typer.Option(..., "--out", help="Folder for own/ and proxy/ (crossval runs), summary.json and "
                             "report.md."),
    group_by: str = typer.Option(_D["group_by"], "--group-by", help="Disjoint folds by instance (task; the premise's "
                                 "rule), repo or agent."),
    folds: Folds = _D["folds"],
    k: Ks = _D["k"],
    draws: Draws = _D["draws"],
    boot: Boot = _D["boot"],
    scorer_epochs: ScorerEpochs = _D["scorer_epochs"],
    seed: Seed = _D["seed"],
    verifier: Optional[Path] = typer.Option(_D["verifier"], "--verifier", help="Final-verifier results (folder or "
                                            "verdicts.jsonl) for the cascade's Stage 4 (default: none)."),
    gen_test_key: Optional[str] = typer.Option(_D["gen_test_key"], "--gen-test-key", help="The trajectories' "
                                               "'tests' key holding each candidate's generated-test score: the "
                                               "cascade's Stage 3. Default: examples_passed (the rollouts' docstring "
                                               "examples) when the candidates hold it, else no Stage 3 scores."),
    testgen_tokens: TestgenTokens = _D["testgen_tokens"],
) -> None:
    """Do the policy's own states beat length? Within-pool AUC of the paper's method, its branches and the probe
    against the length rules, stack:length, pure length (code chars, generated tokens), the docstring examples' pass
    share and random; retention@K; verifier calls at R = 0.9, 0.95; own - proxy."""
    options = PremiseOptions(**command_options(ctx))  # every option checked here, before any file is read
    console = messages()
    with StageProgress(console) as bar:
        report = premise_command(options, log=bar.print, progress=bar.update)
    console.print(f"[bold green]Report:[/] {report / 'report.md'} (summary.json beside it)")
