"""OpenAI Responses API items as chat messages, for mini-swe-agent 2.x runs with a ``*_response`` model
(``litellm_response``, ``openrouter_response``, ``portkey_response``).

Followed: ``LitellmResponseModel`` (``src/minisweagent/models/litellm_response_model.py`` of
``SWE-agent/mini-swe-agent``): each reply is kept whole (``"object": "response"`` with its ``output``
items: ``reasoning`` with ``summary`` / ``content`` texts, ``message`` with ``output_text`` parts,
``function_call`` with ``call_id``, ``name``, ``arguments``), and each command's result is a
``function_call_output`` item (``call_id``, ``output``) (``models/utils/actions_toolcall_response.py``);
format errors and human commands are ``message`` items with ``input_text`` parts. One reply becomes
one assistant message (reasoning as ``reasoning_content``, the text, the calls as ``tool_calls``), a
result one ``tool`` message: the shapes ``_chat`` reads.
"""
from __future__ import annotations

from typing import Any

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def is_responses(msgs: list) -> bool:
    """Whether ``msgs`` holds Responses API items (a whole reply or a call's output)."""
    return any(isinstance(m, dict) and (m.get("object") == "response" or m.get("type") == "function_call_output")
               for m in msgs)


def _text(parts: Any, sep: str = "") -> Any:
    """The text of a list of text parts (anything else is returned unchanged, for ``_chat`` to refuse)."""
    if isinstance(parts, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS
                                       and isinstance(p.get("text"), str) for p in parts):
        return sep.join(p["text"] for p in parts)
    return parts


def _reply(resp: dict) -> dict:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for item in resp.get("output") or []:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "reasoning":
            reasoning += [t for t in (_text(item.get("summary") or [], "\n"), _text(item.get("content") or [], "\n"))
                          if isinstance(t, str) and t]
        elif kind == "message":
            texts.append(_text(item.get("content") or []))
        elif kind == "function_call":
            calls.append({"id": item.get("call_id") or item.get("id"), "type": "function",
                          "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}})
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(t for t in texts if isinstance(t, str)),
                           "tool_calls": calls}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    return msg


def responses_to_chat(msgs: list) -> list:
    """``msgs`` with every Responses API item turned into the chat message it stands for."""
    out = []
    for m in msgs:
        if not isinstance(m, dict):
            out.append(m)
        elif m.get("object") == "response":
            out.append(_reply(m))
        elif m.get("type") == "function_call_output":
            out.append({"role": "tool", "tool_call_id": m.get("call_id"), "content": m.get("output")})
        elif m.get("type") == "message" and "role" in m:
            out.append({"role": m["role"], "content": _text(m.get("content"))})
        else:
            out.append(m)
    return out
