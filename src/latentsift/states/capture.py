"""Capture around transformers ``generate`` with a batch of K samples (:class:`BatchRecorder`): left-padded
prompts, finished samples fed pads that are never pooled, the states written to a ``StateStore``; they match a
replay of the same tokens (``tests/test_capture.py``). The batched engine of ``latentsift rollout`` itself is
``states.online``; this module shares its span numbering.
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import numpy as np

from .._core.attention import exact_attention
from .._core.validation import LatentSiftError, param_error
from ..trajectories.trajectory import CHANNEL_ID, CHANNELS
from .channel import Rendering
from .extract import extract_settings
from .online import _common_prefix, _span_number
from .states import Recording, TrajectoryStates, _SpanSums, add_span_sums
from .store import StateStore


class _Pending:
    """One sample's states of tokens run through the model but not labelled yet: positions
    ``[start, start + n)``, in segments ``(first position, count, block, first column)`` of the
    per-forward blocks ``(L, columns, d_model)`` float32 the layer hooks filled."""

    def __init__(self):
        self.start, self.n, self.segs = 0, 0, []

    def add(self, p: int, blk, col: int) -> None:
        """Position ``p`` (the next one) is column ``col`` of ``blk``."""
        if self.n == 0:
            self.start = p
        last = self.segs[-1] if self.segs else None
        if last is not None and last[2] is blk and last[0] + last[1] == p and last[3] + last[1] == col:
            self.segs[-1] = (last[0], last[1] + 1, blk, last[3])
        else:
            self.segs.append((p, 1, blk, col))
        self.n += 1

    def truncate(self, p: int) -> None:
        """Forget positions ``p`` and after."""
        self.segs = [(a, min(n, p - a), b, c) for a, n, b, c in self.segs if a < p]
        self.n = max(0, min(self.n, p - self.start))

    def take(self, k: int) -> list[tuple[Any, int, int]]:
        """The first ``k`` positions as ``(block, first column, count)`` pieces; they leave."""
        out, left, keep = [], k, []
        for a, n, b, c in self.segs:
            if left >= n:
                out.append((b, c, n))
            elif left > 0:
                out.append((b, c, left))
                keep.append((a + left, n - left, b, c + left))
            else:
                keep.append((a, n, b, c))
            left -= min(left, n)
        self.segs, self.start, self.n = keep, self.start + k, self.n - k
        return out


def _stop_ids_of(policy) -> list[int]:
    """The ids that end a generated turn by default: the model's generation config's eos ids and the
    tokenizer's eos."""
    ids = getattr(getattr(policy.model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if policy.tokenizer.eos_token_id is not None:
        ids.append(policy.tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


class BatchRecorder(Recording):
    """Pooled states of K samples captured while transformers ``generate`` writes them as one batch.

    The recorder holds each sample's *conversation*: its tokens with their (step, channel) labels,
    appended with :meth:`extend` (a prompt or observation before ``generate``, the generated tokens once
    parsed). :meth:`inputs` gives ``generate`` the conversations of some samples, left-padded, and says
    which sample each row of the next forwards is; :meth:`new_tokens` cuts each row's generated ids after
    its first stop id. Inside ``with rec:`` hooks on the decoder stack see every forward (the prefill and
    each decode step) and pool each sample's tokens into its spans as soon as they are both run and
    labelled; tokens run before their labels wait in a per-sample buffer.

    What is attributed to a sample is its own tokens only: positions are counted per row from the
    attention mask (left pads have none and are skipped; the ``position_ids`` ``generate`` passes are
    checked against them); a row that stopped goes on being fed pad tokens by ``generate`` until the
    batch ends: they are run but never labelled, dropped when the sample's next tokens differ and
    ignored when its states are read. Finished samples leave the batch between turns: pass only the samples that
    go on to :meth:`inputs`. Tokens the model already ran at the same position (``generate`` re-prefills
    the whole conversation each turn) are checked to be the same and are not pooled twice.

    :meth:`states` / :meth:`rendering` give one sample's states in :func:`~latentsift.states.states.replay`'s
    layout and the exact tokens and labels (``replay(policy, rec.rendering(r))`` agrees to float32 rounding,
    tested); :meth:`write` stores every sample in a ``StateStore``. Labelled tokens the model never ran
    (the last generated token, a final observation) need one more forward: :meth:`flush`.

    Pitfalls: pass no KV cache from one turn to the next when K > 1 (each turn's left padding differs,
    so a cache of the previous turn's layout would be wrong; at K = 1 it works); no beams or
    ``num_return_sequences`` (one row per sample); no sliding window (a conversation must fit the context).
    On a GPU run ``generate`` inside :func:`~latentsift.states.exact_attention` (padded batches).
    """

    def __init__(self, policy, traj_ids: Sequence[str], *, stop_ids: Sequence[int] | None = None):
        traj_ids = [str(t) for t in traj_ids]
        if not traj_ids or len(set(traj_ids)) != len(traj_ids):
            raise param_error("traj_ids", "BatchRecorder", "one or more distinct trajectory ids", traj_ids)
        self.policy, self.traj_ids = policy, traj_ids
        k = len(traj_ids)
        self.stop = set(_stop_ids_of(policy) if stop_ids is None else (int(s) for s in stop_ids))
        tok = policy.tokenizer
        self.pad_id = int(next(x for x in (tok.pad_token_id, tok.eos_token_id, 0) if x is not None))
        self._ids: list[list[int]] = [[] for _ in range(k)]      # the conversations (labelled tokens)
        self._step: list[list[int]] = [[] for _ in range(k)]
        self._chan: list[list[int]] = [[] for _ in range(k)]
        self._span: list[list[int]] = [[] for _ in range(k)]     # span number per labelled token, -1 excluded
        self._seen: list[list[int]] = [[] for _ in range(k)]     # tokens run through the model, by position
        self._pend = [_Pending() for _ in range(k)]
        self._keys: dict[tuple[int, int, int], int] = {}         # (sample, step, channel) -> span number
        self._acc = _SpanSums(policy.n_layers, policy.d_model, 8 * k, policy.device)
        self._rows = list(range(k))                              # the sample of each row of the next forwards
        self._width = 0                                          # columns of the last inputs()
        self._grab = None                                        # (flat rows tensor, block) of this forward
        self._stack = None

    @property
    def k(self) -> int:
        return len(self.traj_ids)

    # -- the conversations ------------------------------------------------------------------
    def _row(self, r: int) -> int:
        if not (isinstance(r, (int, np.integer)) and 0 <= r < self.k):
            raise param_error("sample", "BatchRecorder", f"a sample index in 0..{self.k - 1}", r)
        return int(r)

    def extend(self, r: int, ids: Sequence[int], step: int | Sequence[int] = -1,
               channel: int | str | Sequence[int] = -1) -> None:
        """Append ``ids`` to sample ``r``'s conversation, labelled (``step``, ``channel``): one value for
        all, or one per token (a channel by name, ``"cot"``, ``"obs"``, ``"fn"``, or id 0..2); step -1 or
        channel -1 / ``"excluded"`` = run as context, never pooled.
        Tokens the model already ran at these positions are pooled now if they are these ids; from the
        first that differs on, what it ran there is dropped."""
        r = self._row(r)
        ids = [int(x) for x in ids]
        n = len(ids)
        names = [channel] if isinstance(channel, str) else list(np.atleast_1d(channel))
        if any(isinstance(c, str) for c in names):
            bad = [c for c in names if isinstance(c, str) and c != "excluded" and c not in CHANNEL_ID]
            if bad:
                raise param_error("channel", "BatchRecorder.extend", f"one of {list(CHANNELS)} or 'excluded'", bad[0])
            ids_of = [CHANNEL_ID.get(str(c), -1) if isinstance(c, str) else int(c) for c in names]
            channel = ids_of[0] if isinstance(channel, str) else ids_of
        step, chan = np.asarray(step, dtype=np.int64), np.asarray(channel, dtype=np.int64)
        for name, a in (("step", step), ("channel", chan)):
            if a.ndim > 1 or (a.ndim == 1 and len(a) != n):
                raise param_error(name, "BatchRecorder.extend", f"one value or {n} (one per token)", a.tolist())
        step, chan = np.broadcast_to(step, (n,)), np.broadcast_to(chan, (n,))
        if ((chan < -1) | (chan >= len(CHANNELS))).any():
            raise param_error("channel", "BatchRecorder.extend", "channel ids in -1..2", chan.tolist())
        c0 = len(self._ids[r])
        for s, c in zip(step.tolist(), chan.tolist()):
            lab = s >= 0 and c >= 0
            self._step[r].append(s if lab else -1)
            self._chan[r].append(c if lab else -1)
            self._span[r].append(_span_number(self._keys, self._acc, r, s, c) if lab else -1)
        self._ids[r].extend(ids)
        seen, pend = self._seen[r], self._pend[r]
        ran = seen[c0:c0 + n]
        k = _common_prefix(ran, ids)
        if k < len(ran):                      # the model ran other tokens here: they and all after go
            del seen[c0 + k:]
            pend.truncate(c0 + k)
        if k:
            self._pool_pending(r, c0, k)

    def _pool_pending(self, r: int, c0: int, k: int) -> None:
        """Positions ``[c0, c0 + k)`` of sample ``r`` were run and are now labelled: pool them."""
        import torch

        spans = np.asarray(self._span[r][c0:c0 + k], dtype=np.int64)
        at = 0
        for blk, col, n in self._pend[r].take(k):
            js = spans[at:at + n]
            ok = np.flatnonzero(js >= 0)
            if len(ok):
                dev = blk.device
                # sum_p h_l[p] over the span's tokens (numerator of the span mean), all layers at once
                add_span_sums(self._acc.sums, 1, torch.as_tensor(js[ok], device=dev),
                              blk.index_select(1, torch.as_tensor(ok + col, device=dev)))
                np.add.at(self._acc.counts, js[ok], 1)
            at += n

    def inputs(self, rows: Sequence[int] | None = None) -> dict:
        """``input_ids`` and ``attention_mask`` ``(len(rows), longest)`` of the conversations of samples
        ``rows`` (default all), left-padded, on the policy's device: pass them to ``generate``. The
        forwards that follow are attributed row by row to these samples."""
        import torch

        rows = list(range(self.k)) if rows is None else [self._row(r) for r in rows]
        if not rows or len(set(rows)) != len(rows):
            raise param_error("rows", "BatchRecorder.inputs", "one or more distinct sample indices", rows)
        empty = [r for r in rows if not self._ids[r]]
        if empty:
            raise LatentSiftError(f"BatchRecorder: sample {empty[0]} has no tokens yet; extend() it with its "
                                  "prompt first.")
        width = max(len(self._ids[r]) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for b, r in enumerate(rows):
            n = len(self._ids[r])
            ids[b, width - n:] = torch.as_tensor(self._ids[r])
            mask[b, width - n:] = 1
        self._rows, self._width = rows, width
        dev = self.policy.device
        return {"input_ids": ids.to(dev), "attention_mask": mask.to(dev)}

    def new_tokens(self, output) -> list[list[int]]:
        """Each row's generated ids in ``generate``'s ``output`` (the columns after :meth:`inputs`), cut
        after its first stop id (the stop id included); in the order of the rows given to :meth:`inputs`."""
        seqs = getattr(output, "sequences", output)
        out = []
        for row in seqs[:, self._width:].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in self.stop), len(row))
            out.append(row[:end])
        return out

    # -- hooks: ``with`` (Recording) ------------------------------------------------------
    def _positions(self, ids, kwargs):
        """``(real, pos)`` ``(B, n)`` numpy: which columns of this forward are a sample's tokens, and
        their position in the sample (counted per row from the attention mask)."""
        import torch

        b, n = ids.shape
        mask, given = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 2):
            raise LatentSiftError("BatchRecorder needs generate's 2-D attention mask (no static or compiled "
                                  "cache while recording).")
        if mask is not None:
            m = mask.long().cpu()
            real, pos = m[:, -n:].bool().numpy(), (m.cumsum(-1) - 1)[:, -n:].numpy()
        else:
            cache = kwargs.get("past_key_values")
            past = int(cache.get_seq_length()) if cache is not None else 0
            real = np.ones((b, n), dtype=bool)
            pos = given.cpu().numpy() if given is not None else np.broadcast_to(np.arange(past, past + n), (b, n))
        if given is not None and mask is not None and given.shape[-1] == n:
            got = given.reshape(-1, n).expand(b, n).cpu().numpy() if given.dim() == 2 else None
            if got is not None and (got[real] != pos[real]).any():
                raise LatentSiftError("BatchRecorder: the forward's position_ids are not counted per sample from "
                                      "its attention mask (left padding); let generate make them.")
        elif given is None and mask is not None and not m.bool().all():
            raise LatentSiftError("BatchRecorder: a padded forward without position_ids; pass position_ids "
                                  "counted per row (generate does).")
        return real, pos

    def _on_forward(self, args, kwargs) -> None:
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise LatentSiftError("BatchRecorder needs input_ids (inputs_embeds cannot be attributed to tokens).")
        b, n = ids.shape
        if b != len(self._rows):
            raise LatentSiftError(f"BatchRecorder: a forward of {b} rows, but inputs() gave {len(self._rows)} "
                                  "samples (no beams or num_return_sequences while recording).")
        real, pos = self._positions(ids, kwargs)
        toks = ids.cpu().numpy()
        src, tgt, grab, put = [], [], [], []
        for row, r in enumerate(self._rows):
            seen, conv, span = self._seen[r], self._ids[r], self._span[r]
            for c in np.flatnonzero(real[row]).tolist():
                p, t = int(pos[row, c]), int(toks[row, c])
                if p < len(seen):
                    if seen[p] == t:
                        continue                  # run before (a re-prefill): pooled once
                    if p < len(conv):
                        raise LatentSiftError(f"BatchRecorder: sample {r} was run on other tokens at position {p} "
                                              "than its conversation; feed the conversations from inputs().")
                    del seen[p:]                  # generated tokens the conversation did not keep
                    self._pend[r].truncate(p)
                if p > len(seen):
                    raise LatentSiftError(f"BatchRecorder missed tokens of sample {r}: a forward runs position {p} "
                                          f"but {len(seen)} were run. Open the recorder before the first forward.")
                seen.append(t)
                if p < len(conv):
                    if conv[p] != t:
                        raise LatentSiftError(f"BatchRecorder: sample {r} was run on other tokens at position {p} "
                                              "than its conversation; feed the conversations from inputs().")
                    if span[p] >= 0:
                        src.append(row * n + c)
                        tgt.append(span[p])
                else:
                    grab.append(row * n + c)
                    put.append((r, p))
        self._acc.set_targets(np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64))
        self._grab = None
        if grab:
            dev = self.policy.device
            blk = torch.empty(self.policy.n_layers, len(grab), self.policy.d_model, dtype=torch.float32, device=dev)
            self._grab = (torch.as_tensor(grab, dtype=torch.long, device=dev), blk)
            for col, (r, p) in enumerate(put):
                self._pend[r].add(p, blk, col)

    def _on_layer(self, i: int, hidden) -> None:
        self._acc(i, hidden)
        if self._grab is not None:
            idx, blk = self._grab
            flat = hidden.reshape(-1, hidden.shape[-1])
            blk[i] = flat.index_select(0, idx.to(flat.device)).float().to(blk.device)

    # -- results ----------------------------------------------------------------------------
    def _unrun(self, r: int) -> int:
        """Labelled span tokens of sample ``r`` the model has not run yet."""
        return int(sum(1 for j in self._span[r][len(self._seen[r]):] if j >= 0))

    def flush(self) -> None:
        """Run the labelled tokens no forward has run yet (the last generated token of a turn, a final
        observation): one batched forward of the samples that have some (their whole conversations,
        left-padded; the tokens run before are not pooled again)."""
        import torch

        rows = [r for r in range(self.k) if self._unrun(r)]
        if not rows:
            return
        saved = self._rows, self._width
        batch = self.inputs(rows)
        pos = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        hooks = contextlib.nullcontext() if self._stack is not None else self
        try:
            with hooks, torch.inference_mode(), exact_attention(self.policy.device):
                self.policy.base(**batch, position_ids=pos)
        finally:
            self._rows, self._width = saved

    def rendering(self, r: int) -> Rendering:
        """Sample ``r``'s conversation (exact tokens and labels), as a ``Rendering`` for replay."""
        r = self._row(r)
        step = np.asarray(self._step[r], dtype=np.int32)
        return Rendering(traj_id=self.traj_ids[r], input_ids=np.asarray(self._ids[r], dtype=np.int64), step=step,
                         channel=np.asarray(self._chan[r], dtype=np.int8),
                         n_steps=int(step.max()) + 1 if len(step) and step.max() >= 0 else 0)

    def states(self, r: int) -> TrajectoryStates:
        """Sample ``r``'s pooled states, spans in trajectory order (the layout of ``replay``)."""
        r = self._row(r)
        if self._unrun(r):
            raise LatentSiftError(f"BatchRecorder: {self._unrun(r)} labelled span tokens of sample {r} were never run "
                                  "through the model (a turn's last generated token is run only by the next "
                                  "forward); call flush() first.")
        keys = self.rendering(r).span_keys()
        js = [self._keys[(r, s, c)] for s, c in keys]
        means = self._acc.means(len(self._keys))[js] if js else \
            np.zeros((0, self.policy.n_layers, self.policy.d_model), dtype=np.float32)
        return TrajectoryStates(traj_id=self.traj_ids[r], layers=means,
                                step=np.array([s for s, _ in keys], dtype=np.int32),
                                channel=np.array([c for _, c in keys], dtype=np.int8),
                                n_tokens=len(self._ids[r]))

    def write(self, store, instance_ids: Sequence[str], *, store_dtype: str = "float16"):
        """Every sample's states (after :meth:`flush`) into ``store``: a ``StateStore`` or a folder, created
        with this policy's fingerprint and settings (``capture: online``) or opened and checked. Returns
        the store."""
        if not isinstance(store, StateStore):
            settings = extract_settings(self.policy, store_dtype=store_dtype) | {"capture": "online"}
            store = StateStore(store).open_or_create(self.policy.fingerprint, settings)
        self.flush()
        store.write([self.states(r) for r in range(self.k)], list(instance_ids))
        return store
