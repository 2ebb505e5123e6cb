"""Attention kernels whose bits do not change from run to run on a GPU.

Measured on an H100 (torch 2.11, CUDA 13, SmolLM2 in bfloat16): two rollouts of one task (K = 4, a padded
batch, so every attention call has a mask) gave other tokens in 1-3 of 4 samples from run to run, in one
process too, with PyTorch's default scaled-dot-product kernels; with only the plain "math" kernel they
were the same. Replays (one sequence, no mask: FlashAttention in bfloat16) gave the same bytes either way.
So on CUDA our forwards run with FlashAttention (taken where it applies: no mask) or the math kernel, never
the memory-efficient or cuDNN kernels. A CPU has neither: nothing changes there.
"""
from __future__ import annotations

import contextlib
import threading

_LOCK = threading.Lock()


class _Shared:
    """The one sdpa_kernel context open while any block runs (its flags are process-wide) and how many
    blocks are inside it."""
    ctx = None
    users = 0


@contextlib.contextmanager
def exact_attention(device):
    """Run the block's attention on FlashAttention or the math kernel when ``device`` is a GPU. Blocks in
    several threads share one setting: it is made by the first to enter and undone by the last to leave."""
    import torch  # lazy, as everywhere in the package: `latentsift --help` must not load torch

    if torch.device(device).type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with _LOCK:
        if not _Shared.users:
            _Shared.ctx = sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
            _Shared.ctx.__enter__()
        _Shared.users += 1
    try:
        yield
    finally:
        with _LOCK:
            _Shared.users -= 1
            if not _Shared.users:
                ctx, _Shared.ctx = _Shared.ctx, None
                ctx.__exit__(None, None, None)
