"""The rollout folder: K rollouts per task by the policy as a small agent (``agent``), states captured
online into a state store, trajectories labelled by the hidden tests in a sandbox; and its export, the
shareable dataset (``latentsift rollout export``).

Output folder (format ``latentsift-rollout`` version 1)::

    manifest.json              model file and fingerprint, the rollout settings, run name, threads, the
                               weights' decode layout (``decode_layout``, ``states.decode``) and the
                               content digest of every task begun (``task_digests``)
    tasks/<task>.jsonl.gz      one task's K trajectories (the resume unit; written atomically)
    trajectories.jsonl.gz      the finished tasks of the call's task list, in task order (rewritten after every task)
    states/                    the state store (one shard per task) that extract, fit, crossval,
                               filter and reproduce read

Resumable: a task whose file exists and whose states are stored is skipped; a killed run redoes at
most the task it was writing, and since sampling is seeded per sample the redone task has the same
bytes. gzip files are written with a zero timestamp and no name, so they are byte-identical too. A
resume is refused, before the model loads where no model is needed, in one line naming what differs:
a setting (by its option), the model or its dtype, or a finished task whose content (prompt, hidden
test, reference) is not the one its labels were made with (its digest is recorded before it runs).
The manifest is read through the schema check of ``_core.manifests`` (``RolloutManifest``).
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .._core.io import WriterLock, atomic_write_bytes, atomic_write_json, no_writer, read_json
from .._core.manifests import RolloutManifest, check_manifest
from .._core.outputs import owned_output
from .._core.registry import registry_add, registry_names
from .._core.threads import fixed_threads
from .._core.validation import LatentSiftError
from ..states.decode import STORED_LAYOUT, decode_layout_for, decode_weights
from ..states.extract import extract_settings
from ..states.model import DTYPES
from ..states.store import StateStore
from ..trajectories.trajectory import Trajectory, dumps
from .agent import ExampleRunner, Judge, RolloutSettings, ToolReport, rollout_task, sample_traj_ids
from .execution import label_many, run_examples_many
from .sandbox import SandboxLimits
from .tasks import task_digest

__all__ = ["MANIFEST", "ROLLOUT_FORMAT", "STATES_DIR", "SUBPROCESS_SANDBOX", "TASKS_DIR", "TRAJECTORIES",
           "RolloutProgress", "RolloutReport", "assemble_trajectories", "check_resume", "export_dataset", "natural_key",
           "run_rollouts", "sandbox_env", "sandboxes", "task_file"]

ROLLOUT_FORMAT = "latentsift-rollout"
ROLLOUT_VERSION = 1
MANIFEST = "manifest.json"
TASKS_DIR = "tasks"
TRAJECTORIES = "trajectories.jsonl.gz"
STATES_DIR = "states"
LOCK = ".lock"
#: Settings that must match when a rollout folder is resumed (any change makes other trajectories).
MATCHED = ("settings", "run", "agent", "threads", "fingerprint")
#: The option of each recorded setting (how a refusal names it).
OPTIONS = {"k": "--samples", "max_turns": "--turns", "seed": "--seed", "temperature": "--temperature", "top_p": "--top-p",
           "max_new_tokens": "--max-new-tokens", "system_prompt": "--system-prompt", "run": "--run", "agent": "--run", "threads": "--threads"}
_REDO = "run the rollout again into a new --out"


@dataclass
class RolloutProgress:
    """Passed to ``progress`` at the start and after each task."""

    done: int             # tasks finished in this call
    total: int            # tasks to run in this call (already finished ones excluded)
    skipped: int          # tasks already in the folder
    generated: int        # tokens sampled in this call
    elapsed: float
    task_id: str | None = None
    passed: int = 0       # samples of this call that pass the hidden tests
    samples: int = 0      # samples of this call


@dataclass
class RolloutReport:
    """What one rollout call did: tasks run and skipped, samples and passes, tokens generated, forward passes,
    wall and tool time, and the files it wrote to."""

    n_tasks: int
    n_skipped: int = 0
    n_run: int = 0
    n_samples: int = 0
    n_passed: int = 0
    n_generated: int = 0
    n_forward: int = 0
    seconds: float = 0.0
    tool_seconds: float = 0.0
    trajectories: str = ""
    states: str = ""
    mixed_tasks: int = 0   # tasks of this call with both passing and failing samples
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.seconds if self.seconds > 0 else 0.0


def gzip_bytes(text: str) -> bytes:
    """``text`` gzipped reproducibly (no timestamp, no file name)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
        f.write(text.encode("utf-8"))
    return buf.getvalue()


def task_file(task_id: str) -> str:
    """The file name of one task's trajectories: its id made safe, and a short hash against collisions."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", task_id).strip("._") or "task"
    return f"{safe}-{hashlib.sha256(task_id.encode()).hexdigest()[:8]}.jsonl.gz"


def _read_part(path: Path) -> list[Trajectory]:
    """One task's trajectories; a damaged file is named, with what to do (delete it and run the same
    rollout again: the task is redone to the same bytes, its stored states are kept)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [Trajectory.from_dict(json.loads(line), where=str(path)) for line in f if line.strip()]
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError, LatentSiftError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        why = " ".join(str(e).replace(str(path), "").split()).strip(": ") or type(e).__name__
        raise LatentSiftError(f"{path}: this task file of the rollout folder is damaged ({why[:120]}); delete it and "
                              "run the same rollout command again: that task is redone, to the same samples.") from None


def read_rollout_manifest(out: Path) -> dict:
    """The ``manifest.json`` of the rollout folder ``out``, through the schema check."""
    path = out / MANIFEST
    man = read_json(path)
    if isinstance(man, dict) and man.get("format") != ROLLOUT_FORMAT:
        raise LatentSiftError(f"{path} is not a {ROLLOUT_FORMAT} manifest; choose another --out.")
    return check_manifest(man, RolloutManifest, path, _REDO)


def assemble_trajectories(out: str | os.PathLike, task_ids: Sequence[str], dest: str | os.PathLike) -> int:
    """Write the finished tasks' trajectories of the rollout folder ``out`` (its ``tasks/`` files), in the
    order of ``task_ids``, to ``dest`` as one gzipped canonical JSONL file (atomically); returns the number
    of trajectories. ``run_rollouts`` calls it after every task, so a killed run's file holds every task
    it finished."""
    parts = [Path(out) / TASKS_DIR / task_file(t) for t in task_ids]
    trajs = [tr for p in parts if p.is_file() for tr in _read_part(p)]
    atomic_write_bytes(Path(dest), gzip_bytes("".join(dumps(tr) + "\n" for tr in trajs)))
    return len(trajs)


def export_dataset(outs: str | os.PathLike | Sequence[str | os.PathLike], dest: str | os.PathLike) -> dict:
    """The shareable part of one rollout folder, or of several that ran the same model and settings on
    other tasks (``--shard``, or a task file of another's remaining tasks), with no states:
    ``dest/trajectories.jsonl.gz`` (every finished task, in the natural order of the task ids: numbers
    compared as numbers, HumanEval's file order) and ``dest/manifest.json`` (the rollout's manifest, the
    task files' names and the dataset's counts). Tasks are matched by what was run, not by the task
    file's name: a task in two folders must have the same samples. Anyone rebuilds the states from it
    by replay (``latentsift extract --model``). ``dest`` must be a new folder or one this function
    wrote; returns the manifest written."""
    outs = [Path(outs)] if isinstance(outs, (str, os.PathLike)) else [Path(o) for o in outs]
    dest = Path(dest)
    # the rollout folders are only read; one a rollout is still writing is refused (its export would
    # silently hold only the tasks finished so far), and none may start writing while they are read
    with contextlib.ExitStack() as reading:
        for out in outs:
            reading.enter_context(no_writer(out / LOCK, what=repr(str(out)), doing="exporting it"))
        reading.enter_context(owned_output(dest, outs, kind="rollout-dataset"))
        mans = []
        for out in outs:
            if not (out / MANIFEST).is_file():
                raise LatentSiftError(f"{str(out)!r} is not a rollout folder (no {MANIFEST}).")
            mans.append(read_rollout_manifest(out))
            other = [k for k in MATCHED + ("model",) if mans[-1].get(k) != mans[0].get(k)]
            other += ["decode layout"] if _layout(mans[-1]) != _layout(mans[0]) else []
            if other:
                raise LatentSiftError(f"{str(out)!r} ran with another {other[0]} than {str(outs[0])!r}: its samples "
                                      "cannot join the same dataset.")
        by_task: dict[str, list[Trajectory]] = {}
        for out in outs:
            for p in sorted((out / TASKS_DIR).glob("*.jsonl.gz")):
                part = _read_part(p)
                if not part:
                    continue
                seen = by_task.get(part[0].instance_id)
                if seen is not None and [dumps(t) for t in seen] != [dumps(t) for t in part]:
                    raise LatentSiftError(f"The task {part[0].instance_id!r} is in two of the folders with different "
                                          "samples (another task text, code, machine or dtype?): they cannot join "
                                          "one dataset.")
                by_task[part[0].instance_id] = part   # a task run twice alike (a shard that redid it) counts once
        trajs = [t for tid in sorted(by_task, key=natural_key) for t in by_task[tid]]
        dest.mkdir(parents=True, exist_ok=True)  # (every task file read: a damaged one leaves nothing)
        atomic_write_bytes(dest / TRAJECTORIES, gzip_bytes("".join(dumps(tr) + "\n" for tr in trajs)))
        labels = {tid: [t.label for t in part] for tid, part in by_task.items()}
        names = sorted({m.get("tasks") for m in mans}, key=str)
        digests = {tid: d for m in mans for tid, d in m.get("task_digests", {}).items() if tid in by_task}
        man = mans[0] | {"format": ROLLOUT_FORMAT + "-dataset", "tasks": names[0] if len(names) == 1 else names,
                         "task_digests": {tid: digests[tid] for tid in sorted(digests, key=natural_key)},
                         "n_tasks": len(labels), "n_samples": len(trajs),
                         "n_passed": int(sum(t.label for t in trajs)),
                         "n_mixed_tasks": sum(0 < sum(v) < len(v) for v in labels.values())}
        atomic_write_json(dest / MANIFEST, man)
    return man


def natural_key(task_id: str) -> tuple:
    """Sort key of a task id with its digit runs compared as numbers (``HumanEval/2`` before ``/10``)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", task_id))


def sandbox_env(limits: SandboxLimits | None = None, workers: int = 2) -> tuple[ExampleRunner, Judge]:
    """The agent's tool and the judge on ``rollout.execution`` (each program in its own sandboxed
    subprocess, ``workers`` side by side): ``run_examples(task, codes)`` runs each code on the task's
    docstring examples only and returns what the policy reads (a task without examples passes, so
    the code is submitted); ``judge(task, codes)`` runs each against the hidden tests."""
    def run_examples(task, codes: Sequence[str]) -> list[ToolReport]:
        reps = run_examples_many([(task, c) for c in codes], limits, workers=workers)
        return [ToolReport(r.observation(), r.all_passed or r.n_total == 0, r.n_passed, r.n_total) for r in reps]

    def judge(task, codes: Sequence[str]) -> list[bool]:
        return [r.passed for r in label_many([(task, c) for c in codes], limits, workers=workers)]

    return run_examples, judge


#: The sandboxes (kind "sandbox" of ``latentsift._core.registry``; ``latentsift rollout --sandbox``): a sandbox is
#: called as ``sandbox(limits, workers=)`` and returns the agent's tool and the judge, as :func:`sandbox_env` does.
SUBPROCESS_SANDBOX = "subprocess"
registry_add("sandbox", SUBPROCESS_SANDBOX, sandbox_env, label="each program in its own isolated subprocess")


def sandboxes() -> tuple[str, ...]:
    """Every registered sandbox's name."""
    return registry_names("sandbox")


def _manifest(policy, settings: RolloutSettings, run: str, agent: str, threads: int, tasks_source: str) -> dict:
    return {"format": ROLLOUT_FORMAT, "version": ROLLOUT_VERSION, "model": Path(policy.path).name,
            "fingerprint": policy.fingerprint.to_dict(), "settings": settings.to_dict(), "run": run, "agent": agent,
            "threads": threads, "tasks": tasks_source, "decode_layout": decode_layout_for(policy), "task_digests": {}}


def _layout(man: dict) -> str:
    """The weights' decode layout a folder's samples were drawn in (the stored one where none is recorded)."""
    return man.get("decode_layout", STORED_LAYOUT)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _resume_refusal(out: Path, old: dict, new: dict, dtype: str | None = None) -> str | None:
    """The first thing ``new`` (a manifest, or the part known before the model loads: no ``fingerprint``)
    does differently from the folder's manifest ``old``, as one sentence naming its option; or None.
    ``dtype``: the one asked for (``--dtype``), compared with the recorded fingerprint's before loading."""
    tail = "; use the same, or another --out."
    for key in MATCHED:
        if key == "fingerprint" or key not in new or old[key] == new[key]:
            continue
        if key == "settings":
            name = next(k for k in new[key] if old[key].get(k) != new[key][k])
            return (f"{out} holds rollouts made with {OPTIONS.get(name, 'the setting ' + name)} "
                    f"{_short(old[key].get(name))}; this call has {_short(new[key][name])}{tail}")
        return f"{out} holds rollouts made with {OPTIONS[key]} {_short(old[key])}; this call has {_short(new[key])}{tail}"
    recorded = old["fingerprint"]
    asked = new["fingerprint"]["dtype"] if "fingerprint" in new else dtype
    if asked in DTYPES and asked != recorded["dtype"]:
        return (f"{out} holds rollouts made in {recorded['dtype']} (--dtype); this call runs {asked}: pass "
                f"--dtype {recorded['dtype']}, or another --out.")
    if "fingerprint" in new and recorded["digest"] != new["fingerprint"]["digest"]:
        field_ = next(k for k in recorded if k != "digest" and recorded[k] != new["fingerprint"].get(k))
        return (f"{out} holds rollouts of another model (its fingerprint's {field_} differs: {_short(recorded[field_])} "
                f"there, {_short(new['fingerprint'][field_])} here); pass the same --model, or another --out.")
    return None


def _stale_task(out: Path, old: dict, tasks: Sequence) -> str | None:
    """A finished task of ``out`` whose content is not the one its labels were made with, as a sentence."""
    recorded = old.get("task_digests", {})
    for task in tasks:
        if (out / TASKS_DIR / task_file(task.task_id)).is_file() and recorded.get(task.task_id) != task_digest(task):
            why = ("its prompt, hidden test or reference solution changed since"
                   if task.task_id in recorded else "the folder records no digest of it")
            return (f"The task {task.task_id!r} of the task file is not the one {out} labelled ({why}): its labels "
                    "would be stale; run it into another --out.")
    return None


def _check_resume(out: Path, new: dict, tasks: Sequence, dtype: str | None = None) -> dict | None:
    """The folder's manifest when ``out`` is resumed, after refusing in one line a resume with other
    settings (``new``: a manifest, or its part known before the model loads), or with changed tasks;
    None for a new folder."""
    if not (out / MANIFEST).is_file():
        return None
    old = read_rollout_manifest(out)
    problem = _resume_refusal(out, old, new, dtype) or _stale_task(out, old, tasks)
    if problem:
        raise LatentSiftError(problem)
    return old


def check_resume(out: str | os.PathLike, settings: RolloutSettings, *, run: str, agent: str, threads: int,
                 dtype: str | None, tasks: Sequence) -> None:
    """Before the model loads: a resume of ``out`` with other settings, run name, threads, an explicit
    other dtype or changed tasks is refused in one line (nothing to do when ``out`` has no manifest)."""
    new = {"settings": settings.to_dict(), "run": run, "agent": agent, "threads": threads}
    _check_resume(Path(out), new, tasks, dtype)


def run_rollouts(policy, tasks: Sequence, out: str | os.PathLike, settings: RolloutSettings, *,
                 run_examples: ExampleRunner, judge: Judge, run: str | None = None, agent: str | None = None,
                 threads: int = 1, tasks_source: str = "", store_dtype: str = "float16",
                 progress: Callable[[RolloutProgress], None] | None = None,
                 on_task: Callable[[str], None] | None = None) -> RolloutReport:
    """K rollouts of every task of ``tasks`` into the folder ``out`` (created, or resumed).

    ``run``: the run name in the trajectory ids (default: the model file's name without ``.gguf``); ``agent``: the
    policy's name (default: the same). ``threads``: torch threads for the policy (the sampled tokens
    depend on it through rounding: it is recorded and must match on resume). ``on_task(task_id)`` is
    called after each task is committed (tests use it to simulate a kill). ``store_dtype``: the states'
    dtype on disk (float16 as ``extract``'s default; float32 keeps the capture's bits)."""
    settings.check()
    out = Path(out)
    stem = Path(policy.path).name.removesuffix(".gguf")
    run = run or stem
    agent = agent or stem
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise LatentSiftError(f"The task id {dup!r} occurs more than once in the task file.")
    man = _manifest(policy, settings, run, agent, threads, tasks_source)
    _check_resume(out, man, tasks)  # before the folder or its lock is touched (again under the lock)
    out.mkdir(parents=True, exist_ok=True)
    report = RolloutReport(n_tasks=len(tasks), trajectories=str(out / TRAJECTORIES), states=str(out / STATES_DIR))
    t0 = time.perf_counter()
    with WriterLock(out / LOCK, what=out):
        old = _check_resume(out, man, tasks)
        if old is not None:
            man = old | {"task_digests": dict(old.get("task_digests", {}))}
        else:
            atomic_write_json(out / MANIFEST, man)
        (out / TASKS_DIR).mkdir(exist_ok=True)
        store = StateStore(out / STATES_DIR)
        # the weights' decode layout (states.decode): a folder begun before it was recorded is resumed in
        # the stored layout, so its remaining tasks have the bytes that run's command gave
        with store.lock(), decode_weights(policy, _layout(man), settings.k):
            store_settings = extract_settings(policy, store_dtype=store_dtype) | {"capture": "online"}
            store.open_or_create(policy.fingerprint, store_settings)
            store.drop_damaged()

            def tids(task) -> list[str]:
                return sample_traj_ids(run, task.task_id, settings.k)

            done = {t.task_id for t in tasks if (out / TASKS_DIR / task_file(t.task_id)).is_file()
                    and all(store.has(x) for x in tids(t))}
            todo = [t for t in tasks if t.task_id not in done]
            report.n_skipped = len(tasks) - len(todo)
            if progress:
                progress(RolloutProgress(0, len(todo), report.n_skipped, 0, 0.0))
            for task in todo:
                if man["task_digests"].get(task.task_id) != task_digest(task):
                    man["task_digests"][task.task_id] = task_digest(task)   # recorded before its labels
                    atomic_write_json(out / MANIFEST, man)
                with fixed_threads(threads):
                    rolls, stats = rollout_task(policy, task, settings, run_examples, judge, run=run, agent=agent,
                                                fingerprint=policy.fingerprint.digest)
                if not all(store.has(x) for x in tids(task)):
                    store.write([r.states for r in rolls], [task.task_id] * len(rolls))
                text = "".join(dumps(r.trajectory) + "\n" for r in rolls)
                atomic_write_bytes(out / TASKS_DIR / task_file(task.task_id), gzip_bytes(text))
                labels = [r.trajectory.label for r in rolls]
                report.n_run += 1
                report.n_samples += len(rolls)
                report.n_passed += sum(labels)
                report.mixed_tasks += int(0 < sum(labels) < len(labels))
                report.n_generated += stats.generated
                report.n_forward += stats.forward
                report.tool_seconds += stats.tool_seconds
                if progress:
                    progress(RolloutProgress(report.n_run, len(todo), report.n_skipped, report.n_generated,
                                             time.perf_counter() - t0, task.task_id, report.n_passed,
                                             report.n_samples))
                assemble_trajectories(out, ids, out / TRAJECTORIES)
                if on_task:
                    on_task(task.task_id)
        assemble_trajectories(out, ids, out / TRAJECTORIES)
    report.seconds = time.perf_counter() - t0
    return report
