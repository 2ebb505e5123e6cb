"""``latentsift rollout`` and ``latentsift rollout export``: the options checked, then the work of the
own-policy wing (``latentsift.rollout``: tasks, sandbox, the agent loop, the folder and its export)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Callable, ClassVar

from .._core.outputs import owned_output
from .._core.params import (DEVICE, OUT, POSITIVE, SEED, CommandOptions, ExistingPath, Interval, Kind, Matches, OneOf,
                            Registered, option)
from .._core.registry import registry_find
from .._core.validation import LatentSiftError
from ..rollout.agent import RolloutSettings
from ..rollout.folder import SUBPROCESS_SANDBOX, RolloutReport, check_resume, export_dataset, run_rollouts, sandboxes
from ..rollout.sandbox import SandboxLimits
from ..rollout.tasks import HUMANEVAL_SOURCE, task_sources
from ..states.model import AUTO_DTYPE, DTYPES, check_device, default_model_path, load_policy
from ..states.model_files import check_model_path, context_length_of

__all__ = ["AUTO_DTYPE", "HUMANEVAL_SOURCE", "SUBPROCESS_SANDBOX", "RolloutOptions", "RolloutSettings",
           "export_dataset", "parse_shard", "rollout_command", "sandboxes", "task_sources"]

#: The scaffold's and the sampling's defaults.
_SETTINGS = RolloutSettings()


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 1 <= I <= N (``--shard``); anything else is refused in one line."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise LatentSiftError(f"--shard must be I/N with 1 <= I <= N (e.g. 1/2). Got {text!r} instead.")
    return int(m[1]), int(m[2])


def _shard_ok(text: str) -> bool:
    try:
        parse_shard(text)
    except LatentSiftError:
        return False
    return True


@dataclass(frozen=True, kw_only=True)
class RolloutOptions(CommandOptions):
    """The options of ``latentsift rollout [run]``, each declared once with the values it allows
    (``_core.params``); built = validated, before anything is read or loaded. ``k`` ... ``max_new_tokens``
    and ``system_prompt`` (None: the scaffold's) make the ``RolloutSettings`` (``settings``), ``timeout``
    the sandbox's limits (``limits``); ``sandbox`` and ``tasks_source``: registered names
    (``latentsift.rollout.folder.sandboxes``, ``latentsift.rollout.tasks.task_sources``)."""

    command: ClassVar[str] = "rollout"

    tasks: Path | None = option("TASKS", ExistingPath("file"), None, default=None)
    out: Path = option("--out", OUT)
    model: Path | None = option("--model", ExistingPath("path"), None, default=None)
    dtype: str = option("--dtype", OneOf((AUTO_DTYPE, *DTYPES)), default=AUTO_DTYPE)
    device: str | None = option("--device", DEVICE, None, default=None)
    k: int = option("--samples", POSITIVE, default=_SETTINGS.k)
    turns: int = option("--turns", POSITIVE, default=_SETTINGS.max_turns)
    temperature: float = option("--temperature", Interval(Real, 0, 10), default=_SETTINGS.temperature)
    top_p: float = option("--top-p", Interval(Real, 0, 1, closed="right"), default=_SETTINGS.top_p)
    max_new_tokens: int = option("--max-new-tokens", POSITIVE, default=_SETTINGS.max_new_tokens)
    system_prompt: str | None = option("--system-prompt", Matches("a non-empty text", lambda t: bool(t.strip()), " "),
                                       None, default=None)
    seed: int = option("--seed", SEED, default=_SETTINGS.seed)
    first: int | None = option("--tasks", POSITIVE, None, default=None)
    shard: str | None = option("--shard", Matches("I/N with 1 <= I <= N (e.g. 1/2)", _shard_ok, "3/2"), None,
                               default=None)
    run: str | None = option("--run", Kind(str, "a run name"), None, default=None)
    threads: int = option("--threads", POSITIVE, default=1)
    timeout: float = option("--timeout", Interval(Real, 0, None, closed="neither"), default=10.0)
    workers: int = option("--workers", POSITIVE, default=2)
    sandbox: str = option("--sandbox", Registered("sandbox"), default=SUBPROCESS_SANDBOX)
    tasks_source: str = option("--tasks-source", Registered("task_source"), default=HUMANEVAL_SOURCE)

    @property
    def settings(self) -> RolloutSettings:
        """The scaffold's and the sampling's settings (recorded in the output's manifest)."""
        return RolloutSettings(k=self.k, max_turns=self.turns, seed=self.seed, temperature=self.temperature,
                               top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                               system_prompt=_SETTINGS.system_prompt if self.system_prompt is None else self.system_prompt)

    @property
    def limits(self) -> SandboxLimits:
        """The sandbox's limits: ``--timeout`` per program."""
        return SandboxLimits(timeout_s=self.timeout)


def rollout_command(o: RolloutOptions, *, log: Callable[[str], object] = print,
                    progress: Callable | None = None) -> RolloutReport:
    """``latentsift rollout`` with the options ``o`` (checked when built): what needs the files checked before
    any work (the model path, the device, the tasks, the shard's share of them and a resume's settings: all
    before the model loads, nothing written on a refusal), the tasks read (HumanEval when ``o.tasks`` is
    None), the policy loaded and the rollouts run into ``o.out`` (created or resumed)."""
    tasks, out, model, dtype, first, run, threads, workers = (o.tasks, o.out, o.model, o.dtype, o.first, o.run,
                                                              o.threads, o.workers)
    settings, limits = o.settings, o.limits
    with owned_output(out, [tasks, model], kind="rollout"):  # a second writer is refused before the model loads
        o.check_paths()
        part = parse_shard(o.shard) if o.shard is not None else (1, 1)   # (I, N)
        model_path = check_model_path(model) if model is not None else check_model_path(default_model_path(), None)
        check_device(o.device)
        source = registry_find("task_source", o.tasks_source)
        env = registry_find("sandbox", o.sandbox)
        default_file = source.info.get("default_file")
        if tasks is None and default_file is None:
            raise LatentSiftError(f"--tasks-source {o.tasks_source} has no default task file: give the TASKS file.")
        path = tasks if tasks is not None else default_file()
        task_list = source.obj(tasks, limits=limits, workers=workers)
        n_file = len(task_list)
        task_list = task_list[:first] if first else task_list
        task_list = task_list[part[0] - 1::part[1]]
        if not task_list:
            pool = min(first, n_file) if first else n_file
            chosen = f"(--tasks {first})" if first else f"in {path}"
            raise LatentSiftError(f"--shard {part[0]}/{part[1]} selects no task: there are {pool} {chosen}; use "
                                  f"--shard I/N with I at most {pool}.")
        settings.check_fits(task_list, context_length_of(model_path), str(path))
        stem = model_path.name.removesuffix(".gguf")
        check_resume(out, settings, run=run or stem, agent=stem, threads=threads, dtype=dtype, tasks=task_list)
        log(f"{len(task_list)} tasks from {path}; loading the model ...")
        policy = load_policy(model, dtype=dtype, device=o.device)
        log(f"model: {policy.describe()}")
        run_examples, judge = env.obj(limits, workers=workers)
        return run_rollouts(policy, task_list, out, settings, run_examples=run_examples, judge=judge, run=run,
                            threads=threads, tasks_source=Path(path).name, progress=progress)

