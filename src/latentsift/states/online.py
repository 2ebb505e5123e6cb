"""Batched sampling with online state capture: several rollouts of one task generate together, and the
hidden states the policy computes while it writes them are pooled into (step, channel) spans as it goes.

This is the capture path of ``latentsift rollout`` (``rollout.agent``): no second forward pass over
the finished trajectory. It generalises :class:`~latentsift.states.states.StateRecorder` (one
sequence, transformers ``generate``) to a batch of samples with their own seeds.
:class:`~latentsift.states.capture.BatchRecorder` is the capture for a batch that transformers
``generate`` itself writes.

How a turn runs (:meth:`OnlineBatch.turn`):

1. Each sample is given its *target*: the conversation so far as the policy's chat template renders it
   (``channel.render`` of the partial trajectory, then the generation prompt), with the span table.
   The target is compared with the tokens the sample has already run through the model; the common
   prefix is kept (its KV cache too). Tokens the sample generated that re-tokenize differently (a
   sampled, non-canonical split of the same text, or a newline that merges with the next message) are
   dropped from the cache and their buffered states discarded; the canonical tokens are prefilled
   instead. So the states are always those of the exact tokens a replay of the saved trajectory runs
   (``replay(policy, render(trajectory))`` equals them up to rounding; tested).
2. One batched prefill runs every sample's new tokens (left-padded; pads are masked, positions
   counted per sample); the labelled ones are pooled at once inside the layer hooks.
3. Decoding: one batched forward per token over the samples still writing; only the last position's
   logits are computed (the language-model head on one hidden vector per sample, never a
   sequence x vocabulary tensor). A sample that stops (a stop token or ``max_new_tokens``) leaves the
   batch at once (its rows of the cache are cut out and kept aside for its next turn). The states
   of generated tokens are buffered per sample until the turn's text is parsed and labelled by the
   next target.

Sampling: temperature and top-p (the nucleus found with ``torch.topk``, not a full sort of the
vocabulary) on the float32 logits of the last position, drawn with a
``torch.Generator`` per sample seeded from its recorded seed: the same seeds, model, batch and
thread count give the same tokens, so the same bytes.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._core.attention import exact_attention
from .._core.validation import LatentSiftError, check_positive_int, param_error
from .channel import Rendering
from .states import TrajectoryStates, _SpanSums, add_span_sums, layer_hooks

OWNER = "OnlineBatch"


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn: ``temperature`` 0 = greedy; ``top_p`` nucleus mass kept (1 = all)."""

    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 384

    def check(self) -> "Sampling":
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= 10):
            raise param_error("temperature", "the sampling", "a number in [0, 10]", self.temperature)
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise param_error("top_p", "the sampling", "a number in (0, 1]", self.top_p)
        check_positive_int(self.max_new_tokens, "max_new_tokens", "Sampling")
        return self


#: Candidates the nucleus is first looked for among (``torch.topk``); grown 4x until the nucleus ends
#: inside. A full sort of a 150k vocabulary costs ~100 ms per sample on one CPU core, a top-64 ~2 ms.
NUCLEUS_K = 64


def sample_token(logits, sampling: Sampling, generator) -> int:
    """One token id from the float32 logits ``(vocab,)`` of the last position: greedy at temperature 0,
    else drawn with ``generator`` from the softmax at ``temperature`` restricted to the nucleus (the
    most probable tokens whose mass reaches ``top_p``; the first token always)."""
    import torch

    if sampling.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p >= 1:
        return int(torch.multinomial(probs, 1, generator=generator))
    n, k = probs.shape[0], min(NUCLEUS_K, probs.shape[0])
    while True:
        top, idx = torch.topk(probs, k)            # descending
        keep = torch.cumsum(top, 0) - top < sampling.top_p
        if not bool(keep.all()) or k == n:         # the nucleus ends inside the top k
            break
        k = min(4 * k, n)
    return int(idx[torch.multinomial(top[keep], 1, generator=generator)])


class _Sample:
    """One rollout's model-side state: the tokens it has run through the model and their KV cache."""

    def __init__(self, seed: int):
        import torch

        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.ids: list[int] = []            # tokens run through the model, by position (= the cache)
        self.kv: list[tuple[Any, Any]] = [] # per layer (heads, len(ids), head_dim) keys and values
        self.pooled: list[bool] = []        # per position of ids: its state went into a span's sum
        self.buf = None                     # (L, n, d) float32 states of fed generated tokens, unlabelled
        self.buf_start = 0                  # position of the first of them
        self.n_tokens = 0                   # tokens of the final rendering


def _span_number(keys: dict, acc: _SpanSums, row: int, step: int, channel: int) -> int:
    """The span number of sample ``row``'s (step, channel) in ``keys``, a new one (room made in ``acc``)
    the first time."""
    key = (int(row), int(step), int(channel))
    j = keys.get(key)
    if j is None:
        j = keys[key] = len(keys)
        acc.reserve(len(keys))
    return j


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


class OnlineBatch:
    """The K samples of one task, generated together with their states captured online.

    ``turn(rows, targets, sampling)`` continues the samples ``rows`` from their targets (see the
    module docstring) and returns each one's generated token ids (the stop token, if any, last);
    ``finish(row, target)`` settles a finished sample against its final rendering (running the few
    labelled tokens the model has not seen yet, e.g. a text cut by ``max_new_tokens``) and
    ``states(row, traj_id)`` returns its pooled states in :func:`~latentsift.states.states.replay`'s
    layout. ``capture=False`` generates the same tokens without pooling (benchmarks).
    """

    def __init__(self, policy, seeds: Sequence[int], stop_ids: Sequence[int], *, capture: bool = True,
                 leave: bool = True):
        import torch

        self.policy = policy
        self.samples = [_Sample(s) for s in seeds]
        self.stop = {int(s) for s in stop_ids}
        self.capture = capture
        self.leave = leave      # False (benchmarks only): finished samples stay in the batch until all stop
        self.acc = _SpanSums(policy.n_layers, policy.d_model, 8 * len(self.samples), policy.device)
        self.keys: dict[tuple[int, int, int], int] = {}    # (row, step, channel) -> span number
        self._grab = None                                  # decode: (rows tensor, buffer index) to keep
        self._bufs = None
        self.pad_id = int(policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else 0)
        self.n_forward_tokens = 0                          # tokens run through the model (prefill + decode)
        self.n_generated = 0
        self._torch = torch

    # ------------------------------------------------------------------ pooling
    def _span(self, row: int, step: int, channel: int) -> int:
        return _span_number(self.keys, self.acc, row, step, channel)

    def _on_layer(self, i: int, hidden) -> None:
        self.acc(i, hidden)
        if self._grab is not None:
            rows, col = self._grab
            self._bufs[i, rows, col] = hidden[:, -1].float()

    def _settle(self, row: int, target: Rendering) -> int:
        """Keep the common prefix of what the sample ran and ``target``; pool its buffered generated
        states with the target's labels. Returns the number of positions kept."""
        s = self.samples[row]
        keep = _common_prefix(s.ids, target.input_ids)
        if any(s.pooled[keep:]):
            raise LatentSiftError(f"OnlineBatch: the chat template re-tokenized labelled text at position {keep} "
                                  "of an earlier turn; its states cannot be captured online.")
        if s.buf is not None and self.capture:
            a, b = s.buf_start, min(keep, s.buf_start + s.buf.shape[1])
            pos = np.arange(a, max(a, b))
            lab = pos[target.step[pos] >= 0] if len(pos) else pos
            if len(lab):
                tgt = [self._span(row, target.step[p], target.channel[p]) for p in lab]
                t, dev = self._torch.as_tensor, s.buf.device
                # sum_p h_l[p] over the span's tokens (numerator of the span mean), all layers at once
                add_span_sums(self.acc.sums, 1, t(tgt, dtype=self._torch.long, device=dev),
                              s.buf.index_select(1, t(lab - a, device=dev)))
                np.add.at(self.acc.counts, tgt, 1)
                for p in lab:
                    s.pooled[p] = True
        s.buf = None
        if keep < len(s.ids):
            s.ids, s.pooled = s.ids[:keep], s.pooled[:keep]
            s.kv = [(k[:, :keep], v[:, :keep]) for k, v in s.kv]
        return keep

    # ------------------------------------------------------------------ forwards
    def _prefill(self, rows: list[int], targets: list[Rendering], upto: list[int]):
        """One batched forward of each row's unseen target tokens ``[len(ids), upto)``; returns the
        batched cache, the attention mask and the last position's logits ``(B, vocab)`` float32."""
        torch = self._torch
        from transformers import DynamicCache

        pol, samples = self.policy, [self.samples[r] for r in rows]
        past = [len(s.ids) for s in samples]
        new = [list(map(int, t.input_ids[p:u])) for t, p, u in zip(targets, past, upto)]
        if any(not n for n in new):
            raise LatentSiftError("OnlineBatch: a sample has no new token to run (its target adds nothing).")
        B, P, M = len(rows), max(past), max(len(n) for n in new)
        # the first turn of K samples of one task: one prompt, run once and its cache repeated
        shared = B > 1 and P == 0 and all(n == new[0] for n in new)
        dev = pol.device
        ids = torch.full((B, M), self.pad_id, dtype=torch.long)
        mask = torch.zeros(B, P + M, dtype=torch.long)
        posn = torch.zeros(B, M, dtype=torch.long)
        src, tgt = [], []
        for b, (s, n, t, p) in enumerate(zip(samples, new, targets, past)):
            off = M - len(n)
            ids[b, off:] = torch.as_tensor(n)
            mask[b, P - p:P] = 1
            mask[b, P + off:] = 1
            posn[b, off:] = torch.arange(p, p + len(n))
            if self.capture:
                for j in range(len(n)):
                    st = int(t.step[p + j])
                    if st >= 0:
                        src.append(b * M + off + j)
                        tgt.append(self._span(rows[b], st, int(t.channel[p + j])))
        ids, mask, posn = ids.to(dev), mask.to(dev), posn.to(dev)
        cache = DynamicCache(config=pol.model.config)
        if P:
            for layer in range(len(samples[0].kv)):
                h, d = samples[0].kv[layer][0].shape[0], samples[0].kv[layer][0].shape[2]
                k = torch.zeros(B, h, P, d, dtype=samples[0].kv[layer][0].dtype, device=dev)
                v = torch.zeros_like(k)
                for b, (s, p) in enumerate(zip(samples, past)):
                    if p:
                        k[b, :, P - p:] = s.kv[layer][0]
                        v[b, :, P - p:] = s.kv[layer][1]
                cache.update(k, v, layer)
        if shared:   # every row's labelled positions are row 0's
            src = [x % M for x in src]
            ids, mask1, posn = ids[:1], mask[:1], posn[:1]
        self.acc.set_targets(np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64))
        out = pol.base(input_ids=ids, attention_mask=mask1 if shared else mask, position_ids=posn,
                       past_key_values=cache, use_cache=True)
        self.acc.set_targets(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        if shared:
            for layer in cache.layers:
                layer.batch_repeat_interleave(B)
        for s, n, t, p in zip(samples, new, targets, past):
            s.ids.extend(n)
            s.pooled.extend(bool(self.capture and x >= 0) for x in t.step[p:p + len(n)])
        self.n_forward_tokens += len(new[0]) if shared else sum(len(n) for n in new)
        logits = pol.model.lm_head(out.last_hidden_state[:, -1]).float()   # (B, vocab): the last position only
        if shared:
            logits = logits.expand(B, -1)
        return cache, mask.bool(), logits

    @staticmethod
    def _keep_kv(sample: _Sample, cache, b: int, mask_row) -> None:
        """Cut sample ``b``'s real positions out of the batched cache (its own copy, for its next turn)."""
        idx = mask_row.nonzero().squeeze(1)
        sample.kv = [(layer.keys[b].index_select(1, idx).clone(), layer.values[b].index_select(1, idx).clone())
                     for layer in cache.layers]

    def turn(self, rows: Sequence[int], targets: Sequence[Rendering], sampling: Sampling) -> list[list[int]]:
        """Generate one turn for each sample of ``rows`` after its ``target`` (the conversation and the
        generation prompt, labelled). Returns the generated ids per row, the stop token included."""
        torch = self._torch
        rows, targets = list(rows), list(targets)
        if not rows:
            return []
        sampling.check()
        longest = max(t.n_tokens for t in targets) + sampling.max_new_tokens
        if longest > self.policy.context_length:
            raise LatentSiftError(f"The conversation would reach {longest:,} tokens, past the model's context of "
                                  f"{self.policy.context_length:,}; use fewer --turns, a lower --max-new-tokens or a "
                                  "shorter task prompt.")
        for r, t in zip(rows, targets):
            self._settle(r, t)
        n, dev = sampling.max_new_tokens, self.policy.device
        if self.capture and (self._bufs is None or self._bufs.shape[2] < n):
            self._bufs = torch.empty(self.policy.n_layers, len(self.samples), n, self.policy.d_model,
                                     dtype=torch.float32, device=dev)
        out: dict[int, list[int]] = {r: [] for r in rows}
        hooks = layer_hooks(self.policy, self._on_layer) if self.capture else contextlib.nullcontext()
        with torch.inference_mode(), exact_attention(dev), hooks:
            cache, mask, logits = self._prefill(rows, targets, [t.n_tokens for t in targets])
            starts = {r: len(self.samples[r].ids) for r in rows}
            active = list(range(len(rows)))              # batch row -> index into rows
            stopped: set[int] = set()                    # batch rows that finished but stay (leave=False)
            for col in range(sampling.max_new_tokens):
                toks, still = [], []
                drawn = logits.cpu()   # each sample's generator is a CPU one (the same draws on any device)
                for b, a in enumerate(active):
                    if b in stopped:
                        toks.append(self.pad_id)
                        continue
                    r = rows[a]
                    tok = sample_token(drawn[b], sampling, self.samples[r].generator)
                    toks.append(tok)
                    out[r].append(tok)
                    self.n_generated += 1
                    if tok in self.stop or len(out[r]) == sampling.max_new_tokens:
                        self._leave(r, cache, b, mask[b], starts[r], col)
                        if not self.leave:
                            stopped.add(b)
                    else:
                        still.append(b)
                if not still:
                    break
                if self.leave and len(still) < len(active):   # finished samples leave the batch
                    sel = torch.as_tensor(still, device=dev)
                    for layer in cache.layers:
                        layer.batch_select_indices(sel)
                    mask, logits = mask[sel], logits[sel]
                    toks = [toks[b] for b in still]
                    active = [active[b] for b in still]
                feed = torch.as_tensor(toks, dtype=torch.long, device=dev)[:, None]
                pos = torch.as_tensor([len(self.samples[rows[a]].ids) for a in active], dtype=torch.long,
                                      device=dev)[:, None]
                mask = torch.cat([mask, torch.ones(len(active), 1, dtype=torch.bool, device=dev)], 1)
                self._grab = (torch.as_tensor([rows[a] for a in active], device=dev), col) if self.capture else None
                res = self.policy.base(input_ids=feed, attention_mask=mask.long(), position_ids=pos,
                                       past_key_values=cache, use_cache=True)
                self._grab = None
                for b, (a, tok) in enumerate(zip(active, toks)):
                    if b not in stopped:
                        self.samples[rows[a]].ids.append(tok)
                        self.samples[rows[a]].pooled.append(False)   # pooled once labelled (_settle)
                self.n_forward_tokens += len(active)
                logits = self.policy.model.lm_head(res.last_hidden_state[:, -1]).float()
        return [out[r] for r in rows]

    def _leave(self, row: int, cache, b: int, mask_row, start: int, col: int) -> None:
        """Sample ``row`` stopped after generating ``col + 1`` tokens (``col`` of them fed)."""
        s = self.samples[row]
        self._keep_kv(s, cache, b, mask_row)
        s.buf_start = start
        s.buf = self._bufs[:, row, :col].clone() if self.capture and col else None

    def finish(self, row: int, target: Rendering) -> None:
        """Settle sample ``row`` against its final rendering; run its labelled tokens the model has not
        seen yet (at most the tail of the last turn) through one more forward."""
        self.finish_many([row], [target])

    def finish_many(self, rows: Sequence[int], targets: Sequence[Rendering]) -> None:
        """:meth:`finish` of several samples, their missing tails run as one batched forward."""
        need, tails, upto = [], [], []
        for r, t in zip(rows, targets):
            keep = self._settle(r, t)
            self.samples[r].n_tokens = t.n_tokens
            lab = np.flatnonzero(t.step >= 0)
            last = int(lab[-1]) + 1 if len(lab) else 0
            if last > keep:
                need.append(r)
                tails.append(t)
                upto.append(last)
        if need and self.capture:
            with self._torch.inference_mode(), exact_attention(self.policy.device), \
                    layer_hooks(self.policy, self._on_layer):
                self._prefill(need, tails, upto)
            for r in need:   # the cache of a finished sample is no longer needed
                self.samples[r].kv = []

    def states(self, row: int, target: Rendering, traj_id: str) -> TrajectoryStates:
        """The pooled states of sample ``row`` (after :meth:`finish`), spans in ``target``'s order."""
        if not self.capture:
            raise LatentSiftError("OnlineBatch was created with capture=False: it has no states.")
        keys = [(row, s, c) for s, c in target.span_keys()]
        js = [self.keys[k] for k in keys if k in self.keys]
        present = [j for j in js if self.acc.counts[j] > 0]
        means = self.acc.means(len(self.keys))[present] if present else \
            np.zeros((0, self.policy.n_layers, self.policy.d_model), dtype=np.float32)
        inv = {j: k for k, j in self.keys.items()}
        return TrajectoryStates(traj_id=traj_id, layers=means,
                                step=np.array([inv[j][1] for j in present], dtype=np.int32),
                                channel=np.array([inv[j][2] for j in present], dtype=np.int8),
                                n_tokens=int(target.n_tokens))

