"""Packed replay: several short renderings through the decoder stack in one forward.

The renderings are laid end to end in one row (``pack_plan`` fixes which go together, from their
lengths and order alone), each with its own positions 0..n-1. The linear layers, norms and MLPs then
run on all their tokens at once (one large GEMM instead of several small ones), while attention stays
per sequence: :func:`packed_attention` cuts the row at the sequence bounds (transformers' varlen
keyword ``cu_seq_lens_q``) and runs the model's own attention (``sdpa``) on each piece with
its causal flag, exactly as a forward of that sequence alone would. On a GPU in bfloat16 or float16 the
whole row's attention is instead one FlashAttention varlen call per layer (torch's ``varlen_attn``, the
kernel a lone sequence's ``sdpa`` takes there, causal per sequence, split-KV off), with the per-sequence
loop as its fallback (said once) where this torch has no such kernel or it refuses the shapes. No token
sees a neighbour's, and no attention work is spent on the block-diagonal zeros (transformers' own packing
by ``position_ids`` builds a dense mask over the whole row: measured 0.6x of one sequence per forward on a
CPU).

What can differ from one sequence per forward is only the rounding of the linear layers at another row
count (tested to 1e-5 relative per span in float32; measured on an AVX-512 CPU: the same bytes, float32
and bfloat16): a trajectory's states do not depend on what was packed beside it beyond that, and the
same inputs give the same bytes run to run.

Pitfalls: architectures with sliding-window or other non-causal layers (Gemma 3, Mistral with a
window) and models loaded with ``eager`` or a FlashAttention kernel are replayed one sequence per forward
(:func:`can_pack`); the attention of a packed model is switched once to ``packed_attention``, which
calls the original implementation unchanged for every forward without ``cu_seq_lens_q`` (generate,
chunked replay, the verifier).
"""
from __future__ import annotations

import inspect
import logging
import threading
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .._core.attention import exact_attention
from .._core.threads import NUMERIC_THREADS, fixed_threads
from .._core.validation import check_positive_int
from .states import _check_layer_ids, _SpanSums, layer_hooks, states_of

PACKED_ATTENTION = "latentsift_packed"
BOUNDS = "cu_seq_lens_q"             # transformers' varlen keyword: cumulative sequence lengths of the row
_FALLBACK = "_latentsift_fallback"  # attribute of each attention module: the implementation it had
_LOCK = threading.Lock()
_REGISTERED = False
_LOG = logging.getLogger(__name__)


def run_length(rendering, max_tokens: int | None = None) -> int:
    """Tokens a replay runs: up to the last pooled token, after ``max_tokens`` truncation."""
    n = rendering.n_tokens if max_tokens is None else min(rendering.n_tokens, max_tokens)
    pooled = np.flatnonzero(np.asarray(rendering.step[:n]) >= 0)
    return int(pooled[-1]) + 1 if len(pooled) else 0


#: bytes a packed forward's transients may take when ``pack_tokens`` is the device's default
PACK_MEMORY = 8 * 2**30


def token_bytes(d_model: int, d_kv: int, d_ff: int, itemsize: int) -> int:
    """Bytes per token of a packed forward's largest transients: one layer's query, attention output,
    residual and norm (4 d_model), key and value (2 d_kv), MLP (3 d_ff), in the model's dtype, and the
    pooling's float64 gather of a layer with its float32 sums (12 bytes per d_model)."""
    return (4 * d_model + 2 * d_kv + 3 * d_ff) * itemsize + 12 * d_model


def memory_pack_tokens(pack_tokens: int, per_token: int, budget: int = PACK_MEMORY) -> int:
    """``pack_tokens`` halved until that many tokens of ``per_token`` bytes fit ``budget`` (at least 2,048)."""
    while pack_tokens > 2048 and pack_tokens * per_token > budget:
        pack_tokens //= 2
    return pack_tokens


def model_token_bytes(policy) -> int:
    """:func:`token_bytes` of the policy's model, read from its config."""
    cfg = policy.model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    d = cfg.hidden_size
    heads = getattr(cfg, "num_attention_heads", None) or 1
    d_head = getattr(cfg, "head_dim", None) or d // heads
    d_kv = getattr(cfg, "num_key_value_heads", None) or heads
    d_ff = getattr(cfg, "intermediate_size", None) or 4 * d      # a config without it: the usual 4 d_model
    return token_bytes(d, d_kv * d_head, d_ff, policy.model.dtype.itemsize)


def pack_plan(items: Iterable, size: Callable[[Any], int], pack_tokens: int) -> Iterator[list]:
    """``items`` grouped in order, each group's ``size`` total at most ``pack_tokens``; an item larger
    than the budget is a group of its own. Lazy: a group is yielded as soon as it is complete."""
    group: list = []
    total = 0
    for item in items:
        n = size(item)
        if group and total + n > pack_tokens:
            yield group
            group, total = [], 0
        group.append(item)
        total += n
    if group:
        yield group


def _attention_modules(policy) -> list:
    return [getattr(layer, "self_attn", None) for layer in policy.layers[: policy.n_layers]]


def can_pack(policy) -> bool:
    """True when every decoder layer's attention is plain causal over the whole sequence (no sliding
    window, no softcap) and runs on ``sdpa`` (whose causal flag :func:`packed_attention` uses per sequence)."""
    cfg = policy.model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    impl = getattr(cfg, "_attn_implementation", None)
    kinds = getattr(cfg, "layer_types", None) or ["full_attention"]
    mods = _attention_modules(policy)
    return (impl in ("sdpa", PACKED_ATTENTION) and all(k == "full_attention" for k in kinds)
            and getattr(cfg, "attn_logit_softcapping", None) is None
            and all(m is not None and getattr(m, "sliding_window", None) is None for m in mods))


def _implementation(name: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[name]


class Varlen:
    """torch's FlashAttention varlen kernel for a packed row on a GPU (``varlen_attn``, torch >= 2.10;
    either of its signatures: ``is_causal`` in 2.10, ``window_size`` after), or the reason it is not used.
    ``enabled`` off runs the per-sequence loop everywhere (what the kernel buys: bench/packed_gpu.py)."""

    def __init__(self):
        self.enabled = True

    def __getattr__(self, name: str):
        """``fn``, ``params`` and ``why``, looked up on first use: importing this module (every command line's
        start) does not import torch."""
        if name not in ("fn", "params", "why"):
            raise AttributeError(name)
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError as e:
            self.fn, self.params, self.why = None, frozenset(), f"torch.nn.attention.varlen: {e}"
        else:
            self.fn, self.params, self.why = varlen_attn, frozenset(inspect.signature(varlen_attn).parameters), ""
        return getattr(self, name)

    def takes(self, query) -> bool:
        """True for a query this kernel serves: on a GPU, in a 16-bit float (FlashAttention's types)."""
        import torch

        return (self.enabled and self.fn is not None and query.device.type == "cuda"
                and query.dtype in (torch.bfloat16, torch.float16))

    def __call__(self, query, key, value, bounds, longest: int, scale: float):
        """Causal attention of each sequence of ``bounds`` on its own; (1, heads, tokens, head_dim) in,
        (1, tokens, heads, head_dim) out, as transformers' attention functions return it."""
        q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))   # (tokens, heads, head_dim)
        kw: dict = {"scale": scale} if "scale" in self.params else {}
        if "enable_gqa" in self.params:
            kw["enable_gqa"] = True
        elif k.shape[1] != q.shape[1]:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        if "is_causal" in self.params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
        if "num_splits" in self.params:
            kw["num_splits"] = 1          # no split-KV: a sequence's bits do not depend on its neighbours
        return self.fn(q, k, v, bounds, bounds, longest, longest, **kw)[None]


VARLEN = Varlen()


def packed_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention of a packed row: each sequence of ``cu_seq_lens_q`` on its own, by :data:`VARLEN` where
    it takes the query, else by the module's original implementation (``sdpa``: its causal flag, no mask,
    as a forward of that sequence alone calls it); without that keyword, the original as is."""
    import torch

    fallback = _implementation(getattr(module, _FALLBACK))
    bounds = kwargs.pop(BOUNDS, None)
    if bounds is None:
        return fallback(module, query, key, value, attention_mask, **kwargs)
    longest = kwargs.pop("max_length_q", None)
    for k in ("cu_seq_lens_k", "max_length_k"):
        kwargs.pop(k, None)
    if longest is not None and VARLEN.takes(query):
        try:
            return VARLEN(query, key, value, bounds.to(query.device), int(longest),
                          kwargs.get("scaling") or module.scaling), None
        except (RuntimeError, TypeError, ValueError) as e:   # shapes or a signature the kernel refuses
            VARLEN.fn, VARLEN.why = None, f"varlen_attn failed: {str(e)[:200]}"
            _LOG.warning("packed replay: attention per sequence from here on (%s)", VARLEN.why)
    cuts = bounds.tolist()
    outs = [fallback(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs)[0]
            for a, b in zip(cuts[:-1], cuts[1:])]
    return torch.cat(outs, dim=1), None


def enable_packing(policy) -> None:
    """Switch the model's attention to :func:`packed_attention` (once; it calls the original
    implementation for every unpacked forward, with the same masks)."""
    global _REGISTERED
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    with _LOCK:
        cfg = policy.model.config
        if getattr(cfg, "_attn_implementation", None) == PACKED_ATTENTION:
            return
        if not _REGISTERED:
            AttentionInterface.register(PACKED_ATTENTION, packed_attention)
            _REGISTERED = True
        orig = cfg._attn_implementation
        for m in _attention_modules(policy):
            setattr(m, _FALLBACK, orig)
        # the masks of unpacked forwards are those the original implementation gets
        ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS[orig]
                                              if orig in ALL_MASK_ATTENTION_FUNCTIONS else sdpa_mask)
        policy.model.set_attn_implementation(PACKED_ATTENTION)


def replay_packed(policy, renderings: Sequence, *, max_tokens: int | None = None,
                  layer_ids: Sequence[int] | None = None) -> list:
    """:func:`~latentsift.states.states.replay_many` of renderings that fit the context, in one forward.

    Each rendering runs its first :func:`run_length` tokens at positions 0..n-1; its spans are pooled
    as in a replay of it alone. Each rendering must fit the model's context and a chunk; the row may be
    longer (callers pack with :func:`pack_plan` and ``extract.pack_size``)."""
    import torch

    if max_tokens is not None:
        max_tokens = check_positive_int(max_tokens, "max_tokens", "replay")
    keep = _check_layer_ids(layer_ids, policy.n_layers, "replay")
    enable_packing(policy)
    dev = policy.device
    ns = [r.n_tokens if max_tokens is None else min(r.n_tokens, max_tokens) for r in renderings]
    runs = [run_length(r, max_tokens) for r in renderings]
    index = [r.span_index() for r in renderings]
    offsets = np.cumsum([0] + [len(keys) for _, keys in index])
    # one pooling plan for the row: off a CPU a layer's pooling is one segment_reduce over all its spans
    acc = _SpanSums(policy.n_layers, policy.d_model, int(offsets[-1]), dev)
    ids, pos, src, tgt = [], [], [], []
    start = 0
    for r, n_run, (span_of, _), off in zip(renderings, runs, index, offsets):
        ids.append(np.asarray(r.input_ids[:n_run], dtype=np.int64))
        pos.append(np.arange(n_run))
        p = np.flatnonzero(span_of[:n_run] >= 0)
        src.append(p + start)
        tgt.append(span_of[p] + off)
        start += n_run
    acc.set_targets(np.concatenate(src), np.concatenate(tgt))
    if start:
        cuts = np.cumsum([0] + [n for n in runs if n])
        with torch.inference_mode(), fixed_threads(NUMERIC_THREADS), exact_attention(dev), layer_hooks(policy, acc):
            policy.base(input_ids=torch.as_tensor(np.concatenate(ids), device=dev)[None],
                        position_ids=torch.as_tensor(np.concatenate(pos), device=dev)[None],
                        # a prepared (4-D) mask is passed through untouched: no dense mask is built
                        attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=dev),
                        use_cache=False, max_length_q=int(max(runs)),
                        **{BOUNDS: torch.as_tensor(cuts, dtype=torch.int32, device=dev)})
    means = acc.means(int(offsets[-1]))
    return [states_of(r, means[a:b], acc.counts[a:b], keys, n, keep, layer_ids)
            for r, (_, keys), n, a, b in zip(renderings, index, ns, offsets[:-1], offsets[1:])]
