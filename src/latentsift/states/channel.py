"""Rendering a trajectory into the exact tokens a policy saw, with a per-token channel table.

CONTRACT (used by the states stage): ``render(traj, tokenizer, ...) -> Rendering``.
Every token is mapped to (step, channel) or to excluded (step = -1, channel = -1): the task prompt,
the system prompt, chat-template control tokens and role headers are excluded from pooling.

How it works (fast: two template renders and one tokenizer call per trajectory):

1. The trajectory becomes chat messages (``Trajectory.context_messages()`` then each step's
   ``Step.messages_layout()``); every labelled piece of content is a character range.
2. The template is rendered once with a unique sentinel in place of each message's content, which
   gives the template's own text between contents; the real render is checked to equal that markup
   with the contents put back (then every offset is exact). Templates that rewrite content (Qwen3
   dropping earlier ``<think>`` blocks, ``| trim``) fall back to locating each piece in order.
3. The text is tokenized once with ``return_offsets_mapping``; a token belongs to a span iff its
   characters lie entirely inside the span's range. **Whitespace rule**: a token that straddles a
   span boundary (e.g. a ``"\\n\\n"`` merged across content and template markup) is excluded, so a
   span's tokens decode to its text minus at most one partial token at each end.
4. ``<think>`` / ``</think>`` tags inside ``cot`` are markup (excluded); the reasoning between them is
   ``cot``. Structured tool calls are rendered by the template when it knows ``tool_calls``
   (the rendered function name through the end of the rendered arguments is ``fn``); otherwise the
   call JSON is written into the assistant text after the reasoning (``"\\n\\n"`` between).

Pitfall: templates that drop earlier ``<think>`` blocks (Qwen3) cannot show every step's reasoning
in one sequence; ``render`` then raises and ``render_per_step`` gives what the policy saw at each
step. A tokenizer without a chat template (base models) gets ``PLAIN_TEMPLATE``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .._core.registry import registry_add, registry_find, registry_names
from .._core.validation import LatentSiftError, check_positive_int
from ..trajectories.trajectory import CHANNEL_ID, CHANNELS, Trajectory

EXCLUDED = -1
CONTEXT = -2          # internal: content of a context message (excluded, truncated by max_prompt_tokens)

# Documented fallback for tokenizers without a chat template (base models such as Gemma-3-270M):
# BOS when the tokenizer has one, then "### <role>\n<content>\n\n" per message.
PLAIN_TEMPLATE = ("{% if bos_token %}{{ bos_token }}{% endif %}{% for message in messages %}"
                  "{{ '### ' + message['role'] + '\\n' + message['content'] + '\\n\\n' }}{% endfor %}")

_THINK_TAG = re.compile(r"</?think>")


@dataclass
class Rendering:
    """Token ids of one rendered trajectory and the span table.

    input_ids: int64 (n_tokens,)
    step:      int32 (n_tokens,), step index t, or -1 for excluded tokens
    channel:   int8  (n_tokens,), index into CHANNELS (cot=0, obs=1, fn=2), or -1 for excluded
    text:      the rendered text (before any ``max_*_tokens`` truncation)
    offsets:   int64 (n_tokens, 2), character range of each kept token in ``text``
    """

    traj_id: str
    input_ids: np.ndarray
    step: np.ndarray
    channel: np.ndarray
    n_steps: int
    text: str = ""
    offsets: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def _span_numbers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pooled tokens' positions, each one's span number (spans numbered by their first token), and
        each span's first position (vectorised: a replay indexes every token of a 30k-token rendering)."""
        pos = np.flatnonzero(self.step >= 0)
        code = self.step[pos].astype(np.int64) * len(CHANNELS) + self.channel[pos]
        _, first, inv = np.unique(code, return_index=True, return_inverse=True)
        order = np.argsort(first)
        number = np.empty(len(order), dtype=np.int64)
        number[order] = np.arange(len(order))
        return pos, number[inv.reshape(-1)], pos[first[order]]

    def span_keys(self) -> list[tuple[int, int]]:
        """The non-empty (step, channel) spans, ordered by their first token position."""
        return [(int(self.step[p]), int(self.channel[p])) for p in self._span_numbers()[2]]

    def span_index(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Per-token span number (-1 excluded) in ``span_keys`` order, and the keys."""
        pos, number, firsts = self._span_numbers()
        idx = np.full(self.n_tokens, -1, dtype=np.int64)
        idx[pos] = number
        return idx, [(int(self.step[p]), int(self.channel[p])) for p in firsts]


# --------------------------------------------------------------------------------------------------------
@dataclass
class _Msg:
    """One chat message: template dict, labelled content ranges, structured calls."""

    role: str
    content: str
    ranges: list[tuple[int, int, int, int]]      # (start, end, step, channel) in content
    calls: list[tuple[dict, int]]                # (call dict, step) for structured tool calls
    extra: dict[str, Any]


def _messages(traj: Trajectory) -> list[_Msg]:
    msgs: list[_Msg] = []
    for k, m in enumerate(traj.context_messages()):
        c = m.get("content", "")
        if not isinstance(c, str):
            raise LatentSiftError(f"{traj.traj_id}: context message {k} has no text content.")
        extra = {key: v for key, v in m.items() if key not in ("role", "content")}
        msgs.append(_Msg(m["role"], c, [(0, len(c), CONTEXT - k, CONTEXT)] if c else [], [], extra))
    for t, step in enumerate(traj.steps):
        text = {"cot": step.cot, "fn": step.fn, "obs": step.obs}
        cur = {"cot": 0, "fn": 0, "obs": 0}

        def take(ch: str, n: Any, where: str) -> str:
            if ch not in cur or not isinstance(n, int) or n < 0 or cur[ch] + n > len(text[ch]):
                raise LatentSiftError(f"{traj.traj_id}: step {t} layout {where}: part ({ch!r}, {n!r}) does not fit "
                                      f"the {len(text.get(ch, ''))}-character {ch} text at offset {cur.get(ch)}.")
            s = text[ch][cur[ch]:cur[ch] + n]
            cur[ch] += n
            return s

        for mi, lm in enumerate(step.messages_layout()):
            pieces: list[str] = []
            ranges: list[tuple[int, int, int, int]] = []
            pos = 0
            for part in lm.get("parts", []):
                kind = part[0]
                if kind == "markup":
                    pieces.append(part[1])
                    pos += len(part[1])
                elif kind == "skip":
                    take(part[1], part[2], f"message {mi}")
                elif kind in CHANNEL_ID:
                    s = take(kind, part[1], f"message {mi}")
                    pieces.append(s)
                    ranges += _channel_ranges(s, pos, t, kind)
                    pos += len(s)
                else:
                    raise LatentSiftError(f"{traj.traj_id}: step {t} layout message {mi}: unknown part {kind!r}.")
            calls = []
            ids = lm.get("tool_call_ids") or []
            k = 0
            for part in lm.get("tool_calls", []):
                if part[0] == "skip":
                    take(part[1], part[2], f"message {mi} tool_calls")
                    continue
                s = take("fn", part[1], f"message {mi} tool_calls")
                try:
                    call = json.loads(s)
                    name, args = call["name"], call.get("arguments", {})
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise LatentSiftError(f"{traj.traj_id}: step {t}: tool call {s[:60]!r} is not "
                                          '{"name": ..., "arguments": ...} JSON.') from None
                cid = ids[k] if k < len(ids) else f"call_{t}_{k}"
                calls.append(({"id": cid, "type": "function", "function": {"name": name, "arguments": args}}, t))
                k += 1
            extra = {key: v for key, v in lm.items() if key not in ("role", "parts", "tool_calls", "tool_call_ids")}
            msgs.append(_Msg(lm["role"], "".join(pieces), ranges, calls, extra))
        for ch, n in cur.items():
            if n != len(text[ch]):
                raise LatentSiftError(f"{traj.traj_id}: step {t} layout covers {n} of the {len(text[ch])} "
                                      f"characters of {ch}; every character must be rendered or skipped.")
    return msgs


def _channel_ranges(s: str, pos: int, t: int, kind: str) -> list[tuple[int, int, int, int]]:
    """Ranges of one labelled piece; ``<think>`` tags inside cot are cut out as markup."""
    ch = CHANNEL_ID[kind]
    if kind != "cot" or "think>" not in s:
        return [(pos, pos + len(s), t, ch)] if s else []
    out, a = [], 0
    for m in _THINK_TAG.finditer(s):
        if m.start() > a:
            out.append((pos + a, pos + m.start(), t, ch))
        a = m.end()
    if a < len(s):
        out.append((pos + a, pos + len(s), t, ch))
    return out


# --------------------------------------------------------------------------------------------------------
def _template_of(tokenizer, template: str | None) -> str:
    if template is not None:
        return template
    return getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE


def _apply(tokenizer, msgs: list[dict], template: str) -> str:
    out = tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=False)
    if not isinstance(out, str):
        raise LatentSiftError("The tokenizer's apply_chat_template did not return text.")
    return out


def _template_dicts(msgs: list[_Msg], contents: Sequence[str], structured: bool) -> list[dict]:
    out = []
    for m, c in zip(msgs, contents):
        d: dict[str, Any] = {"role": m.role, "content": c, **m.extra}
        if m.calls and structured:
            d["tool_calls"] = [call for call, _ in m.calls]
        out.append(d)
    return out


def _inline_calls(msgs: list[_Msg]) -> list[_Msg]:
    """Templates without tool-call support: the call JSON goes into the assistant text."""
    out = []
    for m in msgs:
        if not m.calls:
            out.append(m)
            continue
        content, ranges = m.content, list(m.ranges)
        for call, t in m.calls:
            js = json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                            ensure_ascii=False)
            if content:
                content += "\n\n"
            ranges.append((len(content), len(content) + len(js), t, CHANNEL_ID["fn"]))
            content += js
        out.append(_Msg(m.role, content, ranges, [], m.extra))
    return out


def _locate(msgs: list[_Msg], tokenizer, template: str,
            structured: bool) -> tuple[str, list[tuple[int, int, int, int]]]:
    """The rendered text and the labelled ranges as absolute character offsets in it."""
    sentinels = [f"\ue000{i}\ue001" for i in range(len(msgs))]
    text = _apply(tokenizer, _template_dicts(msgs, [m.content for m in msgs], structured), template)
    marked = _apply(tokenizer, _template_dicts(msgs, sentinels, structured), template)
    starts: list[int] = []
    built: list[str] = []
    n_built, a = 0, 0
    for s, m in zip(sentinels, msgs):
        k = marked.find(s, a)
        if k < 0:
            break
        built += [marked[a:k], m.content]
        starts.append(n_built + k - a)
        n_built += k - a + len(m.content)
        a = k + len(s)
    exact = len(starts) == len(msgs) and "".join(built) + marked[a:] == text
    out: list[tuple[int, int, int, int]] = []
    ends: list[int] = []
    if exact:   # the template copies every content verbatim: offsets are exact
        for m, s0 in zip(msgs, starts):
            out += [(s0 + x, s0 + y, st, ch) for x, y, st, ch in m.ranges]
            ends.append(s0 + len(m.content))
    else:       # the template rewrites some content: find each message, else each piece, in order
        cur = 0
        for m in msgs:
            k = text.find(m.content, cur) if m.content else -1
            if k >= 0:
                out += [(k + x, k + y, st, ch) for x, y, st, ch in m.ranges]
                cur = k + len(m.content)
                ends.append(cur)
                continue
            for x, y, st, ch in m.ranges:
                piece = m.content[x:y]
                core = piece.strip()
                k = text.find(piece, cur)
                if k >= 0:
                    out.append((k, k + len(piece), st, ch))
                    cur = k + len(piece)
                elif core and (k := text.find(core, cur)) >= 0:     # the template trimmed it
                    out.append((k, k + len(core), st, ch))
                    cur = k + len(core)
                elif st >= 0 and core:
                    raise LatentSiftError(
                        f"The chat template dropped or rewrote text of step {st} ({CHANNELS[ch]}): templates "
                        "that drop earlier <think> blocks (Qwen3-style) cannot show every step in one "
                        "sequence; use render_per_step().")
            ends.append(cur)
    if structured:
        out.sort()
        out += _call_ranges(text, msgs, out, ends)
    out.sort()
    return text, out


def _call_ranges(text: str, msgs: list[_Msg], ranges, ends: list[int]) -> list[tuple[int, int, int, int]]:
    """fn ranges of template-rendered tool calls: the function name through the end of its arguments."""
    out = []
    for i, m in enumerate(msgs):
        if not m.calls:
            continue
        cur = ends[i]
        stop = min((x for x, _, _, _ in ranges if x >= cur), default=len(text))
        for call, t in m.calls:
            name = call["function"]["name"]
            args = call["function"]["arguments"]
            k = text.find(name, cur, stop)
            if k < 0:
                raise LatentSiftError(f"The chat template did not render the tool call {name!r} of step {t}.")
            end = k + len(name)
            if isinstance(args, dict):
                for cand in (json.dumps(args, ensure_ascii=False), json.dumps(args)):
                    e = text.find(cand, end, stop)
                    if e >= 0:
                        end = e + len(cand)
                        break
                else:   # the template formats arguments its own way: through the last argument value
                    for v in args.values():
                        vs = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                        e = text.find(vs, end, stop)
                        if e >= 0:
                            end = e + len(vs)
            elif isinstance(args, str):
                e = text.find(args, end, stop)
                if e >= 0:
                    end = e + len(args)
            if t >= 0:
                out.append((k, end, t, CHANNEL_ID["fn"]))
            cur = end
    return out


def _assign(offsets: np.ndarray, ranges: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(step, channel) per token: the range that contains the token entirely, else excluded (-1, -1)."""
    n = offsets.shape[0]
    step = np.full(n, EXCLUDED, dtype=np.int32)
    chan = np.full(n, EXCLUDED, dtype=np.int8)
    if not ranges or n == 0:
        return step, chan
    r = np.asarray(ranges, dtype=np.int64)
    a, b = offsets[:, 0], offsets[:, 1]
    idx = np.searchsorted(r[:, 0], a, side="right") - 1
    ok = (idx >= 0) & (b > a)
    idx_c = np.clip(idx, 0, None)
    ok &= (a >= r[idx_c, 0]) & (b <= r[idx_c, 1])
    step[ok] = r[idx_c[ok], 2]
    chan[ok] = r[idx_c[ok], 3]
    return step, chan


def _truncate(step: np.ndarray, chan: np.ndarray, max_span: int | None, max_prompt: int | None,
              step_limits: Mapping[int, int] | None = None) -> np.ndarray:
    """Keep-mask: the first ``max_span`` tokens of every (step, channel) span (``step_limits[t]`` tokens
    for a step t it names) and the first ``max_prompt`` tokens of every context message's content;
    markup and control tokens are always kept."""
    keep = np.ones(step.shape[0], dtype=bool)
    for limit, sel, per_step in ((max_span, step >= 0, step_limits or {}), (max_prompt, step <= CONTEXT, {})):
        if (limit is None and not per_step) or not sel.any():
            continue
        pos = np.flatnonzero(sel)
        key = step[pos].astype(np.int64) * 8 + chan[pos]
        order = np.argsort(key, kind="stable")
        sk = key[order]
        first = np.r_[0, np.flatnonzero(np.diff(sk)) + 1]
        rank = np.arange(sk.size) - np.repeat(first, np.diff(np.r_[first, sk.size]))
        lim = np.full(sk.size, np.iinfo(np.int64).max if limit is None else limit, dtype=np.int64)
        for t, n in per_step.items():
            lim[step[pos[order]] == t] = n
        keep[pos[order[rank >= lim]]] = False
    return keep


def _encode(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    if not getattr(tokenizer, "is_fast", False):
        raise LatentSiftError("render needs a fast (Rust) tokenizer for character offsets; load it with "
                              "use_fast=True.")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    off = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    return ids, off


def _supports_tool_calls(template: str) -> bool:
    return "tool_calls" in template


def _render_msgs(traj: Trajectory, msgs: list[_Msg], tokenizer, template: str, *, max_span_tokens,
                 max_prompt_tokens, patch_step_tokens: int | None = None) -> Rendering:
    structured = _supports_tool_calls(template)
    if not structured:
        msgs = _inline_calls(msgs)
    text, ranges = _locate(msgs, tokenizer, template, structured)
    ids, off = _encode(tokenizer, text)
    step, chan = _assign(off, ranges)
    limits = {} if patch_step_tokens is None or (p := patch_step(traj)) is None else {p: patch_step_tokens}
    keep = _truncate(step, chan, max_span_tokens, max_prompt_tokens, limits)
    ctx = step <= CONTEXT
    step[ctx], chan[ctx] = EXCLUDED, EXCLUDED
    return Rendering(traj_id=traj.traj_id, input_ids=ids[keep], step=step[keep], channel=chan[keep],
                     n_steps=traj.n_steps, text=text, offsets=off[keep])


def _check_limits(owner: str, **limits) -> None:
    for name, v in limits.items():
        if v is not None:
            check_positive_int(v, name, owner)


def render(traj: Trajectory, tokenizer, *, max_span_tokens: int | None = None,
           max_prompt_tokens: int | None = None, template: str | None = None,
           patch_step_tokens: int | None = None) -> Rendering:
    """The exact token ids of ``traj`` under the policy's chat template, and the span table.

    ``max_span_tokens`` keeps the first N tokens of every cot / fn / obs span (None = the exact full
    trajectory); ``max_prompt_tokens`` keeps the first N tokens of every context message's content
    (system prompt, task prompt, demonstrations). Role headers and control tokens are always kept.
    ``patch_step_tokens`` keeps the first N tokens of each span of the step that wrote the final patch
    (``patch_step``) instead of ``max_span_tokens`` (None: that step is cut like every other).
    ``template`` overrides the tokenizer's chat template (a tokenizer without one gets
    ``PLAIN_TEMPLATE``). Raises when the template drops step text (use ``render_per_step``).
    """
    _check_limits("render", max_span_tokens=max_span_tokens, max_prompt_tokens=max_prompt_tokens,
                  patch_step_tokens=patch_step_tokens)
    tmpl = _template_of(tokenizer, template)
    return _render_msgs(traj, _messages(traj), tokenizer, tmpl, max_span_tokens=max_span_tokens,
                        max_prompt_tokens=max_prompt_tokens, patch_step_tokens=patch_step_tokens)


def render_per_step(traj: Trajectory, tokenizer, *, max_span_tokens: int | None = None,
                    max_prompt_tokens: int | None = None, template: str | None = None,
                    patch_step_tokens: int | None = None) -> list[Rendering]:
    """What the policy saw when it wrote each step, for templates that drop earlier ``<think>`` blocks.

    Rendering k (k = 0..T-1) holds the context, steps 0..k-1 as the template shows them in history,
    then step k's assistant turn as the last turn; it labels ``obs`` of step k-1 and ``cot`` / ``fn``
    of step k (everything else is excluded context). A final rendering labels the last step's ``obs``
    when it is non-empty. Every (step, channel) span is labelled in exactly one rendering. Costs
    O(T^2) tokens: use ``render`` (one sequence) whenever the template keeps every step's text.
    """
    _check_limits("render_per_step", max_span_tokens=max_span_tokens, max_prompt_tokens=max_prompt_tokens,
                  patch_step_tokens=patch_step_tokens)
    tmpl = _template_of(tokenizer, template)
    msgs = _messages(traj)
    first = len(traj.context_messages())     # index of each step's first (assistant) message
    starts = []
    for step in traj.steps:
        starts.append(first)
        first += len(step.messages_layout())
    cot, obs, fn = CHANNEL_ID["cot"], CHANNEL_ID["obs"], CHANNEL_ID["fn"]
    out = []
    for k, s0 in enumerate(starts):
        sub = [_only(m, {(k - 1, obs)}) for m in msgs[:s0]] + [_only(msgs[s0], {(k, cot), (k, fn)})]
        out.append(_render_msgs(traj, sub, tokenizer, tmpl, max_span_tokens=max_span_tokens,
                                max_prompt_tokens=max_prompt_tokens, patch_step_tokens=patch_step_tokens))
    if traj.n_steps and traj.steps[-1].obs:
        last = traj.n_steps - 1
        sub = [_only(m, {(last, obs)}) for m in msgs]
        out.append(_render_msgs(traj, sub, tokenizer, tmpl, max_span_tokens=max_span_tokens,
                                max_prompt_tokens=max_prompt_tokens, patch_step_tokens=patch_step_tokens))
    return out


def _hunk_header(patch: str) -> str | None:
    for line in patch.splitlines():
        if line.startswith("@@") and line.count("@@") >= 2:
            return line.strip()
    return None


#: The span renderers (kind "renderer" of ``latentsift._core.registry``): a renderer is called as
#: ``renderer(traj, tokenizer, max_span_tokens=, max_prompt_tokens=, patch_step_tokens=)`` and returns one
#: ``Rendering`` or a list of them (each replayed in its own context); extraction records it by its module path.
RENDER = registry_add("renderer", "render", render, label="one sequence (the default)").__name__
RENDER_PER_STEP = registry_add("renderer", "render_per_step", render_per_step,
                               label="each step in its own context (O(T^2) tokens)").__name__
#: The module of the renderers as stores written before it moved recorded it (``settings["renderer"]``).
_OLD_RENDERER_MODULE = "latentsift.channel."


def renderer_names() -> tuple[str, ...]:
    """Every registered renderer's name (``latentsift extract --renderer``)."""
    return registry_names("renderer")


def renderer_id(name: str) -> str:
    """The path a store records of the registered renderer ``name`` (module and function)."""
    entry = registry_find("renderer", name)
    if entry is None:
        raise LatentSiftError(f"Unknown renderer {name!r}; registered: {', '.join(renderer_names())}.")
    return f"{entry.obj.__module__}.{entry.obj.__qualname__}"


def same_renderer_id(recorded: str | None) -> str | None:
    """A recorded renderer path as it is recorded now: a store written before the renderers moved to
    ``latentsift.states.channel`` recorded ``latentsift.channel.<name>`` (the same renderer)."""
    if isinstance(recorded, str) and recorded.startswith(_OLD_RENDERER_MODULE):
        return f"{render.__module__}.{recorded.removeprefix(_OLD_RENDERER_MODULE)}"
    return recorded


def renderer_of(recorded: str):
    """The registered renderer a store recorded (its path, or an older store's); a one-line refusal when
    none is registered under it (a plugin's renderer not installed here)."""
    recorded = same_renderer_id(recorded)
    for name in renderer_names():
        if renderer_id(name) == recorded:
            return registry_find("renderer", name).obj
    raise LatentSiftError(f"The store's renderer {recorded!r} is not registered here; install the plugin that "
                          "defines it.")


def patch_step(traj: Trajectory) -> int | None:
    """The step that wrote (or showed) the candidate's final patch: the last step whose ``fn`` or ``obs``
    contains the first hunk header (``@@ -a,b +c,d @@ ...``) of ``traj.patch``.

    Scaffold-free: AutoCodeRover's ``write_patch`` call holds the diff in ``fn``, SWE-agent's ``submit``
    shows it in ``obs``, an OpenAI-style edit tool returns it in its observation. None when the patch is
    empty or no step shows it.
    """
    head = _hunk_header(traj.patch or "")
    if head is None:
        return None
    hits = [t for t, s in enumerate(traj.steps) if head in s.fn or head in s.obs]
    return hits[-1] if hits else None


def _only(m: _Msg, keys: set[tuple[int, int]]) -> _Msg:
    """The message with step ranges restricted to ``keys`` (context ranges are kept as context)."""
    ranges = [r for r in m.ranges if r[2] < 0 or (r[2], r[3]) in keys]
    calls = [(c, t if (t, CHANNEL_ID["fn"]) in keys else EXCLUDED) for c, t in m.calls]
    return _Msg(m.role, m.content, ranges, calls, m.extra)
