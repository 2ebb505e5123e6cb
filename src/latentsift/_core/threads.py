"""A fixed thread count for the small products whose rounding depends on it.

Measured with torch 2.13 on CPU: the scorer's weight gradient (a product whose reduction runs over
every span of a batch) differs in the last bits between 1 and 2 threads on AVX-512 machines, and on
AVX2 kernels the scorer's forward product does too (the nearest-neighbour search splits its products into
fixed one-thread blocks instead: ``knn``). A summary
computed from those numbers then depends on how many threads the machine, ``OMP_NUM_THREADS`` or a Ray
worker chose. These computations therefore run at ``NUMERIC_THREADS`` torch threads (1 by default):
they are small next to the model's forward pass, which keeps the caller's thread count.
"""
from __future__ import annotations

import contextlib

NUMERIC_THREADS = 1


@contextlib.contextmanager
def fixed_threads(n: int | None = NUMERIC_THREADS):
    """Run the block at ``n`` torch threads, restoring the caller's count after (None: leave it)."""
    import torch  # lazy, as everywhere in the package: `latentsift --help` must not load torch
    prev = torch.get_num_threads()
    if n is None or prev == int(n):
        yield
        return
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(prev)
