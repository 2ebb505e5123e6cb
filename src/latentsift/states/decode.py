"""The weights' layout for decoding: the few-row products of sampling, made faster on a CPU.

A decode step of K samples multiplies K rows (one hidden vector per sample) by every weight matrix of
the model. torch stores an ``nn.Linear``'s weight as (out, in), and at a few rows the CPU GEMM on it
runs far below the memory bandwidth (about 20 GFLOP/s per process on the confirmation run's 2-core
AVX-512 Xeon with two processes; ``bench/decode.py`` prints the rates and the ratios here). Two
layouts make the same products faster, and neither changes a value of the weights:

- ``in-out``: the decoder layers' weights stored (in, out) contiguous, their memory transposed in place
  (``weight.t().contiguous().t()``), so ``F.linear`` hands the GEMM an untransposed matrix; no extra
  memory; the head stays as stored (151,936 x d in (in, out) was no faster).
- ``mkl-packed``: every linear, the head included, packed by MKL for GEMMs of exactly K rows
  (``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, the ops torch's inductor uses for
  frozen float32 linears); ``_mkl_linear`` uses the packing at K rows and the stored weight at any
  other row count (a prefill, a batch that samples have left), where the layers' weights are (in, out)
  as above. The packed copies sit beside the weights, about their size again in resident memory
  (measured), so a policy takes about twice its float32 weights while it decodes. The fastest measured,
  so new rollouts use it where torch has MKL (x86 builds).

What it changes: the products' rounding, so the logits' last bits and, through them, now and then a
sampled token, against the stored layout. What it keeps: within one machine, thread count, dtype and
K, the same seeds give the same tokens and the same states to the byte (a GEMM's rounding depends only
on its shapes, layout and threads, and each product here is one of two fixed computations; tested twice
in a row). The layout is recorded in the rollout folder's manifest; a folder made before it was
recorded (``STORED_LAYOUT``) is resumed in its own layout, so its remaining tasks have the bytes its
command gave when it started. Only on a CPU and only for float32 weights (a bfloat16 GEMM takes
another path, not measured); elsewhere the weights stay as stored and the manifest says so.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from .._core.validation import LatentSiftError

#: The layout torch loads: every weight (out, in); the layout of rollout folders that record none.
STORED_LAYOUT = "out-in"
#: The layers' weights (in, out), the head as stored (where torch lacks MKL).
IN_OUT_LAYOUT = "in-out"
#: Every linear MKL-packed for K rows, the layers' weights (in, out) for other row counts.
PACKED_LAYOUT = "mkl-packed"
DECODE_LAYOUTS = (STORED_LAYOUT, IN_OUT_LAYOUT, PACKED_LAYOUT)


def decode_layout_for(policy) -> str:
    """The fastest layout that keeps a run reproducible that ``policy`` can decode in here: the stored one
    off a CPU or for weights other than float32, else ``PACKED_LAYOUT`` where torch has MKL and
    ``IN_OUT_LAYOUT`` where it has not."""
    import torch

    if policy.device.type != "cpu" or next(policy.model.parameters()).dtype != torch.float32:
        return STORED_LAYOUT
    return PACKED_LAYOUT if torch._C.has_mkl else IN_OUT_LAYOUT


def _layer_linears(policy) -> list:
    import torch

    return [m for m in policy.base.modules() if isinstance(m, torch.nn.Linear)]


def _packed_forward(packed, weight, bias, rows: int):
    import torch

    return lambda x: torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


@contextlib.contextmanager
def decode_weights(policy, layout: str, rows: int) -> Iterator[None]:
    """Run the block with ``policy``'s weights in ``layout`` (one of ``DECODE_LAYOUTS``) for batches of
    ``rows`` samples; the stored layout is restored on exit (the values never change, so a policy
    shared in the process computes as before afterwards)."""
    import torch

    if layout not in DECODE_LAYOUTS:
        raise ValueError(f"The 'layout' parameter of decode_weights must be one of {list(DECODE_LAYOUTS)}. "
                         f"Got {layout!r} instead.")
    if layout == STORED_LAYOUT:
        yield
        return
    if decode_layout_for(policy) == STORED_LAYOUT or (layout == PACKED_LAYOUT and not torch._C.has_mkl):
        raise LatentSiftError(f"These rollouts were made in the decode layout {layout!r}, which needs a CPU, float32 "
                              f"weights{' and torch built with MKL' if layout == PACKED_LAYOUT else ''}: resume them "
                              "where they were made, or use another --out.")
    linears = _layer_linears(policy)
    head = policy.model.get_output_embeddings()
    packed = [head, *linears] if layout == PACKED_LAYOUT else []
    try:
        with torch.no_grad():
            packs = [torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), int(rows)) for m in packed]
            for m in linears:   # the same values, memory (in, out): weight.t() is contiguous
                m.weight.data = m.weight.data.t().contiguous().t()
            for m, pw in zip(packed, packs):
                m.forward = _packed_forward(pw, m.weight.detach(), None if m.bias is None else m.bias.detach(),
                                            int(rows))
        yield
    finally:
        with torch.no_grad():
            for m in linears:
                m.weight.data = m.weight.data.contiguous()
        for m in packed:
            m.__dict__.pop("forward", None)
