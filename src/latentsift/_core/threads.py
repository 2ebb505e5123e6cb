"""A fixed thread count for the small products whose rounding depends on it.

Measured with torch 2.13 on CPU: the scorer's weight gradient (a product whose reduction runs over
every span of a batch) differs in the last bits between 1 and 2 threads on AVX-512 machines, and on
AVX2 kernels the scorer's forward product does too (the nearest-neighbour search splits its products into
fixed one-thread blocks instead: ``knn``). A summary
computed from those numbers then depends on how many threads the machine, ``OMP_NUM_THREADS`` or a Ray
worker chose. These computations therefore run at ``NUMERIC_THREADS`` torch threads (1 by default):
they are small next to the model's forward pass, which keeps the caller's thread count.

numpy's BLAS (OpenBLAS in numpy's wheels) has the same property: scikit-learn's logistic fits and the
bootstrap's weighted products round differently at 1 and 2 BLAS threads (measured: the logistic
probe's scores differ between ``OPENBLAS_NUM_THREADS=1`` and 2). Those run inside
:func:`fixed_blas_threads`, which sets every BLAS library loaded in the process to ``NUMERIC_THREADS``
(threadpoolctl) and leaves torch's own thread count alone.
"""
from __future__ import annotations

import collections
import contextlib
import functools
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

from threadpoolctl import threadpool_limits

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


@contextlib.contextmanager
def fixed_blas_threads(n: int = NUMERIC_THREADS):
    """Run the block with numpy's BLAS (and any other BLAS threadpoolctl sees) at ``n`` threads."""
    with threadpool_limits(limits=int(n), user_api="blas"):
        yield


def blas_fixed(fn):
    """Decorator: ``fn`` runs inside :func:`fixed_blas_threads` (its results do not depend on how many
    BLAS threads the machine or ``OPENBLAS_NUM_THREADS`` gives numpy)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with fixed_blas_threads():
            return fn(*args, **kwargs)
    return wrapper


def _one_thread() -> None:
    """Worker initializer: torch's (OpenMP) thread count is per OS thread, so each worker sets its own."""
    import torch
    torch.set_num_threads(1)


def one_thread_pool(n_workers: int) -> ThreadPoolExecutor:
    """Workers that each run torch at one thread: work split into pieces fixed by the data alone, each
    piece computed at one thread, gives the same bits in any worker and at any worker count (measured:
    a product in a worker without this initializer runs at the process's count and rounds differently)."""
    return ThreadPoolExecutor(max(1, int(n_workers)), initializer=_one_thread)


@contextlib.contextmanager
def one_thread_workers():
    """A :func:`one_thread_pool` with as many workers as the caller's torch thread count, while the
    calling thread itself runs at :func:`fixed_threads` (the count is read before it is fixed)."""
    import torch
    n_workers = torch.get_num_threads()
    with fixed_threads(), one_thread_pool(n_workers) as pool:
        yield pool


def ordered_map(pool: Executor, fn: Callable[[Any], Any], items: Iterable, ahead: int) -> Iterator:
    """``fn(x)`` for each item, in order, at most ``ahead`` submitted before their results are taken
    (``Executor.map`` submits every item at once). Closing the generator early (an error, Ctrl-C in
    the consumer) cancels what has not started."""
    waiting: collections.deque = collections.deque()
    try:
        for x in items:
            waiting.append(pool.submit(fn, x))
            if len(waiting) >= ahead:
                yield waiting.popleft().result()
        while waiting:
            yield waiting.popleft().result()
    finally:
        for f in waiting:
            f.cancel()
