"""SWE-agent 1.x ``.traj`` files (``SWE-agent/SWE-agent`` >= 1.0: ``trajectory``, ``history``, ``info``,
``replay_config``, ``environment``).

Followed: ``sweagent/types.py`` (``TrajectoryStep``, ``HistoryItem``: ``role``, ``content`` (a string or
a list of text parts), ``message_type``, ``agent``, ``is_demo``, ``tool_calls``, ``tool_call_ids``,
``thinking_blocks``) and ``DefaultAgent.add_step_to_history`` / ``get_trajectory_data`` of
``sweagent/agent/agents.py``: every step appends one assistant message (``content`` = the model's
text, ``tool_calls`` in function-calling mode) and one observation message (``role`` ``tool`` with
``tool_call_ids`` after a tool call, else ``user``), the last step's included though it was never sent.
A ``RetryAgent`` file holds the chosen attempt at the top level and all of them in ``attempts``.
Steps at the end of ``trajectory`` that ``history`` does not hold (SWE-agent's own test data ends with
a ``submit`` found only there) are read from ``trajectory``: the ``response`` and the ``action`` as
text (``meta["only_in_trajectory"]``). The instance is ``replay_config``'s ``problem_statement.id``
(else the file name), the repository its ``env.repo.github_url`` when the id is not a SWE-bench one.

An assistant message with ``tool_calls`` (the default ``function_calling`` parser) becomes a
tool-call step as in the chat formats (``_chat``); one without (``thought_action`` parser, fenced
command) is split as SWE-agent 0.x does (``_sweagent``). ``thinking_blocks`` are the reasoning
rendered before the text.
"""
from __future__ import annotations

import json
from typing import Any

from .._core import words
from .trajectory import Step, Trajectory
from ._chat import _content, _step as _chat_step
from ._common import Where, repo_from_instance
from ._registry import register_importer
from ._sources import Source, names_of
from ._sweagent import _step as _text_step, issue_text
from ._sweagent import looks_like as _looks_like_traj

SWEAGENT1 = "sweagent1"   # the format's name (the agent stays ``sweagent``)


def looks_like(record: Any) -> bool:
    """A ``.traj`` of SWE-agent >= 1.0: ``replay_config`` or history items with a ``message_type``."""
    if not _looks_like_traj(record):
        return False
    history = record["history"]
    return "replay_config" in record or (isinstance(history, list) and any(
        isinstance(m, dict) and "message_type" in m for m in history))


@register_importer(SWEAGENT1, detect=looks_like, accepts=_looks_like_traj,
                   missing=("trajectory", "is missing (not a SWE-agent .traj file)"),
                   describe="a SWE-agent 1.x", priority=15)
def read(record: dict, where: Where, src: Source) -> Trajectory:
    """One ``.traj`` file: instance from ``replay_config`` (``problem_statement.id``), else the file
    name; run from its folder; agent ``sweagent``."""
    iid, run = names_of(src, record)
    replay = _replay_config(record)
    ps = replay.get("problem_statement")
    if isinstance(ps, dict) and isinstance(ps.get("id"), str) and ps["id"]:
        if ps["id"] != iid:
            src.inferred["instance_id"] = "replay_config.problem_statement.id (not the file name)"
        else:
            src.inferred.pop("instance_id", None)
        iid = ps["id"]
    t = parse(record, where, instance_id=iid, run=run)
    if not t.repo:
        t.repo = _github_repo(replay)
        if t.repo:
            src.inferred["repo"] = "replay_config.env.repo.github_url"
    return t


def _replay_config(record: dict) -> dict:
    """The run's configuration that SWE-agent 1.x keeps as a JSON string (``replay_config``), or {}."""
    rc = record.get("replay_config")
    if isinstance(rc, str):
        try:
            rc = json.loads(rc)
        except json.JSONDecodeError:
            return {}
    return rc if isinstance(rc, dict) else {}


def _github_repo(replay: dict) -> str:
    """``owner/name`` of ``env.repo.github_url`` (``https://github.com/SWE-agent/test-repo/``), or ""."""
    repo = (replay.get("env") or {}).get("repo") if isinstance(replay.get("env"), dict) else None
    url = repo.get("github_url") if isinstance(repo, dict) else None
    if not isinstance(url, str) or "github.com/" not in url:
        return ""
    parts = url.split("github.com/", 1)[1].strip("/").split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 else ""


def task_of(prompt: str) -> str:
    """The issue inside the instance prompt: ``<pr_description>`` of the 1.x default templates, else
    ``ISSUE:`` ... ``INSTRUCTIONS:`` of the older ones, else the whole prompt."""
    a = prompt.find("<pr_description>\n")
    b = prompt.find("\n</pr_description>", a + 1)
    if a >= 0 and b > a:
        return prompt[a + len("<pr_description>\n"):b]
    return issue_text(prompt)


def _message(m: Any, where: Where, i: int) -> dict[str, Any]:
    """One history item as an OpenAI-style chat message (text joined, ``tool_call_ids`` -> ``tool_call_id``)."""
    p = f"history[{i}]."
    role = where.get(m, "role", str, prefix=p)
    msg: dict[str, Any] = {"role": role, "content": _content(m, where, p)}
    if m.get("tool_calls"):
        msg["tool_calls"] = where.get(m, "tool_calls", list, prefix=p)
    ids = m.get("tool_call_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], str):
        msg["tool_call_id"] = ids[0]
    blocks = m.get("thinking_blocks")
    if isinstance(blocks, list):
        thoughts = [b.get("thinking") for b in blocks if isinstance(b, dict) and isinstance(b.get("thinking"), str)]
        if thoughts:
            msg["reasoning_content"] = "\n".join(thoughts)
    return msg


def parse(record: dict, where: Where, *, instance_id: str, run: str) -> Trajectory:
    g = where.get
    traj = g(record, "trajectory", list)
    history = g(record, "history", list)
    info = g(record, "info", dict)
    msgs: list[tuple[int, dict[str, Any]]] = []
    for i, m in enumerate(history):
        if not isinstance(m, dict):
            raise where.error(f"history[{i}]", f"must be a JSON object, got {type(m).__name__}")
        if m.get("is_demo"):
            continue   # demonstrations shown before the task: part of no step
        msgs.append((i, _message(m, where, i)))
    first_ai = next((k for k, (_, m) in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
    context = [{"role": m["role"], "content": m["content"]} for _, m in msgs[:first_ai]]
    users = [c["content"] for c in context if c["role"] == "user"]
    if not users:
        raise where.error("history", "has no user message before the first assistant message (no task prompt)")
    # assistant message k and the messages that follow it (its observation)
    turns: list[tuple[int, dict[str, Any], list[tuple[int, dict[str, Any]]]]] = []
    for i, m in msgs[first_ai:]:
        if m["role"] == "assistant":
            turns.append((i, m, []))
        else:
            turns[-1][2].append((i, m))
    if len(turns) > len(traj) or (len(turns) < len(traj) and not _history_ends_early(turns, traj)):
        raise where.error("history", f"has {len(turns)} assistant messages for {len(traj)} trajectory steps")
    steps = [_one_step(traj[k], i, m, replies, where, k, last=k == len(traj) - 1)
             for k, (i, m, replies) in enumerate(turns)]
    # the steps SWE-agent ran but did not add to ``history`` (its test data's final ``submit``)
    steps += [_trajectory_step(traj[k], where, k, last=k == len(traj) - 1) for k in range(len(turns), len(traj))]
    meta: dict[str, Any] = {"exit_status": info.get("exit_status"), "environment": record.get("environment")}
    if len(turns) < len(traj):
        meta["steps_only_in_trajectory"] = len(traj) - len(turns)
    for key in ("model_stats", "swe_agent_version", "best_attempt_idx"):
        if key in info:
            meta[key] = info[key]
    if isinstance(record.get("attempts"), list):
        meta["attempts"] = len(record["attempts"])
    submission = info.get("submission")
    return Trajectory(
        traj_id=f"{run}/{instance_id}", instance_id=instance_id, repo=repo_from_instance(instance_id),
        task_prompt=task_of(users[0]), steps=steps, patch=submission if isinstance(submission, str) else "",
        reward=None, system_prompt=next((c["content"] for c in context if c["role"] == "system"), None),
        agent=words.SWEAGENT, run=run, source_format=SWEAGENT1, source_id=where.source, meta=meta,
        context=context)


def _one_step(s: Any, i: int, m: dict[str, Any], replies: list[tuple[int, dict[str, Any]]], where: Where,
              k: int, *, last: bool) -> Step:
    p = f"trajectory[{k}]."
    action = where.get(s, "action", str, prefix=p)
    observation = where.get(s, "observation", str, prefix=p)
    if m.get("tool_calls"):
        step = _chat_step(m, [(r["role"], r, j) for j, r in replies], where, i, False, field="history")
    else:
        if m.get("reasoning_content"):
            raise where.error(f"history[{i}].thinking_blocks", "thinking blocks without a tool call cannot be imported")
        step = _text_step(m["content"], action, observation, [r["content"] for _, r in replies], last)
    if last:
        step.meta["obs_sent"] = False   # the run ended: the model never read the last observation
    return step


def _history_ends_early(turns: list, traj: list) -> bool:
    """``history`` holds the first steps of ``trajectory`` and stops before its end: each assistant
    message's text is its step's ``response`` (or ``thought``) where the step records one."""
    for k, (_, m, _) in enumerate(turns):
        s = traj[k] if isinstance(traj[k], dict) else {}
        said = s.get("response") if isinstance(s.get("response"), str) else s.get("thought")
        if isinstance(said, str) and said.strip() and said.strip() not in (m.get("content") or ""):
            return False
    return True


def _trajectory_step(s: Any, where: Where, k: int, *, last: bool) -> Step:
    """A step found only in ``trajectory``: the model's ``response`` (else ``thought``) is its message,
    ``action`` its command as text; its observation was never sent back to the model."""
    p = f"trajectory[{k}]."
    action = where.get(s, "action", str, prefix=p)
    observation = where.get(s, "observation", str, prefix=p)
    said = where.get(s, "response", str, prefix=p, optional=True, default=None)
    if said is None:
        said = where.get(s, "thought", str, prefix=p)
    # rendered as SWE-agent 0.x's text steps are: the message, a blank line, the command
    step = Step(cot=said, fn=action, obs=observation, fn_style="text", obs_role="user",
                meta={"only_in_trajectory": True})
    if last:
        step.meta["obs_sent"] = False   # the run ended: the model never read the last observation
    return step
