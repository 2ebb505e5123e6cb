"""Policy states (paper section "Three-channel representations and bank construction"): exact-token replay, online capture, and the states contract.

CONTRACT (used by banks and the scorer): ``TrajectoryStates``.

Vocabulary (used the same way in code, docstrings and shapes): ``n_spans`` non-empty (step, channel)
spans of one trajectory, ``layer`` l = 1..L (transformers' ``output_hidden_states`` index; the
embedding output, index 0, is never kept; layer L is *after* the final norm), ``d_model``.

Two ways to obtain states, which agree to bf16 noise (``tests/test_states.py``):

- :func:`replay` runs a :class:`~latentsift.states.channel.Rendering` through the decoder stack once
  (prefill only, chunked with a KV cache; a sliding window beyond the model's context);
- :class:`StateRecorder` captures them while an agent loop generates with transformers
  ``generate`` (observations arrive as prefill, the policy's own tokens as decode steps).

Both pool inside forward hooks (:func:`layer_hooks`): per-span float32 sums are accumulated chunk by
chunk (:func:`add_span_sums`), so no ``(L, seq, d_model)`` tensor is ever held.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Self, Sequence

import numpy as np

from .._core.attention import exact_attention
from .._core.threads import NUMERIC_THREADS, fixed_threads
from .._core.validation import LatentSiftError, check_positive_int, param_error
from .channel import Rendering
from ..trajectories.trajectory import CHANNEL_ID, CHANNELS

DEFAULT_CHUNK_TOKENS = 2048   # prefill chunk; measured: one forward up to 2k tokens beats 2 chunks of 1k by 5-20% on CPU


@dataclass
class TrajectoryStates:
    """Mean-pooled states of every non-empty (step, channel) span of one trajectory.

    layers:  (n_spans, n_layers, d_model) float, layer l = 1..L outputs in the convention of
             transformers' ``output_hidden_states`` (index l; the last one is after the final norm);
             the embedding output (index 0) is not kept.
    step:    (n_spans,) int32 step index t of each span
    channel: (n_spans,) int8 channel index (cot=0, obs=1, fn=2)
    Spans are in trajectory order (order of their first token).
    n_tokens: tokens run through the model for this trajectory (after ``max_tokens`` truncation).
    layer_ids: the layer index l of each entry of axis 1 of ``layers``; ``None`` means all of
             1..n_layers (the default). A store written with ``layers="final"`` holds ``(L,)``.
    """

    traj_id: str
    layers: np.ndarray
    step: np.ndarray
    channel: np.ndarray
    n_tokens: int = 0
    layer_ids: tuple[int, ...] | None = None

    @property
    def n_layers(self) -> int:
        return int(self.layers.shape[1])

    @property
    def n_spans(self) -> int:
        return int(self.layers.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.layers.shape[2])

    def distance_states(self, layer: int = -1) -> np.ndarray:
        """(n_spans, d_model) float32: the distance states ``z[t][c]`` (final layer by default)."""
        return np.asarray(self.layers[:, layer, :], dtype=np.float32)

    def scorer_mask(self) -> np.ndarray:
        """Model-authored spans (cot and fn; observations excluded) used by the learned scorer."""
        return self.channel != CHANNEL_ID["obs"]

    def scorer_states(self) -> np.ndarray:
        """(n_model_spans, n_layers, d_model): ``u[j][l]`` for cot and fn spans in trajectory order."""
        return self.layers[self.scorer_mask()]


# ----------------------------------------------------------------------------------------------
# Hooks


def _decoder_layers(policy) -> list:
    return list(policy.layers[: policy.n_layers])


class _Router:
    """The hooks of one model: one per decoder layer, each calling the current thread's ``fn``."""

    def __init__(self, policy):
        self.local = threading.local()
        self.users = 0
        layers = _decoder_layers(policy)
        norm, last = policy.base.norm, len(layers) - 1

        def make(i: int):
            def hook(module, args, output):
                fn = getattr(self.local, "fn", None)
                if fn is not None:
                    h = output[0] if isinstance(output, tuple) else output
                    fn(i, norm(h) if i == last else h)
            hook._latentsift = True
            return hook

        self.handles = [layer.register_forward_hook(make(i)) for i, layer in enumerate(layers)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


_ROUTERS: dict[int, _Router] = {}  # id(model) -> its hooks while some thread has a layer_hooks block open
_ROUTERS_LOCK = threading.Lock()


@contextmanager
def layer_hooks(policy, fn: Callable[[int, Any], None]) -> Iterator[None]:
    """Call ``fn(i, hidden)`` for layer l = i + 1 (i = 0..L-1) on every forward of the decoder run by
    this thread while the block is open.

    ``hidden`` is the layer's output ``(batch, seq, d_model)`` in the model dtype; for the last
    layer the final norm (``policy.base.norm``) is applied first, so the values equal
    ``output_hidden_states[1..L]``. Threads may replay through one model at the same time: the
    hooks are installed once per model and call the ``fn`` of the thread running the forward (a
    forward in a thread without an open block calls nothing). They are removed when the last block
    closes, also on errors.
    """
    key = id(policy.model)
    with _ROUTERS_LOCK:
        router = _ROUTERS.get(key)
        if router is None:
            router = _ROUTERS[key] = _Router(policy)
        router.users += 1
    prev = getattr(router.local, "fn", None)
    router.local.fn = fn
    try:
        yield
    finally:
        router.local.fn = prev
        with _ROUTERS_LOCK:
            router.users -= 1
            if router.users == 0:
                router.remove()
                del _ROUTERS[key]


def recording_hooks(policy, on_layer: Callable[[int, Any], None], on_forward: Callable[[tuple, dict], None]):
    """The hooks of a recorder, open until the returned ``ExitStack`` is closed: :func:`layer_hooks` with
    ``on_layer``, and ``on_forward(args, kwargs)`` before each forward of the decoder stack run by this
    thread (another thread's forwards, e.g. a replay, are not the recorded conversation's)."""
    from contextlib import ExitStack

    stack = ExitStack()
    stack.enter_context(layer_hooks(policy, on_layer))
    thread = threading.get_ident()

    def pre_hook(module, args, kwargs):
        if threading.get_ident() == thread:
            on_forward(args, kwargs)
    pre_hook._latentsift = True
    stack.callback(policy.base.register_forward_pre_hook(pre_hook, with_kwargs=True).remove)
    return stack


def has_hooks(policy) -> bool:
    """True when a hook of ours is still attached to the model (tests check that none are left).

    transformers itself installs permanent output-capturing hooks on the decoder layers the
    first time ``output_hidden_states=True`` is used; those are not ours and are not counted.
    """
    return any(getattr(h, "_latentsift", False) for m in policy.model.modules()
               for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()))


def span_plan(tgt):
    """``(order, rows, lengths)`` for :func:`add_span_sums` on a GPU: the stable order that groups the
    tokens of ``tgt`` by span, token order kept within a span (None where ``tgt`` is grouped already,
    sorted), the distinct span numbers (sorted) and each one's token count."""
    import torch

    rows, lengths = torch.unique(tgt, return_counts=True)
    grouped = len(tgt) < 2 or bool((tgt[1:] >= tgt[:-1]).all())
    return (None if grouped else torch.argsort(tgt, stable=True)), rows, lengths


def add_span_sums(sums, dim: int, tgt, x, plan=None, *, ordered: bool | None = None) -> None:
    """``sums[.., tgt[p], ..] += x[.., p, ..]`` along ``dim`` (in place), in an order fixed by the inputs.

    On a CPU (``ordered`` None there): ``index_add_``, one token after the other. Elsewhere a GPU's
    ``index_add_`` adds a span's tokens with atomics, in whatever order its threads arrive, so the same
    inputs would give other float32 bits from run to run; there each span's tokens are summed in float64,
    one after the other in token order (one ``torch.segment_reduce`` over all spans; ``plan`` =
    :func:`span_plan` of ``tgt``, made once for many calls), and the sum is added once per span, which
    no thread order changes."""
    import torch

    if ordered is None:
        ordered = sums.device.type == "cpu"
    if ordered:
        sums.index_add_(dim, tgt, x.to(sums.dtype))
        return
    order, rows, lengths = plan if plan is not None else span_plan(tgt)
    x = (x if order is None else x.index_select(dim, order)).double()
    # sum_p h_l[p] over the span's tokens (numerator of the span mean), one row per distinct span
    part = torch.segment_reduce(x, "sum", lengths=lengths.expand(*x.shape[:dim], -1), axis=dim)
    sums.index_add_(dim, rows, part.to(sums.dtype))


class _SpanSums:
    """Float32 per-span sums ``(L, capacity, d_model)`` and token counts, filled by hooks."""

    def __init__(self, n_layers: int, d_model: int, capacity: int, device):
        import torch

        self.n_layers, self.d_model, self.device = n_layers, d_model, device
        self.sums = torch.zeros(n_layers, max(capacity, 1), d_model, dtype=torch.float32, device=device)
        self.counts = np.zeros(max(capacity, 1), dtype=np.int64)
        self.src = None  # flat token positions of the current forward to pool
        self.tgt = None  # their span numbers
        self.plan = None  # span_plan(tgt) off a CPU
        self.ordered = torch.device(device).type == "cpu"   # add_span_sums' order (forced off in tests)

    def reserve(self, n: int) -> None:
        import torch

        cap = self.sums.shape[1]
        if n <= cap:
            return
        new = max(n, 2 * cap)
        grown = torch.zeros(self.n_layers, new, self.d_model, dtype=torch.float32, device=self.device)
        grown[:, :cap] = self.sums
        self.sums = grown
        self.counts = np.concatenate([self.counts, np.zeros(new - cap, dtype=np.int64)])

    def set_targets(self, src: np.ndarray, tgt: np.ndarray) -> None:
        """The tokens of the next forwards to pool: positions ``src`` (in the flattened forward) into span
        numbers ``tgt``. Off a CPU they are grouped by span once (:func:`span_plan`, token order kept), so
        a layer's pooling is one gather, one float64 conversion and one ``segment_reduce``
        (:func:`add_span_sums`)."""
        import torch

        np.add.at(self.counts, tgt, 1)
        self.src = self.tgt = self.plan = None
        if not len(src):
            return
        self.src = torch.as_tensor(src, dtype=torch.long, device=self.device)
        self.tgt = torch.as_tensor(tgt, dtype=torch.long, device=self.device)
        if not self.ordered:
            order, rows, lengths = span_plan(self.tgt)
            if order is not None:   # gather in span order once here, not in every layer's add_span_sums
                self.src, self.tgt = self.src[order], self.tgt[order]
            self.plan = (None, rows, lengths)

    def __call__(self, i: int, hidden) -> None:
        if self.src is None:
            return
        flat = hidden.reshape(-1, hidden.shape[-1])
        src = self.src if flat.device == self.src.device else self.src.to(flat.device)  # a layer of a split model
        # sum_p h_l[p] over the span's tokens (numerator of the span mean)
        add_span_sums(self.sums[i], 0, self.tgt, flat.index_select(0, src).to(self.device), self.plan,
                      ordered=self.ordered)

    def means(self, n_spans: int) -> np.ndarray:
        """(n_spans, L, d_model) float32: u[j][l] = sums / counts (the span mean)."""
        cnt = np.maximum(self.counts[:n_spans], 1).astype(np.float32)
        out = self.sums[:, :n_spans].transpose(0, 1).cpu().numpy()
        return np.ascontiguousarray(out / cnt[:, None, None])


# ----------------------------------------------------------------------------------------------
# Replay


def window_plan(n_tokens: int, context: int) -> list[tuple[int, int, int]]:
    """Sliding-window rule for sequences longer than the model's context.

    Returns ``(start, end, pool_from)`` per window: windows of ``context`` tokens with a stride of
    ``context // 2``; the first window pools all its tokens, every later one only the tokens after
    the previous window's end (its second half: ``pool_from = start + context - context // 2``),
    so each token is pooled exactly once and every token past the first window sees at least
    ``context // 2`` tokens of left context (instead of all of them). ``n_tokens <= context``
    gives one window ``(0, n_tokens, 0)``.
    """
    if n_tokens <= context:
        return [(0, n_tokens, 0)]
    stride = context // 2
    plan = [(0, context, 0)]
    start = stride
    while plan[-1][1] < n_tokens:
        plan.append((start, min(start + context, n_tokens), plan[-1][1]))
        start += stride
    return plan


def replay(policy, rendering, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, max_tokens: int | None = None,
           context: int | None = None, layer_ids: Sequence[int] | None = None) -> TrajectoryStates:
    """Exact-token replay of one rendered trajectory (prefill only, no generation).

    Runs ``rendering.input_ids`` through the decoder stack in chunks of ``chunk_tokens`` with a
    KV cache and returns the mean-pooled states of every non-empty (step, channel) span at every
    layer 1..L (or ``layer_ids``). ``max_tokens`` keeps only the first tokens (spans past it have
    no state; a span cut by it is pooled over its kept tokens). Beyond ``context`` tokens (default:
    the model's ``max_position_embeddings``) the sliding-window rule of :func:`window_plan` applies.

    The forward passes run at ``NUMERIC_THREADS`` (one) torch thread whatever the caller's count:
    the CPU kernels round differently at 1 and 2 threads (measured with torch 2.13 in bf16: the
    rotary embedding's cos/sin and a 570 x 576 x 576 projection), and a trajectory's states must not
    depend on the machine's core count. The cores are used by replaying several trajectories at once,
    one per thread (:func:`latentsift.states.extract.extract_many`).

    Pitfall: chunked prefill and a single forward agree only to the dtype's rounding (bf16: about
    1e-2 relative), since the attention kernels sum in a different order.
    """
    return replay_many(policy, [rendering], chunk_tokens=chunk_tokens, max_tokens=max_tokens,
                       context=context, layer_ids=layer_ids)[0]


def _check_layer_ids(layer_ids, n_layers: int, owner: str) -> list[int]:
    if layer_ids is None:
        return list(range(1, n_layers + 1))
    ids = [int(x) for x in layer_ids]
    if not ids or any(x < 1 or x > n_layers for x in ids) or sorted(set(ids)) != ids:
        raise param_error("layer_ids", owner, f"increasing layer indices within 1..{n_layers}", layer_ids)
    return ids


def replay_many(policy, renderings: Sequence, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                max_tokens: int | None = None, context: int | None = None,
                layer_ids: Sequence[int] | None = None) -> list[TrajectoryStates]:
    """:func:`replay` of several renderings, one after the other (same arguments)."""
    import torch
    from transformers import DynamicCache

    chunk_tokens = check_positive_int(chunk_tokens, "chunk_tokens", "replay")
    if max_tokens is not None:
        max_tokens = check_positive_int(max_tokens, "max_tokens", "replay")
    ctx = check_positive_int(context if context is not None else policy.context_length, "context", "replay")
    if ctx < 2:
        raise param_error("context", "replay", "at least 2 tokens", ctx)
    keep = _check_layer_ids(layer_ids, policy.n_layers, "replay")
    base, dev = policy.base, policy.device
    out = []
    for r in renderings:
        n = r.n_tokens if max_tokens is None else min(r.n_tokens, max_tokens)
        span_of, keys = r.span_index()
        span_of = span_of[:n]
        acc = _SpanSums(policy.n_layers, policy.d_model, len(keys), dev)
        ids = torch.as_tensor(np.asarray(r.input_ids[:n], dtype=np.int64), device=dev)[None]
        pooled = np.flatnonzero(span_of >= 0)
        last = int(pooled[-1]) + 1 if len(pooled) else 0  # tokens after the last span need no forward
        with torch.inference_mode(), fixed_threads(NUMERIC_THREADS), exact_attention(dev), layer_hooks(policy, acc):
            for start, end, pool_from in window_plan(n, ctx):
                end = min(end, last)
                if end <= pool_from:
                    continue
                # one chunk: a plain forward (no KV cache: measured ~15% faster on CPU)
                cache = DynamicCache(config=policy.model.config) if end - start > chunk_tokens else None
                for a in range(start, end, chunk_tokens):
                    b = min(a + chunk_tokens, end)
                    pos = np.arange(max(a, pool_from), b)
                    pos = pos[span_of[pos] >= 0]
                    acc.set_targets(pos - a, span_of[pos])
                    base(input_ids=ids[:, a:b], past_key_values=cache, use_cache=cache is not None)
                del cache
        out.append(states_of(r, acc.means(len(keys)), acc.counts[:len(keys)], keys, n, keep, layer_ids))
    return out


def states_of(r, means: np.ndarray, counts: np.ndarray, keys: list, n: int, keep: list[int],
              layer_ids) -> TrajectoryStates:
    """The states of rendering ``r`` (``n`` tokens run): ``means`` (len(keys), L, d_model) and
    ``counts`` (len(keys),) of its spans ``keys`` (:meth:`_SpanSums.means`); spans without tokens dropped."""
    present = np.flatnonzero(counts > 0)
    return TrajectoryStates(
        traj_id=r.traj_id, layers=means[present][:, [l - 1 for l in keep]],
        step=np.array([keys[j][0] for j in present], dtype=np.int32),
        channel=np.array([keys[j][1] for j in present], dtype=np.int8),
        n_tokens=int(n), layer_ids=None if layer_ids is None else tuple(keep))


def merge_states(parts: Sequence[TrajectoryStates], traj_id: str | None = None) -> TrajectoryStates:
    """One trajectory's states from several renderings that label disjoint spans, in order
    (``render_per_step``: rendering k holds obs of step k-1 and cot/fn of step k, so the
    concatenation is in trajectory order). ``n_tokens`` is the sum over the renderings."""
    if not parts:
        raise param_error("parts", "merge_states", "at least one TrajectoryStates", [])
    keys = [(int(a), int(b)) for p in parts for a, b in zip(p.step, p.channel)]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise LatentSiftError(f"merge_states: the span (step, channel) = {dup} occurs in two renderings.")
    return TrajectoryStates(traj_id=traj_id or parts[0].traj_id,
                            layers=np.concatenate([p.layers for p in parts], axis=0),
                            step=np.concatenate([p.step for p in parts]).astype(np.int32),
                            channel=np.concatenate([p.channel for p in parts]).astype(np.int8),
                            n_tokens=int(sum(p.n_tokens for p in parts)), layer_ids=parts[0].layer_ids)


# ----------------------------------------------------------------------------------------------
# Online capture


class Recording:
    """A recorder's hooks on the decoder stack (``recording_hooks``), on for its ``with`` block: its
    ``_on_layer`` and ``_on_forward`` see every forward of ``self.policy``'s model."""

    def __enter__(self) -> Self:
        self._stack = recording_hooks(self.policy, self._on_layer, self._on_forward)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        self._stack = None


class StateRecorder(Recording):
    """Capture pooled states online, while an agent loop generates with transformers ``generate``.

    Use it as a context manager around the whole conversation; it hooks the decoder stack, sees
    every forward (the prefill of new prompt/observation tokens and each decode step) and pools
    each token into its (step, channel) span as soon as the token is both *seen* and *labelled*.
    Labels are given in token order with :meth:`label` (step -1 / channel -1 = excluded):
    label a prompt or observation before calling ``generate`` and the generated tokens after it
    (their cot/fn split is known only once the text is parsed). Tokens seen but not yet labelled
    wait in a per-turn buffer of ``(L, n_tokens_of_the_turn, d_model)``; nothing else is kept.

    Positions come from the KV cache: pass the cache of the previous turn back to ``generate``
    (``past_key_values=``) so only new tokens are prefilled; re-prefilling from position 0 also
    works (tokens already seen are checked to be the same ids and skipped).

    Pitfalls: batch size 1 only (no beams, no batched sampling); the last token ``generate``
    returns is never run through the model by ``generate`` itself: it is seen with the next turn's
    prefill, so a trajectory that ends on generated pooled tokens needs one more forward (e.g.
    ``policy.base(input_ids=last, past_key_values=cache)``); no sliding window (the conversation
    must fit the context). :meth:`rendering` returns the exact tokens and labels, so
    ``replay(policy, rec.rendering())`` must give the same states (see tests).
    """

    def __init__(self, policy, traj_id: str = "online"):
        self.policy = policy
        self.traj_id = traj_id
        self._ids: list[int] = []                # token ids seen by the model, by position
        self._step: list[int] = []               # labels, by position
        self._chan: list[int] = []
        self._span_of: list[int] = []            # span number per labelled position (-1 excluded)
        self._keys: dict[tuple[int, int], int] = {}
        self._acc = _SpanSums(policy.n_layers, policy.d_model, 8, policy.device)
        self._pending: dict[int, Any] = {}       # first position -> (L, m, d) float32 of unlabelled tokens
        self._cur: tuple[int, int, int] | None = None  # (first new position, offset in input, n new)
        self._cur_pending = None
        self._stack = None

    # -- hooks: ``with`` (Recording) ------------------------------------------------------
    def _on_forward(self, args, kwargs):
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise LatentSiftError("StateRecorder needs input_ids (inputs_embeds cannot be attributed to tokens).")
        if ids.shape[0] != 1:
            raise LatentSiftError(f"StateRecorder records one sequence at a time; got a batch of {ids.shape[0]} "
                                  "(no beams or batched sampling while recording).")
        cache = kwargs.get("past_key_values")
        start = int(cache.get_seq_length()) if cache is not None else 0
        new = ids[0].tolist()
        seen = len(self._ids)
        if start > seen:
            raise LatentSiftError(f"StateRecorder missed tokens: a forward starts at position {start} but only "
                                  f"{seen} tokens were seen. Open the recorder before the first forward.")
        overlap = min(seen - start, len(new))
        if new[:overlap] != self._ids[start:start + overlap]:
            raise LatentSiftError("StateRecorder: the model was re-run on different tokens at positions it had "
                                  "already seen; start a new recorder for a new conversation.")
        self._ids.extend(new[overlap:])
        p0, m = start + overlap, len(new) - overlap
        self._cur = (p0, overlap, m)
        n_lab = min(len(self._span_of), p0 + m)
        # labelled new tokens are pooled at once; the rest wait for their labels
        pos = np.arange(p0, n_lab)
        span = np.asarray(self._span_of[p0:n_lab], dtype=np.int64)
        ok = span >= 0
        self._acc.set_targets(pos[ok] - start, span[ok])
        n_wait = p0 + m - max(n_lab, p0)
        self._cur_pending = None
        if n_wait > 0:
            first = max(n_lab, p0)
            self._cur_pending = (first, first - start,
                                 torch.empty(self.policy.n_layers, n_wait, self.policy.d_model,
                                             dtype=torch.float32, device=self.policy.device))
            self._pending[first] = self._cur_pending[2]

    def _on_layer(self, i: int, hidden) -> None:
        self._acc(i, hidden)
        if self._cur_pending is not None:
            _, off, buf = self._cur_pending
            buf[i] = hidden[0, off:off + buf.shape[1]].float()

    # -- labels -----------------------------------------------------------------------------
    def label(self, n: int, step: int, channel: int | str) -> None:
        """Label the next ``n`` token positions as (step, channel); ``step=-1`` or ``channel=-1``
        (or ``"excluded"``) marks them excluded from pooling (template tokens, task prompt)."""
        if isinstance(channel, str):
            channel = -1 if channel == "excluded" else CHANNEL_ID.get(channel, None)
            if channel is None:
                raise param_error("channel", "StateRecorder.label", f"one of {list(CHANNELS)} or 'excluded'", channel)
        n = int(n)
        if n < 0:
            raise param_error("n", "StateRecorder.label", "a non-negative int", n)
        self.label_tokens(np.full(n, step, dtype=np.int64), np.full(n, channel, dtype=np.int64))

    def label_tokens(self, step: Sequence[int], channel: Sequence[int]) -> None:
        """Label the next positions one by one (arrays of equal length, -1 = excluded)."""
        step = np.asarray(step, dtype=np.int64)
        channel = np.asarray(channel, dtype=np.int64)
        if step.shape != channel.shape or step.ndim != 1:
            raise param_error("step", "StateRecorder.label_tokens", "a 1-D array as long as 'channel'", step.shape)
        if ((channel < -1) | (channel >= len(CHANNELS))).any():
            raise param_error("channel", "StateRecorder.label_tokens", "channel ids in -1..2", channel.tolist())
        a = len(self._span_of)
        for s, c in zip(step.tolist(), channel.tolist()):
            self._step.append(s if c >= 0 else -1)
            self._chan.append(c if s >= 0 else -1)
            if s < 0 or c < 0:
                self._span_of.append(-1)
                continue
            j = self._keys.setdefault((s, c), len(self._keys))
            self._span_of.append(j)
        self._acc.reserve(len(self._keys))
        self._fold(a, len(self._span_of))

    def _fold(self, a: int, b: int) -> None:
        """Pool the waiting states of positions [a, b) that just got labels."""
        import torch

        for first in sorted(self._pending):
            buf = self._pending[first]
            m = buf.shape[1]
            lo, hi = max(a, first), min(b, first + m)
            if lo >= hi:
                continue
            span = np.asarray(self._span_of[lo:hi], dtype=np.int64)
            ok = np.flatnonzero(span >= 0)
            if len(ok):
                src = torch.as_tensor(ok + (lo - first), device=buf.device)
                tgt = torch.as_tensor(span[ok], device=buf.device)
                # sum_p h_l[p] over the span's tokens, all layers at once
                add_span_sums(self._acc.sums, 1, tgt, buf.index_select(1, src))
                np.add.at(self._acc.counts, span[ok], 1)
            if hi == first + m:  # every token of the block is labelled and pooled: drop it
                del self._pending[first]
            # otherwise the block stays; its labelled head is never pooled twice (labels only grow)

    # -- results ----------------------------------------------------------------------------
    @property
    def n_seen(self) -> int:
        return len(self._ids)

    @property
    def n_labelled(self) -> int:
        return len(self._span_of)

    def _check_complete(self) -> None:
        if self.n_labelled < self.n_seen:
            raise LatentSiftError(f"StateRecorder: {self.n_seen - self.n_labelled} tokens the model saw are not "
                                  "labelled; call label() for every token in order.")
        unseen = [j for j in self._span_of[self.n_seen:] if j >= 0]
        if unseen:
            raise LatentSiftError(f"StateRecorder: {len(unseen)} labelled span tokens were never run through the "
                                  "model (the last generated tokens are seen only with the next forward); "
                                  "run one more forward on them before asking for states.")

    def rendering(self):
        """The exact tokens the model saw and their labels, as a ``Rendering`` (for replay)."""
        self._check_complete()
        n = self.n_seen
        step = np.asarray(self._step[:n], dtype=np.int32)
        return Rendering(traj_id=self.traj_id, input_ids=np.asarray(self._ids, dtype=np.int64),
                         step=step, channel=np.asarray(self._chan[:n], dtype=np.int8),
                         n_steps=int(step.max()) + 1 if n and step.max() >= 0 else 0)

    def states(self) -> TrajectoryStates:
        """The pooled states of every span recorded so far (same layout as :func:`replay`)."""
        self._check_complete()
        keys = list(self._keys)
        present = np.flatnonzero(self._acc.counts[:len(keys)] > 0)
        return TrajectoryStates(
            traj_id=self.traj_id, layers=self._acc.means(len(keys))[present],
            step=np.array([keys[j][0] for j in present], dtype=np.int32),
            channel=np.array([keys[j][1] for j in present], dtype=np.int8),
            n_tokens=self.n_seen)
