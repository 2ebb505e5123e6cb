"""Chat-message trajectories: OpenAI-style tool calling and mini-swe-agent's fenced bash actions.

Shapes read (one trajectory per JSON file, or one per JSONL line):

- ``{"messages": [...], ...}`` or a bare ``[...]`` list of messages (OpenAI Chat Completions format:
  ``system`` / ``user`` / ``assistant`` with optional ``tool_calls`` ``[{"id", "type": "function",
  "function": {"name", "arguments": "<JSON string>"}}]`` and ``reasoning_content``, ``tool`` replies
  with ``tool_call_id``). Content may be a string, ``null``, or a list of ``{"type": "text"}`` parts.
- OpenHands completion logs (``log_completions``): ``{"messages": [...], "response": {"choices":
  [{"message": {...}}]}}``, or the same log with the reply kept as ``"final_response": {...}`` (the
  SWE-bench Verified pairs): the reply is appended as the last assistant turn. Such a log's agent is
  ``openhands`` unless the record names one.
- mini-swe-agent trajectories (``trajectory_format`` ``mini-swe-agent-1`` / ``-1.1``): the same
  ``messages`` list; an assistant action is the single fenced ``bash`` (v1) or
  ``mswea_bash_command`` (v2 text-based) block; zero or several blocks are a format error and no call.
  mini-swe-agent 2.x's default (``LitellmModel``) calls a ``bash`` tool instead (``tool_calls``,
  ``tool`` replies) and ends with a ``role: "exit"`` message, which is dropped (never sent); with a
  Responses API model its items are read as these messages first (``_responses``).

Each assistant message opens a step: ``cot`` = its text outside the call (``reasoning_content``
first, wrapped as ``<think>\\n...\\n</think>\\n\\n`` with the tags as markup), ``fn`` = the call
(tool-call JSON lines, or the fenced command as emitted), ``obs`` = the following ``tool`` /
``user`` messages joined with ``"\\n\\n"``, each rendered as its own message. Messages before the
first assistant message are excluded context.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .._core import words
from .trajectory import Step, Trajectory
from ._common import Where, repo_from_instance
from ._registry import register_importer
from ._responses import is_responses, responses_to_chat
from ._sources import Source, names_of

MINI_FENCE = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)
OBS_SEP = "\n\n"
OPENHANDS = words.OPENHANDS  # the agent of an OpenHands completion log


def _is_completion_log(rec: dict) -> bool:
    return isinstance(rec.get("response"), dict) or isinstance(rec.get("final_response"), dict)


def messages_of(record: Any) -> list | None:
    """The message list of a record in any of the shapes above, or None."""
    if isinstance(record, list) and record and all(isinstance(m, dict) and "role" in m for m in record):
        return record
    if isinstance(record, dict) and isinstance(record.get("messages"), list):
        msgs = list(record["messages"])
        if is_responses(msgs):    # mini-swe-agent 2.x with a Responses API model
            msgs = responses_to_chat(msgs)
        resp = record.get("response")
        if isinstance(resp, dict) and isinstance(resp.get("choices"), list) and resp["choices"]:
            msg = resp["choices"][0].get("message") if isinstance(resp["choices"][0], dict) else None
            if isinstance(msg, dict):
                msgs.append(msg)
        elif isinstance(record.get("final_response"), dict):
            msgs.append(record["final_response"])
        return msgs
    return None


def is_mini(record: Any, msgs: list) -> bool:
    if isinstance(record, dict) and str(record.get("trajectory_format", "")).startswith("mini-swe-agent"):
        return True
    assistants = [m for m in msgs if isinstance(m, dict) and m.get("role") == "assistant"]
    return bool(assistants) and not any(m.get("tool_calls") for m in assistants) and \
        any(isinstance(m.get("content"), str) and MINI_FENCE.search(m["content"]) for m in assistants)


def _content(m: dict, where: Where, p: str) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return join_text_parts(c, where, f"{p}content")
    raise where.error(f"{p}content", f"must be a string, null or a list of text parts, got {type(c).__name__}")


def join_text_parts(parts: list, where: Where, field: str, sep: str = "") -> str:
    """The texts of ``[{"type": "text", "text": ...}, ...]`` joined by ``sep``; any other part is an
    error naming ``field[k]``."""
    out = []
    for k, part in enumerate(parts):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise where.error(f"{field}[{k}]", "only text content parts can be imported")
        out.append(part["text"])
    return sep.join(out)


def _call_json(call: Any, where: Where, p: str) -> str:
    fnc = where.get(call, "function", dict, prefix=p)
    name = where.get(fnc, "name", str, prefix=f"{p}function.")
    args = fnc.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # malformed arguments are kept as the model emitted them
    elif not isinstance(args, dict):
        raise where.error(f"{p}function.arguments", "must be a JSON string or an object")
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


def _read(record: Any, where: Where, src: Source, *, mini: bool) -> Trajectory:
    msgs = messages_of(record)
    iid, run = names_of(src, record)
    if where.line is not None and not (isinstance(record, dict) and any(
            isinstance(h, dict) and isinstance(h.get("instance_id"), str)
            for h in (record, record.get("metadata"), record.get("instance")))):
        raise where.error("instance_id", "is missing (required for each line of a JSONL file)")
    if where.line is not None and not (isinstance(record, dict) and isinstance(record.get("run"), str)):
        run = src.basename.rsplit(".jsonl", 1)[0]
    return parse(record, msgs, where, mini=mini, instance_id=iid, run=run)


def _has_messages(record: Any) -> bool:
    return messages_of(record) is not None


def _looks_mini(record: Any) -> bool:
    msgs = messages_of(record)
    return msgs is not None and is_mini(record, msgs)


_NO_MESSAGES = ("messages", "is missing (not a chat-message trajectory)")


@register_importer(words.MINISWEAGENT, detect=_looks_mini, accepts=_has_messages, missing=_NO_MESSAGES,
                   describe="a mini-swe-agent", priority=30)
def read_mini(record: Any, where: Where, src: Source) -> Trajectory:
    """A mini-swe-agent trajectory (one fenced bash block per reply); agent from the record or file."""
    return _read(record, where, src, mini=True)


@register_importer(words.OPENAI, detect=_has_messages, missing=_NO_MESSAGES, describe="an OpenAI-chat", priority=40)
def read_openai(record: Any, where: Where, src: Source) -> Trajectory:
    """OpenAI chat messages with tool calls (OpenHands, vLLM); agent from the record or file."""
    return _read(record, where, src, mini=False)


def parse(record: Any, msgs: list, where: Where, *, mini: bool, instance_id: str, run: str) -> Trajectory:
    # mini-swe-agent 2.x ends a run with a role "exit" message (``extra.exit_status``, ``extra.submission``):
    # written by the scaffold, never sent to the model
    msgs = [m for m in msgs if not (isinstance(m, dict) and m.get("role") == "exit")]
    roles = []
    for i, m in enumerate(msgs):
        roles.append(where.get(m, "role", str, prefix=f"messages[{i}]."))
    first_ai = next((i for i, r in enumerate(roles) if r == "assistant"), None)
    if first_ai is None:
        raise where.error("messages", "has no assistant message (nothing to import)")
    context = [{"role": roles[i], "content": _content(msgs[i], where, f"messages[{i}].")} for i in range(first_ai)]
    users = [c["content"] for c in context if c["role"] == "user"]
    rec = record if isinstance(record, dict) else {}
    task = _task(rec, users, mini)
    if task is None:
        raise where.error("messages", "has no user message before the first assistant message (no task prompt)")
    steps: list[Step] = []
    i = first_ai
    while i < len(msgs):
        if roles[i] != "assistant":
            raise where.error(f"messages[{i}].role", f"expected an assistant message, got {roles[i]!r}")
        j = i + 1
        while j < len(msgs) and roles[j] != "assistant":
            j += 1
        steps.append(_step(msgs[i], [(roles[k], msgs[k], k) for k in range(i + 1, j)], where, i, mini))
        i = j
    info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
    meta: dict[str, Any] = {}
    for k in ("exit_status", "mini_version"):
        if k in info:
            meta[k] = info[k]
    if "trajectory_format" in rec:
        meta["trajectory_format"] = rec["trajectory_format"]
    reward = _reward(rec, where)
    patch = next((v for v in (rec.get("patch"), rec.get("model_patch"), info.get("submission"),
                              (rec.get("test_result") or {}).get("git_patch") if isinstance(rec.get("test_result"), dict) else None)
                  if isinstance(v, str)), "")
    system_prompt = next((c["content"] for c in context if c["role"] == "system"), None)
    fmt = words.MINISWEAGENT if mini else words.OPENAI
    agent = rec.get("agent") if isinstance(rec.get("agent"), str) else \
        OPENHANDS if not mini and _is_completion_log(rec) else fmt
    return Trajectory(
        traj_id=f"{run}/{instance_id}", instance_id=instance_id,
        repo=rec.get("repo") if isinstance(rec.get("repo"), str) else repo_from_instance(instance_id),
        task_prompt=task, steps=steps, patch=patch, reward=reward, system_prompt=system_prompt,
        agent=agent, run=run, source_format=fmt,
        source_id=where.source if where.line is None else f"{where.source}:{where.line}",
        meta=meta, context=context)


def _task(rec: dict, users: list[str], mini: bool) -> str | None:
    for k in ("problem_statement", "instruction", "task"):
        if isinstance(rec.get(k), str):
            return rec[k]
    if not users:
        return None
    if mini:
        a = users[0].find("Consider the following PR description:\n")
        b = users[0].find("\n</pr_description>", a + 1)
        if a >= 0 and b > a:
            return users[0][a + len("Consider the following PR description:\n"):b]
    return users[0]


def _reward(rec: dict, where: Where) -> float | None:
    if "reward" in rec and rec["reward"] is not None:
        r = where.get(rec, "reward", (int, float))
        return float(r)
    if "resolved" in rec and rec["resolved"] is not None:
        return float(where.get(rec, "resolved", (bool, int)))
    tr = rec.get("test_result")
    if isinstance(tr, dict) and isinstance(tr.get("report"), dict) and isinstance(tr["report"].get("resolved"), bool):
        return float(tr["report"]["resolved"])
    return None


def _step(m: dict, replies: list[tuple[str, dict, int]], where: Where, i: int, mini: bool,
          field: str = "messages") -> Step:
    """Step of the assistant message ``m`` (``{field}[i]`` in errors) and the messages that answer it."""
    p = f"{field}[{i}]."
    content = _content(m, where, p)
    parts: list[list] = []
    cot = ""
    meta: dict[str, Any] = {}
    rc = m.get("reasoning_content")
    if isinstance(rc, str) and rc:
        parts += [["markup", "<think>\n"], ["cot", len(rc)], ["markup", "\n</think>\n\n"]]
        cot = rc
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise where.error(f"{p}tool_calls", "must be a list")
    fn = ""
    tool_parts: list[list] = []
    if calls:
        lines = [_call_json(c, where, f"{p}tool_calls[{k}].") for k, c in enumerate(calls)]
        fn = "\n".join(lines)
        for k, line in enumerate(lines):
            tool_parts += ([["skip", "fn", 1]] if k else []) + [["fn", len(line)]]
        if content:
            parts.append(["cot", len(content)])
            cot += content
        style = "tool_calls"
    else:
        style = "text"
        blocks = list(MINI_FENCE.finditer(content)) if mini else []
        if len(blocks) == 1:
            b = blocks[0]
            a, s, e, d = b.start(), b.start(1), b.end(1), b.end()
            fn = content[s:e]
            cot += content[:a] + content[d:]
            parts += ([["cot", a]] if a else []) + [["markup", content[a:s]], ["fn", e - s], ["markup", content[e:d]]]
            if d < len(content):
                parts.append(["cot", len(content) - d])
        else:
            if mini:
                meta["format_error"] = f"{len(blocks)} bash blocks"
            cot += content
            if content:
                parts.append(["cot", len(content)])
    msg: dict[str, Any] = {"role": "assistant", "parts": parts}
    if tool_parts:
        msg["tool_calls"] = tool_parts
        msg["tool_call_ids"] = [c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{k}"
                                for k, c in enumerate(calls)]
    layout: list[dict[str, Any]] = [msg]
    obs_texts: list[str] = []
    obs_role = "user"
    for k, (role, rm, idx) in enumerate(replies):
        text = _content(rm, where, f"{field}[{idx}].")
        if k == 0:
            obs_role = role
        om: dict[str, Any] = {"role": role, "parts": ([["skip", "obs", len(OBS_SEP)]] if k else []) + [["obs", len(text)]]}
        for key in ("tool_call_id", "name"):
            if isinstance(rm.get(key), str):
                om[key] = rm[key]
        layout.append(om)
        obs_texts.append(text)
    return Step(cot=cot, fn=fn, obs=OBS_SEP.join(obs_texts), fn_style=style, obs_role=obs_role, meta=meta,
                layout=layout)
