"""``latentsift rollout`` and ``latentsift rollout export``: the options checked, then the work of the
own-policy wing (``latentsift.rollout``: tasks, sandbox, the agent loop, the folder and its export)."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Callable

from .._core.outputs import owned_output
from .._core.registry import registry_find, registry_names
from .._core.validation import LatentSiftError
from ..rollout.agent import RolloutSettings
from ..rollout.folder import SUBPROCESS_SANDBOX, RolloutReport, check_resume, export_dataset, run_rollouts, sandboxes
from ..rollout.sandbox import SandboxLimits
from ..rollout.tasks import HUMANEVAL_SOURCE, task_sources
from ..states.model import AUTO_DTYPE, DTYPES, check_device, default_model_path, load_policy
from ..states.model_files import check_model_path

__all__ = ["AUTO_DTYPE", "HUMANEVAL_SOURCE", "SUBPROCESS_SANDBOX", "RolloutSettings", "export_dataset", "parse_shard",
           "rollout_command", "sandboxes", "task_sources"]


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 1 <= I <= N (``--shard``); anything else is refused in one line."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise LatentSiftError(f"--shard must be I/N with 1 <= I <= N (e.g. 1/2). Got {text!r} instead.")
    return int(m[1]), int(m[2])


def _check_options(settings: RolloutSettings, *, threads: int, workers: int, first: int | None,
                   timeout: float) -> SandboxLimits:
    """Every number of the command line, named by its option (before anything is read or loaded);
    returns the sandbox limits of ``--timeout``."""
    for name, v in (("samples", settings.k), ("turns", settings.max_turns), ("max-new-tokens", settings.max_new_tokens),
                    ("threads", threads), ("workers", workers), ("tasks", first)):
        if v is not None and v < 1:
            raise LatentSiftError(f"--{name} must be a positive number. Got {v} instead.")
    if settings.seed < 0:
        raise LatentSiftError(f"--seed must be 0 or more. Got {settings.seed} instead.")
    if not 0 <= settings.temperature <= 10:  # (NaN fails every comparison)
        raise LatentSiftError(f"--temperature must be a number from 0 to 10. Got {settings.temperature} instead.")
    if not 0 < settings.top_p <= 1:
        raise LatentSiftError(f"--top-p must be a number above 0 and at most 1. Got {settings.top_p} instead.")
    if not 0 < timeout < math.inf:
        raise LatentSiftError(f"--timeout must be a positive number of seconds. Got {timeout} instead.")
    if not settings.system_prompt.strip():
        raise LatentSiftError("--system-prompt must be a non-empty text. Got an empty one instead.")
    settings.check()
    return SandboxLimits(timeout_s=timeout)


def _registered(name: str, kind: str, option: str):
    """The registry entry of ``name`` in ``kind``, or a one-line refusal naming ``option`` and the registered names."""
    entry = registry_find(kind, name)
    if entry is None:
        names = ", ".join(registry_names(kind))
        raise LatentSiftError(f"{option} must be a registered {kind.replace('_', ' ')}: {names}. Got {name!r} instead.")
    return entry


def rollout_command(tasks: str | os.PathLike | None, out: str | os.PathLike, *, model=None, dtype: str = AUTO_DTYPE,
                    device: str | None = None, settings: RolloutSettings, first: int | None = None,
                    run: str | None = None, shard: str | None = None, threads: int = 1,
                    timeout: float = 10.0, workers: int = 2, sandbox: str = SUBPROCESS_SANDBOX,
                    tasks_source: str = HUMANEVAL_SOURCE, log: Callable[[str], object] = print,
                    progress: Callable | None = None) -> RolloutReport:
    """``latentsift rollout``: every option checked before any work (the numbers, the model path, the
    tasks, the shard's share of them and a resume's settings: all before the model loads, nothing
    written on a refusal), the tasks read (HumanEval when ``tasks`` is None), the policy loaded and the
    rollouts run into ``out`` (created or resumed). ``sandbox`` and ``tasks_source``: registered names
    (``latentsift.rollout.folder.sandboxes``, ``latentsift.rollout.tasks.task_sources``)."""
    with owned_output(out, [tasks, model], kind="rollout"):  # a second writer is refused before the model loads
        part = parse_shard(shard) if shard is not None else (1, 1)   # (I, N): refused before the model loads
        limits = _check_options(settings, threads=threads, workers=workers, first=first, timeout=timeout)
        model_path = check_model_path(model) if model is not None else check_model_path(default_model_path(), None)
        check_device(device)
        if dtype != AUTO_DTYPE and dtype not in DTYPES:
            raise LatentSiftError(f"--dtype must be one of {[AUTO_DTYPE, *DTYPES]}. Got {dtype!r} instead.")
        source = _registered(tasks_source, "task_source", "--tasks-source")
        env = _registered(sandbox, "sandbox", "--sandbox")
        default_file = source.info.get("default_file")
        if tasks is None and default_file is None:
            raise LatentSiftError(f"--tasks-source {tasks_source} has no default task file: give the TASKS file.")
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
        stem = model_path.name.removesuffix(".gguf")
        check_resume(out, settings, run=run or stem, agent=stem, threads=threads, dtype=dtype, tasks=task_list)
        log(f"{len(task_list)} tasks from {path}; loading the model ...")
        policy = load_policy(model, dtype=dtype, device=device)
        log(f"model: {policy.describe()}")
        run_examples, judge = env.obj(limits, workers=workers)
        return run_rollouts(policy, task_list, out, settings, run_examples=run_examples, judge=judge, run=run,
                            threads=threads, tasks_source=Path(path).name, progress=progress)

