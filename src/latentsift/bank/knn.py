"""Exact nearest-neighbour distances from query states to a bank (paper section "Distance scoring and latent filtering").

``nearest_distances(queries, bank)`` returns, for every query row, the L2 distance to its nearest
bank row. The reference backend is a blocked GEMM in torch:

    min_b ||q - b||^2 = ||q||^2 + min_b (||b||^2 - 2 q.b)

``||b||^2 - 2 q.b`` is one ``addmm`` per (query block x bank block) with the bank norms as the
additive row (``||q||^2`` is constant per row, so it is not needed to rank the bank rows). The ``RERANK``
rows it ranks first are kept, and the exact distance ``||q - b||`` of each decides: the expansion cancels
when a query nearly coincides with a bank row, and its rounding depends on the CPU's kernels (on AVX2,
two identical bank rows at different positions get different values), so the returned row and
distance come from the exact step alone, with exact ties going to the first row. At most
``block_q x block_b`` float32 values exist at once per worker (default 512 x 4,096 = 8 MiB: small enough
that the shortlist's ``topk`` reads the product from cache), whatever the bank size. The choice of the
nearest row can still differ from exact arithmetic between rows whose distances agree to float32
rounding; pass ``dtype="float64"`` when that matters (about 2x slower on CPU).

Threads without thread-dependent results: the (query block x bank block) products are fixed by
``block_q`` and ``block_b`` alone, each is computed at one torch thread (on AVX2 kernels a multithreaded
``addmm`` rounds differently at 1 and 2 threads), and ``threads`` workers (default: the caller's torch
thread count) share them. Each block's shortlist is merged in bank order and decided by the exact step, so
results are the same at any thread count while the products use every core.
"""
from __future__ import annotations

import threading

import numpy as np

from .._core.threads import fixed_threads, one_thread_pool
from .._core import words
from .._core.registry import registry_add, registry_lookup, registry_names
from .._core.validation import LatentSiftError, check_choice, check_positive_int, check_states
RERANK = 4  # rows per query that the expansion ranks first and the exact distance then decides between
SHORTLIST_GROUP = 64  # columns per group in the two-level shortlist (``smallest``); fastest of 16-128


def _as_tensor(x: np.ndarray, dtype):
    """A torch view of ``x`` in ``dtype``, copied when its data is not 64-byte aligned.

    Pitfall: CPU GEMM kernels pick their code path by the operands' alignment, so the same
    product can differ in the last bits between runs when numpy arrays (e.g. read from a file)
    land at different offsets; aligned inputs make results repeatable run to run.
    """
    import torch
    x = np.ascontiguousarray(x)
    t = torch.from_numpy(x)
    if x.ctypes.data % 64:
        t = t.clone()  # torch's CPU allocator aligns to 64 bytes
    return t.to(dtype)


def bank_sqnorms(bank: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """||b||^2 of every bank row, to compute once per bank and pass to ``nearest_distances``."""
    import torch
    tdtype = torch.float64 if dtype == "float64" else torch.float32
    return torch.linalg.vector_norm(_as_tensor(bank, tdtype), dim=1).square_().numpy()


def smallest(v, k: int, group: int = SHORTLIST_GROUP):
    """(values, columns) of the ``k`` smallest entries of each row of ``v``, unsorted: the values of
    ``v.topk(k, largest=False)``, and its columns but where several entries tie at the k-th value (then
    either pick is a valid shortlist; the exact step decides), found through ``group``-wide column
    groups: the k smallest entries lie in the k groups with the smallest minima (each group holding
    one of them has its minimum at or below the k-th smallest value), so a topk over the group minima and one over
    those k groups' entries replace the topk over the whole row (~2x faster on a 512 x 4,096 block,
    where a topk costs a quarter of the block's product). Rows not made of at least k whole groups
    take the plain topk."""
    nq, nb = v.shape
    if nb % group or nb // group < k:
        return v.topk(k, dim=1, largest=False, sorted=False)
    groups = v.view(nq, nb // group, group)
    gi = groups.amin(dim=2).topk(k, dim=1, largest=False, sorted=False).indices
    cand = groups.gather(1, gi.unsqueeze(2).expand(nq, k, group)).reshape(nq, k * group)
    vals, j = cand.topk(k, dim=1, largest=False, sorted=False)
    return vals, gi.gather(1, j // group) * group + j % group


def _nearest_torch(q: np.ndarray, b: np.ndarray, block_q: int, block_b: int, dtype: str, sqnorms=None,
                   threads: int | None = None, rerank: int = RERANK):
    import torch
    tdtype = torch.float64 if dtype == "float64" else torch.float32
    Q = _as_tensor(q, tdtype)
    B = _as_tensor(b, tdtype)
    nq, nb = Q.shape[0], B.shape[0]
    k = min(rerank, nb)
    bnorm = (torch.linalg.vector_norm(B, dim=1).square_() if sqnorms is None  # no (n_bank, d) temporary
             else _as_tensor(sqnorms, tdtype))
    local = threading.local()  # one (block_q, block_b) product buffer per worker

    def shortlist(i: int, j: int):
        """The k smallest ||b||^2 - 2 q.b of query block i against bank block j (one-thread GEMM)."""
        qi, bj = Q[i:i + block_q], B[j:j + block_b]
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = torch.empty((min(block_q, nq), min(block_b, nb)), dtype=tdtype)
        out = buf[:qi.shape[0], :bj.shape[0]]
        with torch.inference_mode():
            torch.addmm(bnorm[j:j + block_b].unsqueeze(0), qi, bj.T, beta=1.0, alpha=-2.0, out=out)
            vals, idx = smallest(out, min(k, bj.shape[0]))
        return vals, idx + j

    def nearest(i: int, parts: list):
        """Merge the blocks' shortlists of query block i (in bank order), then decide by exact distances."""
        qi = Q[i:i + block_q]
        with torch.inference_mode():
            all_v, all_i = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
            pos = all_v.topk(k, dim=1, largest=False, sorted=False).indices
            # exact distances of the shortlist (no cancellation error from the expansion); rows in
            # ascending order, so argmin (the first minimum) gives exact ties to the first row
            short_i = all_i.gather(1, pos).sort(dim=1).values
            exact = torch.linalg.vector_norm(qi.unsqueeze(1) - B[short_i], dim=2)
            best = exact.argmin(dim=1, keepdim=True)
            return exact.gather(1, best).squeeze(1), short_i.gather(1, best).squeeze(1)

    qs, bs = range(0, nq, block_q), range(0, nb, block_b)
    n_workers = min(torch.get_num_threads() if threads is None else threads, len(qs) * len(bs))
    with fixed_threads(1):  # every block at one torch thread: its rounding is the same in every worker
        if n_workers <= 1:
            res = [nearest(i, [shortlist(i, j) for j in bs]) for i in qs]
        else:
            with one_thread_pool(n_workers) as pool:
                parts = {(i, j): pool.submit(shortlist, i, j) for i in qs for j in bs}
                res = [f.result() for f in [pool.submit(lambda i=i: nearest(i, [parts[i, j].result() for j in bs]))
                                            for i in qs]]
    d = torch.cat([r[0] for r in res]).to(torch.float32)
    return d.numpy(), torch.cat([r[1] for r in res]).numpy()


def _nearest_faiss(q: np.ndarray, b: np.ndarray, **_):
    try:
        import faiss
    except ImportError:  # pragma: no cover - depends on the install
        raise LatentSiftError("The 'faiss' backend needs faiss-cpu: pip install faiss-cpu==1.15.1") from None
    index = faiss.IndexFlatL2(b.shape[1])
    index.add(np.ascontiguousarray(b, dtype=np.float32))
    D, I = index.search(np.ascontiguousarray(q, dtype=np.float32), 1)
    return np.sqrt(np.maximum(D[:, 0], 0.0)).astype(np.float32), I[:, 0].astype(np.int64)


# the kNN backends (kind "knn_backend"): (queries, bank, **search settings) -> (distance, row) per query
#: The exact kNN backend of torch (the default; the one a sharded bank runs).
TORCH_KNN = words.TORCH
registry_add("knn_backend", TORCH_KNN, _nearest_torch)
registry_add("knn_backend", "faiss", _nearest_faiss)


def knn_backends() -> tuple[str, ...]:
    """Every registered exact kNN backend (``Bank(backend=...)``)."""
    return registry_names("knn_backend")


def nearest_distances(queries, bank, *, backend: str = TORCH_KNN, block_q: int = 512,
                      block_b: int = 4096, dtype: str = "float32", return_index: bool = False,
                      sqnorms=None, validate_bank: bool = True, threads: int | None = None):
    """Exact L2 distance of each query row to its nearest bank row.

    queries: (n_queries, d_model); bank: (n_bank, d_model), non-empty. Returns D float32
    (n_queries,), or (D, I) with ``return_index=True``. An empty query set gives empty arrays.
    A caller that searches one bank many times (``Bank``) passes ``sqnorms=bank_sqnorms(bank)``
    and ``validate_bank=False`` after checking the bank once; both only skip repeated work.
    ``threads``: workers sharing the blocks (None: the caller's torch thread count); results do not depend on it.
    """
    if validate_bank:
        b = check_states(bank, "bank", "nearest_distances")
    else:
        b = np.asarray(bank)
        if b.ndim != 2 or b.shape[0] == 0:
            b = check_states(bank, "bank", "nearest_distances")
    q = check_states(queries, "queries", "nearest_distances", d=b.shape[1], allow_empty=True)
    check_choice(backend, "backend", "nearest_distances", knn_backends())
    check_choice(dtype, "dtype", "nearest_distances", ("float32", "float64"))
    block_q = check_positive_int(block_q, "block_q", "nearest_distances")
    block_b = check_positive_int(block_b, "block_b", "nearest_distances")
    if q.shape[0] == 0:
        D, I = np.zeros(0, np.float32), np.zeros(0, np.int64)
    else:
        if sqnorms is not None and np.shape(sqnorms) != (b.shape[0],):
            raise LatentSiftError(f"The 'sqnorms' parameter of nearest_distances must have shape "
                                  f"({b.shape[0]},). Got {np.shape(sqnorms)} instead.")
        if threads is not None:
            threads = check_positive_int(threads, "threads", "nearest_distances")
        D, I = registry_lookup("knn_backend", backend)(q, b, block_q=block_q, block_b=block_b, dtype=dtype,
                                                       sqnorms=sqnorms, threads=threads)
    return (D, I) if return_index else D
