"""OpenHands SWE-bench ``output.jsonl`` (one ``EvalOutput`` per line: ``instance_id``, ``instruction``,
``instance``, ``test_result`` with ``git_patch``, ``metadata``, ``history``, ``metrics``, ``error``).

Followed: ``EvalOutput`` of ``evaluation/utils/shared.py`` and ``process_instance`` of
``evaluation/benchmarks/swe_bench/run_infer.py`` (``history`` = ``event_to_dict`` of every event);
``event_to_dict`` of ``openhands/events/serialization/event.py`` (an action: ``id``, ``source``,
``action``, ``args``, ``tool_call_metadata``; an observation: ``observation``, ``content``,
``extras``, ``cause``, ``tool_call_metadata``); ``ToolCallMetadata`` of ``openhands/events/tool.py``
(``tool_call_id``, ``function_name``, ``model_response`` = the LLM reply); how ``ConversationMemory``
(``openhands/memory/conversation_memory.py``) turns events into messages: one assistant message per
LLM reply (``model_response.choices[0].message``: its text and all its ``tool_calls``), then one
``tool`` message per call in the calls' order; a command's output as
``CmdOutputObservation.to_agent_observation`` (``openhands/events/observation/commands.py``).
Histories of 2024 versions (a list of ``[action, observation]`` pairs) are read the same way.
The OpenHands SDK (V1; ``OpenHands/benchmarks``, ``benchmarks/swebench/run_infer.py``) writes the
same ``EvalOutput`` with typed events (``kind``): ``SystemPromptEvent``, ``MessageEvent``,
``ActionEvent`` (``thought``, ``reasoning_content``, ``tool_call``, ``llm_response_id``),
``ObservationEvent``, ``AgentErrorEvent``, ``UserRejectObservation``
(``openhands-sdk/openhands/sdk/event/`` of ``OpenHands/software-agent-sdk``); they become messages
as ``LLMConvertibleEvent.events_to_messages`` builds them (text parts joined by ``"\\n"``, as
``Message._string_serializer`` sends them; a terminal's output as ``TerminalObservation.to_llm_content``).

Mapping: the ``system`` action and the task (``instruction``) are the excluded context; each LLM
reply is a step: its text (and ``reasoning_content``) -> cot, its tool calls -> fn, the observations
answering them -> obs. An agent action without ``tool_call_metadata`` (non-function-calling runs) is
one step whose call is ``{"name": action, "arguments": args}``, answered by the observation whose
``cause`` is the action. Messages from the user after the task are observations (``user``).
Recall, state-change and condensation events reach the model other ways or not at all: they are
counted in ``meta["events_not_rendered"]``.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from .trajectory import Trajectory
from ._chat import OPENHANDS, _reward, join_text_parts, parse as _chat_parse
from ._common import Where, repo_from_instance
from ._registry import register_importer
from ._sources import Source

_CONTEXT_ACTIONS = ("system",)
_NOT_RENDERED = ("recall", "change_agent_state", "agent_state_changed", "condensation", "condensation_request",
                 "null", "pause", "resume", "stop")


def looks_like(record: Any) -> bool:
    return isinstance(record, dict) and isinstance(record.get("history"), list) and \
        isinstance(record.get("instance_id"), str) and isinstance(record.get("test_result"), dict) and \
        "trajectory" not in record


@register_importer(OPENHANDS, detect=looks_like, missing=("history", "is missing (not an OpenHands output.jsonl record)"),
                   describe="an OpenHands output.jsonl", priority=12)
def read(record: dict, where: Where, src: Source) -> Trajectory:
    """One ``output.jsonl`` line; run = the record's ``run``, else the folder holding the file."""
    run = record.get("run") if isinstance(record.get("run"), str) else None
    if run is None:
        run = src.folder or src.basename.rsplit(".jsonl", 1)[0]
        src.inferred["run"] = "the folder name" if src.folder else "the file name"
    return parse(record, where, run=run)


def events_of(history: list, where: Where) -> list[tuple[str, dict]]:
    """(name in errors, event) of ``history``: a flat list, or the 2024 list of ``[action, observation]``
    pairs."""
    events = []
    for i, h in enumerate(history):
        if isinstance(h, list):
            events += [(f"history[{i}][{j}]", e) for j, e in enumerate(h) if isinstance(e, dict) and e]
        elif isinstance(h, dict):
            events.append((f"history[{i}]", h))
        else:
            raise where.error(f"history[{i}]", f"must be an event object or an [action, observation] pair, "
                                               f"got {type(h).__name__}")
    return events


def observation_text(ev: dict) -> str:
    """What the model read of an observation: a command's output with OpenHands' working-directory
    and exit-code lines (``to_agent_observation``), an error with the line ``ConversationMemory``
    appends, any other observation's ``content``."""
    content = ev.get("content") if isinstance(ev.get("content"), str) else ""
    if ev.get("observation") == "error":
        return content + "\n[Error occurred in processing last action]"
    md = (ev.get("extras") or {}).get("metadata") if isinstance(ev.get("extras"), dict) else None
    return command_text(content, md) if ev.get("observation") == "run" else content


def command_text(content: str, md: Any) -> str:
    """A command's output as the model reads it (``to_agent_observation`` of OpenHands, and of the
    SDK's ``TerminalObservation``): prefix, output, suffix, then the directory, interpreter and exit-code
    lines its ``metadata`` gives."""
    if not isinstance(md, dict):
        return content
    text = f"{md.get('prefix') or ''}{content}{md.get('suffix') or ''}"
    if md.get("working_dir"):
        text += f"\n[Current working directory: {md['working_dir']}]"
    if md.get("py_interpreter_path"):
        text += f"\n[Python interpreter: {md['py_interpreter_path']}]"
    if md.get("exit_code", -1) != -1:
        text += f"\n[Command finished with exit code {md['exit_code']}]"
    return text


def _reply_of(ev: dict, where: Where, p: str) -> tuple[str, dict] | None:
    """(response id, assistant message) of an action's ``tool_call_metadata``, or None."""
    tcm = ev.get("tool_call_metadata")
    if tcm is None:
        return None
    resp = where.get(tcm, "model_response", dict, prefix=f"{p}tool_call_metadata.")
    choices = where.get(resp, "choices", list, prefix=f"{p}tool_call_metadata.model_response.")
    if not choices:
        raise where.error(f"{p}tool_call_metadata.model_response.choices", "is empty")
    q = f"{p}tool_call_metadata.model_response.choices[0].message."
    msg = where.get(choices[0], "message", dict, prefix=q[:-len("message.")])
    calls = where.get(msg, "tool_calls", list, prefix=q, optional=True, default=[])
    for k, c in enumerate(calls):
        where.get(where.get(c, "function", dict, prefix=f"{q}tool_calls[{k}]."), "name", str,
                  prefix=f"{q}tool_calls[{k}].function.")
    rid = resp.get("id") if isinstance(resp.get("id"), str) else f"{p}reply"
    return rid, msg


def messages_of(events: list[tuple[str, dict]], where: Where) -> tuple[list[dict], int]:
    """The chat messages the events become after the context, and how many events were not rendered."""
    msgs: list[dict] = []
    by_call: dict[str, dict] = {}      # tool_call_id -> tool message
    by_cause: dict[int, dict] = {}     # action id -> its assistant message (non-function-calling actions)
    pending: list[tuple[dict, list[str]]] = []   # assistant message, its call ids in order
    seen_replies: set[str] = set()
    skipped = 0
    for name, ev in events:
        p = f"{name}."
        if "action" in ev:
            kind, source = ev["action"], ev.get("source")
            if kind in _NOT_RENDERED:
                skipped += 1
                continue
            if source == "user" or source == "environment":
                if kind == "message":
                    args = where.get(ev, "args", dict, prefix=p)
                    msgs.append({"role": "user", "content": where.get(args, "content", str, prefix=f"{p}args.")})
                else:
                    skipped += 1
                continue
            reply = _reply_of(ev, where, p)
            if reply is not None:
                rid, msg = reply
                if rid in seen_replies:
                    continue   # another call of a reply already turned into a message
                seen_replies.add(rid)
                calls = msg.get("tool_calls") or []
                am = {"role": "assistant", "content": msg.get("content"), "tool_calls": calls}
                if isinstance(msg.get("reasoning_content"), str):
                    am["reasoning_content"] = msg["reasoning_content"]
                msgs.append(am)
                pending.append((am, [c.get("id") for c in calls if isinstance(c, dict)]))
                continue
            args = where.get(ev, "args", dict, prefix=p)
            if kind == "message":      # the agent talking without a tool (a final answer)
                msgs.append({"role": "assistant", "content": where.get(args, "content", str, prefix=f"{p}args.")})
                continue
            thought = args.get("thought") if isinstance(args.get("thought"), str) else ""
            call_id = f"event_{ev.get('id', name)}"
            arguments = {k: v for k, v in args.items() if k != "thought"}
            am = {"role": "assistant", "content": thought, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": kind, "arguments": json.dumps(arguments)}}]}
            msgs.append(am)
            pending.append((am, [call_id]))
            if isinstance(ev.get("id"), int):
                by_cause[ev["id"]] = am
        elif "observation" in ev:
            if ev["observation"] in _NOT_RENDERED or ev.get("source") == "environment":
                skipped += 1
                continue
            tcm = ev.get("tool_call_metadata")
            if isinstance(tcm, dict) and isinstance(tcm.get("tool_call_id"), str):
                cid = tcm["tool_call_id"]
                tm = {"role": "tool", "content": observation_text(ev), "tool_call_id": cid}
                if isinstance(tcm.get("function_name"), str):
                    tm["name"] = tcm["function_name"]
                by_call[cid] = tm
            elif isinstance(ev.get("cause"), int) and ev["cause"] in by_cause:
                am = by_cause[ev["cause"]]
                cid = am["tool_calls"][0]["id"]
                by_call[cid] = {"role": "tool", "content": observation_text(ev), "tool_call_id": cid}
            else:   # e.g. an error of a reply that could not be run: sent as a user message
                msgs.append({"role": "user", "content": observation_text(ev)})
        else:
            raise where.error(name, "is neither an action nor an observation")
    return _answered(msgs, pending, by_call), skipped + len(by_call)


def _answered(msgs: list[dict], pending: list[tuple[dict, list[str]]], by_call: dict[str, dict]) -> list[dict]:
    """``msgs`` with each assistant message followed by the answers to its calls in the calls' order
    (``by_call`` keeps the answers no call asked for)."""
    out: list[dict] = []
    answers = {id(am): ids for am, ids in pending}
    for m in msgs:
        out.append(m)
        for cid in answers.get(id(m), []):
            if cid in by_call:
                out.append(by_call.pop(cid))
    return out


_V1_ANSWERS = ("ObservationEvent", "AgentErrorEvent", "UserRejectObservation")
_ERROR_HEADER = "[An error occurred during execution.]\n"   # the SDK's Observation.ERROR_MESSAGE_HEADER


def _texts(parts: Any, where: Where, p: str) -> str:
    """Text parts joined as the SDK sends a message as one string (``"\\n"``)."""
    if parts is None:
        return ""
    if not isinstance(parts, list):
        raise where.error(p, "must be a list of content parts")
    return join_text_parts(parts, where, p, "\n")


def _v1_answer(ev: dict, where: Where, p: str) -> str:
    """The tool message of an SDK observation, error or rejection (their ``to_llm_message``)."""
    kind = ev["kind"]
    if kind == "AgentErrorEvent":
        return where.get(ev, "error", str, prefix=p)
    if kind == "UserRejectObservation":
        return f"Action rejected: {where.get(ev, 'rejection_reason', str, prefix=p)}"
    obs = where.get(ev, "observation", dict, prefix=p)
    parts = sdk_observation_parts(obs, where, f"{p}observation.")
    extended = _texts(ev.get("extended_content"), where, f"{p}extended_content")
    return "\n".join(parts + ([extended] if extended else []))


def sdk_observation_parts(obs: dict, where: Where, p: str) -> list[str]:
    """The text parts of an SDK observation as its ``to_llm_content`` gives them to the model, by its
    ``kind`` (images left out). Two generations of the SDK are followed:

    - since the ``Observation`` base class was standardised (SDK 1.1, ``openhands-sdk/.../tool/schema.py``):
      ``content`` (text parts) after the ``ERROR_MESSAGE_HEADER`` line when ``is_error``; a terminal's
      (``TerminalObservation``, ``ExecuteBashObservation``) text with its ``metadata`` lines;
    - before it (SDK 1.0, ``openhands-tools``): each kind its own fields: ``ExecuteBashObservation``
      ``output`` (with ``metadata``, after "[There was an error during command execution.]" on
      ``error``), ``FileEditorObservation`` ``error`` else ``output``, ``BrowserObservation`` "Error:
      ``error``" else ``output``, ``FinishObservation`` / ``DelegateObservation`` ``message``,
      ``ThinkObservation`` / ``TaskTrackerObservation`` ``content``, ``GlobObservation`` /
      ``GrepObservation`` their file lists, ``MCPToolObservation`` the "[Tool ... executed.]" line.

    An observation of another kind is an error naming it, never read by a guessed field. The SDK's
    cut of outputs over its limits (``maybe_truncate``) is not redone: a record holds what the tool gave.
    """
    kind = where.get(obs, "kind", str, prefix=p)

    def g(key: str, **kw: Any) -> str:
        return where.get(obs, key, str, prefix=p, **kw)

    md = obs.get("metadata") if isinstance(obs.get("metadata"), dict) else None
    if kind == "MCPToolObservation":
        head = f"[Tool '{g('tool_name')}' executed.]\n" + (_ERROR_HEADER if obs.get("is_error") else "")
        return [head] + ([_texts(obs["content"], where, f"{p}content")] if obs.get("content") else [])
    if isinstance(obs.get("content"), list):           # the standardised base class
        text = _texts(obs["content"], where, f"{p}content")
        if kind in _SDK_TERMINALS and md is not None:
            text = command_text(text, md)
        return ([_ERROR_HEADER] if obs.get("is_error") else []) + ([text] if text or kind in _SDK_TERMINALS else [])
    if kind in _SDK_TERMINALS:
        text = command_text(g("output"), md)
        return [("[There was an error during command execution.]\n" if obs.get("error") else "") + text]
    if kind in ("FileEditorObservation", "PlanningFileEditorObservation", "StrReplaceEditorObservation"):
        return [g("error") if obs.get("error") else g("output", optional=True, default="")]
    if kind == "BrowserObservation":
        return [f"Error: {g('error')}" if obs.get("error") else g("output")]
    if kind in ("FinishObservation", "DelegateObservation"):
        return [g("message")]
    if kind in ("ThinkObservation", "TaskTrackerObservation"):
        return [g("content", optional=True, default="")]
    if kind in ("GlobObservation", "GrepObservation"):
        return [_found_files(obs, kind, where, p)]
    raise where.error(f"{p}kind", f"observation kind {kind!r} is not one whose rendering is known; import it "
                                  "with --skip-bad to leave its record out, or say which SDK wrote it")


_SDK_TERMINALS = ("TerminalObservation", "ExecuteBashObservation")


def _found_files(obs: dict, kind: str, where: Where, p: str) -> str:
    """``GlobObservation`` / ``GrepObservation.to_llm_content`` of SDK 1.0."""
    if obs.get("error"):
        return f"Error: {where.get(obs, 'error', str, prefix=p)}"
    files = where.get(obs, "files" if kind == "GlobObservation" else "matches", list, prefix=p)
    pattern, path = where.get(obs, "pattern", str, prefix=p), where.get(obs, "search_path", str, prefix=p)
    inc = obs.get("include_pattern")
    inc = f" (filtered by '{inc}')" if kind == "GrepObservation" and inc else ""
    what = "matching pattern" if kind == "GlobObservation" else "containing pattern"
    if not files:
        return f"No files found {what} '{pattern}' in directory '{path}'{inc}"
    text = f"Found {len(files)} file(s) {what} '{pattern}' in '{path}'{inc}:\n" + "\n".join(map(str, files))
    if obs.get("truncated"):
        text += "\n\n[Results truncated to first 100 files. Consider using a more specific pattern.]"
    return text


def v1_messages(events: list[tuple[str, dict]], where: Where) -> tuple[list[dict], int]:
    """The chat messages of an OpenHands SDK (V1) event list, as ``LLMConvertibleEvent.events_to_messages``
    builds them, and how many events were not rendered."""
    msgs: list[dict] = []
    by_reply: dict[str, tuple[dict, list[str]]] = {}
    by_call: dict[str, dict] = {}
    skipped = 0
    for name, ev in events:
        p = f"{name}."
        kind = where.get(ev, "kind", str, prefix=p)
        if kind == "SystemPromptEvent":
            sp = where.get(ev, "system_prompt", dict, prefix=p)
            text = "\n".join(x for x in (_texts([sp], where, f"{p}system_prompt"),
                                         _texts([ev["dynamic_context"]] if ev.get("dynamic_context") else [],
                                                where, f"{p}dynamic_context")) if x)
            msgs.append({"role": "system", "content": text})
        elif kind == "MessageEvent":
            lm = where.get(ev, "llm_message", dict, prefix=p)
            text = "\n".join(x for x in (_texts(lm.get("content"), where, f"{p}llm_message.content"),
                                         _texts(ev.get("extended_content"), where, f"{p}extended_content")) if x)
            m = {"role": "assistant" if ev.get("source") == "agent" else "user", "content": text}
            if isinstance(lm.get("reasoning_content"), str):
                m["reasoning_content"] = lm["reasoning_content"]
            msgs.append(m)
        elif kind == "ActionEvent":
            tc = where.get(ev, "tool_call", dict, prefix=p)
            call = {"id": where.get(tc, "id", str, prefix=f"{p}tool_call."), "type": "function",
                    "function": {"name": where.get(tc, "name", str, prefix=f"{p}tool_call."),
                                 "arguments": where.get(tc, "arguments", (str, dict), prefix=f"{p}tool_call.")}}
            rid = ev.get("llm_response_id") if isinstance(ev.get("llm_response_id"), str) else name
            if rid not in by_reply:
                am = {"role": "assistant", "content": _texts(ev.get("thought"), where, f"{p}thought"), "tool_calls": []}
                if isinstance(ev.get("reasoning_content"), str):
                    am["reasoning_content"] = ev["reasoning_content"]
                by_reply[rid] = (am, [])
                msgs.append(am)
            am, ids = by_reply[rid]
            am["tool_calls"].append(call)
            ids.append(call["id"])
        elif kind in _V1_ANSWERS:
            cid = where.get(ev, "tool_call_id", str, prefix=p)
            tm = {"role": "tool", "content": _v1_answer(ev, where, p), "tool_call_id": cid}
            if isinstance(ev.get("tool_name"), str):
                tm["name"] = ev["tool_name"]
            by_call[cid] = tm
        else:   # state updates, condensations, pauses, hook and log events
            skipped += 1
    return _answered(msgs, list(by_reply.values()), by_call), skipped + len(by_call)


def _v0_messages(events: list[tuple[str, dict]], where: Where) -> tuple[list[dict], list[dict], int, int]:
    """(context, messages, events before the first reply not rendered, events after it not rendered) of
    a history of OpenHands V0 events."""
    g = where.get
    context: list[dict[str, Any]] = []
    start = before = 0    # the first event of a step; events before it that are not rendered
    for n, (name, ev) in enumerate(events):   # the system prompt and the task, up to the first agent reply
        if ev.get("source") == "agent" and "action" in ev and ev["action"] not in _CONTEXT_ACTIONS:
            break
        if ev.get("action") in _CONTEXT_ACTIONS:
            context.append({"role": "system", "content": g(g(ev, "args", dict, prefix=f"{name}."), "content",
                                                               str, prefix=f"{name}.args.")})
        elif ev.get("action") == "message" and ev.get("source") == "user" and \
                not any(c["role"] == "user" for c in context):
            context.append({"role": "user", "content": g(g(ev, "args", dict, prefix=f"{name}."), "content",
                                                             str, prefix=f"{name}.args.")})
        else:
            before += 1
        start = n + 1
    msgs, not_rendered = messages_of(events[start:], where)
    return context, msgs, before, not_rendered


def parse(record: dict, where: Where, *, run: str) -> Trajectory:
    g = where.get
    instance_id = g(record, "instance_id", str)
    events = events_of(g(record, "history", list), where)
    instance = g(record, "instance", dict, optional=True, default={})
    test_result = g(record, "test_result", dict)
    if any("kind" in ev for _, ev in events):   # the OpenHands SDK (V1) writes typed events
        msgs, not_rendered = v1_messages(events, where)
        first_ai = next((k for k, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
        context, msgs = msgs[:first_ai], msgs[first_ai:]
        before = 0
    else:
        context, msgs, before, not_rendered = _v0_messages(events, where)
    instruction = g(record, "instruction", str, optional=True)
    if not any(c["role"] == "user" for c in context):
        if instruction is None:
            raise where.error("instruction", "is missing and the history has no user message (no task prompt)")
        context.append({"role": "user", "content": instruction})
    if not any(m["role"] == "assistant" for m in msgs):
        raise where.error("history", "has no agent action (nothing to import)")
    base = _chat_parse({}, context + msgs, where, mini=False, instance_id=instance_id, run=run)
    problem = instance.get("problem_statement")
    meta: dict[str, Any] = {"events_not_rendered": before + not_rendered}
    md = record.get("metadata")
    if isinstance(md, dict):
        for key in ("agent_class", "git_commit", "max_iterations", "dataset"):
            if key in md:
                meta[key] = md[key]
        for key in ("llm_config", "llm"):     # V0, V1
            if isinstance(md.get(key), dict) and "model" in md[key]:
                meta["model"] = md[key]["model"]
    if isinstance(record.get("attempt"), int):
        meta["attempt"] = record["attempt"]
    if record.get("error"):
        meta["error"] = record["error"]
    patch = g(test_result, "git_patch", str, prefix="test_result.", optional=True, default="")
    return replace(base, repo=instance.get("repo") if isinstance(instance.get("repo"), str)
                   else repo_from_instance(instance_id),
                   task_prompt=problem if isinstance(problem, str) else base.task_prompt, patch=patch,
                   reward=_reward(record, where), agent=OPENHANDS, source_format=OPENHANDS,
                   source_id=f"{where.source}:{where.line}" if where.line is not None else where.source, meta=meta)
