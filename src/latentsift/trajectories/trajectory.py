"""The canonical trajectory model shared by every stage.

A ``Trajectory`` is one candidate: the task prompt, then steps ``t = 0..T-1``, each with up to three
spans (paper section "Three-channel representations and bank construction"):

- ``cot``: model-authored reasoning outside function calls (``<think>`` content included);
- ``fn``: the function call exactly as the policy emitted it (tool name and arguments);
- ``obs``: the environment feedback returned for that step.

A ``Pool`` is all candidates of one instance. Files are JSONL, one trajectory per line, written with
a fixed key order so that load -> save round-trips byte for byte.

How a trajectory becomes chat messages (used by ``channel.render``):

- ``Trajectory.context``: the messages before step 0 (system prompt, task prompt, demonstrations),
  each ``{"role": ..., "content": ...}``; all their tokens are excluded from pooling. Empty = the
  default ``[system_prompt (when not None), user task_prompt]``.
- ``Step.layout``: the messages of one step, each ``{"role": ..., "parts": [...]}`` (other keys such
  as ``name`` or ``tool_call_id`` are passed to the chat template unchanged). A part is
  ``["cot"|"fn"|"obs", n]`` (the next ``n`` characters of that channel's text, rendered and
  labelled), ``["markup", text]`` (literal scaffold text, rendered and excluded, e.g. a code fence) or
  ``["skip", channel, n]`` (the next ``n`` characters of a channel, not rendered: the separator that
  joins several observation messages into ``obs``). An assistant message may carry ``"tool_calls":
  [["fn", n] | ["skip", "fn", n], ...]``: each ``fn`` part is the JSON of one call
  ``{"name": ..., "arguments": ...}``, rendered through the template's own tool-call format.
  Every character of ``cot``, ``fn`` and ``obs`` is consumed exactly once (checked). Empty layout =
  the default (``default_layout``).
"""
from __future__ import annotations

import gzip
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from .._core.io import atomic_path
from .._core.io import iter_jsonl as _iter_records
from .._core.validation import LatentSiftError

#: The span channels of a step: the model's reasoning (cot), the observation it read (obs), its function call (fn).
CHANNELS: tuple[str, ...] = ("cot", "obs", "fn")
#: Each channel's index (the ``channel`` column of stored states).
CHANNEL_ID: dict[str, int] = {c: i for i, c in enumerate(CHANNELS)}


@dataclass
class Step:
    """One agent step. Empty strings mean the step has no tokens in that channel.

    ``fn_style`` records how the call was emitted so rendering can rebuild what the policy saw:
    ``"text"`` (inside the assistant text, e.g. R2E-Gym XML or a fenced bash block) or
    ``"tool_calls"`` (OpenAI-style structured call, ``fn`` is its JSON). ``obs_role`` is the role the
    scaffold used to send the observation back (``"user"`` or ``"tool"``).
    """

    cot: str = ""
    fn: str = ""
    obs: str = ""
    fn_style: str = "text"
    obs_role: str = "user"
    meta: dict[str, Any] = field(default_factory=dict)
    layout: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"cot": self.cot, "fn": self.fn, "obs": self.obs, "fn_style": self.fn_style,
                "obs_role": self.obs_role, "meta": self.meta, "layout": self.layout}

    def messages_layout(self) -> list[dict[str, Any]]:
        """``layout`` when set, else ``default_layout(self)``."""
        return self.layout if self.layout else default_layout(self)


def default_layout(step: Step) -> list[dict[str, Any]]:
    """The messages of a step without an explicit layout.

    ``fn_style="text"``: one assistant message ``cot + "\n\n" + fn`` (R2E-Gym's
    ``f"{thought}\n\n{action}"``; the separator only when both are non-empty), then one ``obs_role``
    message with ``obs`` when it is non-empty. ``fn_style="tool_calls"``: the assistant content is
    ``cot`` and every line of ``fn`` is the JSON of one structured call.
    """
    msgs: list[dict[str, Any]] = []
    if step.fn_style == "tool_calls":
        calls: list[list] = []
        lines = step.fn.split("\n") if step.fn else []
        for i, line in enumerate(lines):
            if i:
                calls.append(["skip", "fn", 1])
            calls.append(["fn", len(line)])
        msg: dict[str, Any] = {"role": "assistant", "parts": [["cot", len(step.cot)]] if step.cot else []}
        if calls:
            msg["tool_calls"] = calls
        msgs.append(msg)
    else:
        parts: list[list] = []
        if step.cot:
            parts.append(["cot", len(step.cot)])
        if step.cot and step.fn:
            parts.append(["markup", "\n\n"])
        if step.fn:
            parts.append(["fn", len(step.fn)])
        msgs.append({"role": "assistant", "parts": parts})
    if step.obs:
        msgs.append({"role": step.obs_role, "parts": [["obs", len(step.obs)]]})
    return msgs


@dataclass
class Trajectory:
    """One candidate trajectory in canonical form.

    ``traj_id`` is unique across a file (``"<run>/<instance_id>"`` for the importers here).
    ``reward`` is the evaluation outcome (None when unknown); ``label`` = 1[reward >= 0.5].
    ``tests`` holds per-candidate test results when known, e.g. ``{"f2p_passed": 1, "f2p_total": 2,
    "p2p_passed": 13, "p2p_total": 13}``; a key is absent when unknown, never invented.
    """

    traj_id: str
    instance_id: str
    repo: str
    task_prompt: str
    steps: list[Step]
    patch: str = ""
    reward: float | None = None
    tests: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    agent: str = ""
    run: str = ""
    source_format: str = ""
    source_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    context: list[dict[str, Any]] = field(default_factory=list)

    def context_messages(self) -> list[dict[str, Any]]:
        """``context`` when set, else ``[system_prompt (when not None), user task_prompt]``."""
        if self.context:
            return self.context
        msgs = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        return msgs + [{"role": "user", "content": self.task_prompt}]

    @property
    def label(self) -> int | None:
        return None if self.reward is None else int(self.reward >= 0.5)

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def n_chars(self) -> int:
        """Characters of cot + fn + obs over all steps (length baseline 'shortest in characters')."""
        return sum(len(s.cot) + len(s.fn) + len(s.obs) for s in self.steps)

    def to_dict(self) -> dict:
        d: dict[str, Any] = OrderedDict()
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = [s.to_dict() for s in v] if f.name == "steps" else v
        return d

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "record") -> "Trajectory":
        known = {f.name for f in fields(cls)}
        missing = [k for k in ("traj_id", "instance_id", "repo", "task_prompt", "steps") if k not in d]
        if missing:
            raise LatentSiftError(f"{where}: missing field(s) {missing} of a canonical trajectory.")
        extra = set(d) - known
        if extra:
            raise LatentSiftError(f"{where}: unknown field(s) {sorted(extra)} in a canonical trajectory.")
        if not isinstance(d["steps"], list):
            raise LatentSiftError(f"{where}: field 'steps' must be a list.")
        check_field_types(d, TRAJECTORY_TYPES, where, "")
        step_keys = {f.name for f in fields(Step)}
        steps = []
        for i, s in enumerate(d["steps"]):
            if not isinstance(s, dict) or set(s) - step_keys:
                raise LatentSiftError(f"{where}: field 'steps[{i}]' is not a canonical step.")
            check_field_types(s, STEP_TYPES, where, f"steps[{i}].")
            steps.append(Step(**s))
        return cls(**{k: v for k, v in d.items() if k != "steps"}, steps=steps)


#: JSON types of the canonical fields (checked where a record enters, with file and line).
TRAJECTORY_TYPES: dict[str, tuple[type, ...]] = {
    "traj_id": (str,), "instance_id": (str,), "repo": (str,), "task_prompt": (str,), "patch": (str,),
    "reward": (int, float, type(None)), "tests": (dict,), "system_prompt": (str, type(None)), "agent": (str,),
    "run": (str,), "source_format": (str,), "source_id": (str,), "meta": (dict,), "context": (list,)}
STEP_TYPES: dict[str, tuple[type, ...]] = {"cot": (str,), "fn": (str,), "obs": (str,), "fn_style": (str,),
                                           "obs_role": (str,), "meta": (dict,), "layout": (list,)}
_JSON_NAMES = {str: "a string", int: "a number", float: "a number", dict: "an object", list: "a list",
               type(None): "null"}


def check_field_types(d: dict, types: dict[str, tuple[type, ...]], where: str, prefix: str) -> None:
    """Each present field of ``d`` has its JSON type (booleans are not numbers; numbers are finite)."""
    for key, typ in types.items():
        if key not in d:
            continue
        v = d[key]
        if (isinstance(v, bool) or not isinstance(v, typ)) or (isinstance(v, float) and not math.isfinite(v)):
            want = " or ".join(dict.fromkeys(_JSON_NAMES[t] for t in typ))
            got = ("a boolean" if isinstance(v, bool) else repr(v) if isinstance(v, float)
                   else _JSON_NAMES.get(type(v), type(v).__name__))
            raise LatentSiftError(f"{where}: field '{prefix}{key}' must be {want}"
                                  f"{' (finite)' if float in typ else ''}, got {got}.")


@dataclass
class Pool:
    """All candidates of one instance (same policy)."""

    instance_id: str
    candidates: list[Trajectory]

    @property
    def k(self) -> int:
        return len(self.candidates)

    @property
    def labels(self) -> list[int | None]:
        return [c.label for c in self.candidates]


def _open(path: Path, mode: str, gz: bool | None = None):
    gz = path.suffix == ".gz" if gz is None else gz
    return gzip.open(path, mode + "t", encoding="utf-8") if gz else open(path, mode, encoding="utf-8")


def dumps(traj: Trajectory) -> str:
    """One canonical JSON line; never a bare NaN or Infinity (not JSON): such a value is an error."""
    try:
        return json.dumps(traj.to_dict(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise LatentSiftError(f"trajectory {traj.traj_id!r} holds NaN or infinity (not JSON); "
                              "fix the value in its source.") from None


def save_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> int:
    """Write canonical JSONL atomically (write then rename). Returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_path(path) as tmp, _open(tmp, "w", gz=path.suffix == ".gz") as f:
        for t in trajectories:
            f.write(dumps(t) + "\n")
            n += 1
    return n


def iter_jsonl(path: str | Path) -> Iterator[Trajectory]:
    path = Path(path)
    if not path.is_file():
        raise LatentSiftError(f"No such file: {str(path)!r}.")
    for where, d in _iter_records(path, opener=lambda p: _open(p, "r")):
        yield Trajectory.from_dict(d, where=where)


def load_jsonl(path: str | Path) -> list[Trajectory]:
    """Read canonical JSONL (``.jsonl`` or ``.jsonl.gz``): every trajectory, in file order; a repeated traj_id is
    an error."""
    trajs = list(iter_jsonl(path))
    seen: set[str] = set()
    for t in trajs:
        if t.traj_id in seen:
            raise LatentSiftError(f"{path}: duplicate traj_id {t.traj_id!r}.")
        seen.add(t.traj_id)
    return trajs


def load_pools(path: str | Path) -> list[Pool]:
    """``group_pools(load_jsonl(path))``: the pools of a canonical JSONL file."""
    return group_pools(load_jsonl(path))


def group_pools(trajectories: Iterable[Trajectory]) -> list[Pool]:
    """Group candidates by instance, pools sorted by instance id, candidates by traj_id."""
    by: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by.setdefault(t.instance_id, []).append(t)
    return [Pool(i, sorted(c, key=lambda t: t.traj_id)) for i, c in sorted(by.items())]
