"""A bank whose rows are split into shards held by Ray actors (exact search, driver-side merge).

``shard_bank(bank, n_shards)`` returns a ``ShardedBank``: the same fitted ``Bank`` (owners, steps,
guards, transforms all unchanged) whose nearest-row search is answered by ``n_shards`` actors. Each
actor holds a contiguous slice of every (class, channel) matrix and answers, for a batch of query
states, the exact nearest distance and row of its slice (``knn.nearest_distances``, the
single-process search). The driver keeps, per query, the smallest distance over the shards; on equal
distances the lowest shard wins, and within a shard the lowest row, so ties resolve to the lowest
global row as in the single-process search. The returned distance is the directly computed
``||q - b||`` of the winning row in both paths, so distances and owners are the same.

FAISS has no distributed layer of its own; the same merge applies to per-shard FAISS indexes.
"""
from __future__ import annotations

import numpy as np

from .._core.validation import LatentSiftError, check_positive_int
from ..bank.bank import CLASSES, Bank
from ..bank.knn import TORCH_KNN, bank_sqnorms, nearest_distances
from .cluster import RAY_LOCAL, connect, worker_cpus


class BankShard:
    """Ray actor body: one slice of every (class, channel) bank matrix."""

    def __init__(self, slices: dict, threads: int | None = 1):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.slices = {k: (np.ascontiguousarray(rows), off, bank_sqnorms(rows) if len(rows) else None)
                       for k, (rows, off) in slices.items()}

    def search(self, key, q: np.ndarray):
        rows, off, sq = self.slices[key]
        if len(rows) == 0:
            return np.full(len(q), np.inf, np.float32), np.zeros(len(q), np.int64)
        d, i = nearest_distances(q, rows, return_index=True, sqnorms=sq, validate_bank=False)
        return d, i + off


def merge_nearest(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the smallest distance over shards (given in row order); the first shard wins ties."""
    best_d, best_i = parts[0][0].copy(), parts[0][1].copy()
    for d, i in parts[1:]:
        better = d < best_d
        best_d[better], best_i[better] = d[better], i[better]
    return best_d, best_i


def _bounds(n: int, k: int) -> list[tuple[int, int]]:
    cuts = np.linspace(0, n, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


class ShardedBank(Bank):
    """A fitted ``Bank`` whose search runs on Ray actors (build with :func:`shard_bank`)."""

    def _search(self, q: np.ndarray, cls: str, channel: str):
        import ray

        refs = [a.search.remote((cls, channel), q) for a in self.actors_]
        return merge_nearest(ray.get(refs))

    def close(self) -> None:
        """Release the shard actors."""
        import ray

        for a in getattr(self, "actors_", []):
            ray.kill(a)
        self.actors_ = []


def shard_bank(bank: Bank, n_shards: int = 2, *, ray_address: str | None = RAY_LOCAL,
               cpus_per_shard: float | None = None, threads: int | None = 1) -> ShardedBank:
    """A ``ShardedBank`` with ``bank``'s rows split into ``n_shards`` contiguous slices on Ray actors."""
    bank._check_fitted()
    if bank.backend != TORCH_KNN:
        raise LatentSiftError(f"A sharded bank searches with the exact torch backend; this bank uses "
                              f"{bank.backend!r}.")
    n_shards = check_positive_int(n_shards, "n_shards", "shard_bank")
    ray = connect(ray_address)
    cpus = worker_cpus(ray, n_shards, cpus_per_shard)
    sb = ShardedBank.__new__(ShardedBank)
    sb.__dict__.update({k: v for k, v in bank.__dict__.items() if k not in ("_sqnorms", "_searches")})
    slices: list[dict] = [{} for _ in range(n_shards)]
    for cls in CLASSES:
        for c in bank.channels:
            rows = getattr(bank, f"{cls}_")[c]
            for s, (a, b) in enumerate(_bounds(len(rows), n_shards)):
                slices[s][(cls, c)] = (rows[a:b], a)
    Actor = ray.remote(BankShard)
    sb.actors_ = [Actor.options(num_cpus=cpus).remote(ray.put(sl), threads) for sl in slices]
    sb.n_shards_ = n_shards
    return sb
