"""SWE-agent ``.traj`` files (top-level ``environment``, ``trajectory``, ``history``, ``info``).

Followed: SWE-agent 0.x (the ``princeton-nlp/SWE-agent`` releases of 2024 that wrote the SWE-bench
Lite runs ``cost_2_*``; ``ThoughtActionParser``: the action is the last top-level fenced code block of
the response, the thought is the text around it). Steps come from ``trajectory``; what the policy saw
comes from ``history``: the messages before the first assistant message (system prompt,
demonstrations, the instance prompt with the issue) become excluded context, the i-th assistant
message is step i's response, and the user message after it (the observation followed by
SWE-agent's ``(Open file: ...)`` / ``(Current directory: ...)`` / ``bash-$`` footer) is step i's
``obs``, exactly as sent. The last step's observation was never sent back to the model; it is taken
from ``trajectory`` (``Step.meta["obs_sent"] = False``).
"""
from __future__ import annotations

import re
from typing import Any

from .._core import words
from .trajectory import Step, Trajectory
from ._common import Where, repo_from_instance
from ._registry import register_importer
from ._sources import Source, names_of

_FENCE = re.compile(r"^```(\S*)\s*\n|^```\s*$", re.MULTILINE)
_SCAFFOLD_EXIT = re.compile(r"^exit_\w+$")


def looks_like(record: Any) -> bool:
    return isinstance(record, dict) and "trajectory" in record and "history" in record and "info" in record


def last_code_block(text: str) -> tuple[int, int, int, int] | None:
    """(open_start, content_start, content_end, close_end) of the last top-level fenced block."""
    stack: list[re.Match] = []
    last = None
    for m in _FENCE.finditer(text):
        if stack and not m.group(1):
            start = stack.pop()
            if not stack:
                last = (start.start(), start.end(), m.start(), m.end())
        elif m.group(1) is not None:
            stack.append(m)
    return last


def issue_text(first_user: str) -> str:
    """The issue inside SWE-agent's instance prompt (``ISSUE:`` ... ``INSTRUCTIONS:``), else all of it."""
    a = first_user.find("ISSUE:\n")
    b = first_user.find("\n\nINSTRUCTIONS:", a + 1)
    return first_user[a + len("ISSUE:\n"):b] if a >= 0 and b > a else first_user


@register_importer(words.SWEAGENT, detect=looks_like, missing=("trajectory", "is missing (not a SWE-agent .traj file)"),
                   describe="a SWE-agent", priority=20)
def read(record: dict, where: Where, src: Source) -> Trajectory:
    """One ``.traj`` file: instance and run from the record, else the file and folder names; agent ``sweagent``."""
    iid, run = names_of(src, record)
    return parse(record, where, instance_id=iid, run=run)


def parse(record: dict, where: Where, *, instance_id: str, run: str) -> Trajectory:
    g = where.get
    traj = g(record, "trajectory", list)
    history = g(record, "history", list)
    info = g(record, "info", dict)
    hist = []
    for i, m in enumerate(history):
        role = g(m, "role", str, prefix=f"history[{i}].")
        content = g(m, "content", str, prefix=f"history[{i}].")
        if m.get("is_demo") or m.get("agent", "primary") != "primary":
            continue  # demonstrations shown inside another message, or another agent's turns
        hist.append((role, content))
    first_ai = next((k for k, (r, _) in enumerate(hist) if r == "assistant"), len(hist))
    context = [{"role": r, "content": c} for r, c in hist[:first_ai]]
    users = [c for r, c in hist[:first_ai] if r == "user"]
    if not users:
        raise where.error("history", "has no user message before the first assistant message (no task prompt)")
    task = issue_text(users[0])
    system_prompt = next((c for r, c in hist[:first_ai] if r == "system"), None)
    # assistant message k and the user message(s) that follow it
    turns: list[tuple[str, list[str]]] = []
    for r, c in hist[first_ai:]:
        if r == "assistant":
            turns.append((c, []))
        elif turns:
            turns[-1][1].append(c)
    use_history = len(turns) == len(traj)
    steps = []
    for i, s in enumerate(traj):
        p = f"trajectory[{i}]."
        thought = g(s, "thought", str, prefix=p)
        action = g(s, "action", str, prefix=p)
        observation = g(s, "observation", str, prefix=p)
        response = g(s, "response", str, prefix=p, optional=True, default=thought)
        message, sent = (turns[i][0], turns[i][1]) if use_history else (response, [])
        steps.append(_step(message, action, observation, sent, i == len(traj) - 1))
    meta: dict[str, Any] = {"exit_status": info.get("exit_status"), "environment": record.get("environment")}
    if not use_history:
        meta["history_mismatch"] = f"{len(turns)} assistant messages for {len(traj)} steps: used trajectory"
    if isinstance(info.get("model_stats"), dict):
        meta["model_stats"] = info["model_stats"]
    submission = info.get("submission")
    return Trajectory(
        traj_id=f"{run}/{instance_id}", instance_id=instance_id, repo=repo_from_instance(instance_id),
        task_prompt=task, steps=steps, patch=submission if isinstance(submission, str) else "",
        reward=None, system_prompt=system_prompt, agent=words.SWEAGENT, run=run, source_format=words.SWEAGENT,
        source_id=where.source, meta=meta, context=context)


def _step(message: str, action: str, observation: str, sent: list[str], last: bool) -> Step:
    meta: dict[str, Any] = {}
    if _SCAFFOLD_EXIT.match(action) and not message.strip().startswith("```") and action not in message:
        # e.g. "Exit due to cost limit": written by SWE-agent, not by the model
        parts: list[list] = [["markup", message]]
        cot, fn = "", ""
        meta["scaffold_exit"] = action
    else:
        block = last_code_block(message)
        if block is not None and message[block[1]:block[2]] == action:
            a, b, c, d = block
            cot, fn = message[:a] + message[d:], action
            parts = ([["cot", a]] if a else []) + [["markup", message[a:b]], ["fn", c - b],
                                                   ["markup", message[c:d]]]
            if d < len(message):
                parts.append(["cot", len(message) - d])
        elif action and action in message:
            k = message.index(action)
            cot, fn = message[:k] + message[k + len(action):], action
            parts = ([["cot", k]] if k else []) + [["fn", len(action)]]
            if k + len(action) < len(message):
                parts.append(["cot", len(message) - k - len(action)])
        else:
            cot, fn = message, ""
            parts = [["cot", len(message)]] if message else []
            if action:
                meta["action_not_in_message"] = action
    layout: list[dict[str, Any]] = [{"role": "assistant", "parts": parts}]
    if sent:
        obs = "\n\n".join(sent)
        for k, c in enumerate(sent):
            layout.append({"role": "user", "parts": ([["skip", "obs", 2]] if k else []) + [["obs", len(c)]]})
    else:
        obs = observation
        if obs:
            layout.append({"role": "user", "parts": [["obs", len(obs)]]})
        meta["obs_sent"] = False
    return Step(cot=cot, fn=fn, obs=obs, fn_style="text", obs_role="user", meta=meta, layout=layout)
