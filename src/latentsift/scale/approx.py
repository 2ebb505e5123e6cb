"""Approximate bank search with FAISS (IVF or HNSW): off by default, for banks too large for exact search.

``approx_bank(bank, "ivf" | "hnsw")`` returns an ``ApproxBank``: the same fitted ``Bank`` whose
nearest-row search uses a FAISS index per (class, channel), built on first use. The reported
distance is recomputed exactly for the row the index returns (so it is never smaller than the true
nearest distance); ``recall_at_1`` measures how often that row is the exact nearest one. FAISS is a
well-kept library for this; nothing here re-implements an index.
"""
from __future__ import annotations

import numpy as np

from .._core.registry import registry_add, registry_lookup, registry_names
from .._core.validation import LatentSiftError, check_choice, check_positive_int
from ..bank.bank import Bank


def _faiss():
    try:
        import faiss
    except ImportError:  # pragma: no cover - depends on the install
        raise LatentSiftError("--approx needs faiss-cpu: pip install -e \".[faiss]\"") from None
    return faiss


def build_index(rows: np.ndarray, kind: str, *, nlist: int | None = None, nprobe: int = 16, hnsw_m: int = 32,
                ef_search: int = 64, seed: int = 0):
    """A FAISS index over ``rows`` (float32, (n, d)): IVF-Flat (``nlist`` ~ 4 sqrt(n) cells, ``nprobe``
    probed) or HNSW-Flat (``hnsw_m`` links, ``ef_search``)."""
    check_choice(kind, "kind", "build_index", index_kinds())
    x = np.ascontiguousarray(rows, dtype=np.float32)
    return registry_lookup("index_kind", kind)(_faiss(), x, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m,
                                               ef_search=ef_search, seed=seed)


def _ivf_index(faiss, x: np.ndarray, *, nlist: int | None, nprobe: int, seed: int, **_):
    n, d = x.shape
    nlist = check_positive_int(nlist or max(1, min(n // 39, int(4 * np.sqrt(n)))), "nlist", "build_index")
    quant = faiss.IndexFlatL2(d)
    index = faiss.IndexIVFFlat(quant, d, nlist)
    index.cp.seed = seed
    index.train(x)
    index.add(x)
    index.nprobe = min(nprobe, nlist)
    return index


def _hnsw_index(faiss, x: np.ndarray, *, hnsw_m: int, ef_search: int, **_):
    index = faiss.IndexHNSWFlat(x.shape[1], hnsw_m)
    index.hnsw.efSearch = ef_search
    index.add(x)
    return index


# the approximate index kinds (kind "index_kind"): (faiss, rows, **settings) -> a FAISS index
registry_add("index_kind", "ivf", _ivf_index)
registry_add("index_kind", "hnsw", _hnsw_index)


def index_kinds() -> tuple[str, ...]:
    """Every registered approximate index kind (``--approx``)."""
    return registry_names("index_kind")


def search(index, rows: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distance recomputed exactly to the returned row, row) per query."""
    _, idx = index.search(np.ascontiguousarray(q, dtype=np.float32), 1)
    i = np.maximum(idx[:, 0], 0).astype(np.int64)
    d = np.linalg.norm(q.astype(np.float32) - rows[i], axis=1).astype(np.float32)
    return d, i


def recall_at_1(approx_rows: np.ndarray, exact_rows: np.ndarray, exact_d: np.ndarray, approx_d: np.ndarray) -> float:
    """Share of queries whose approximate nearest row is an exact nearest row (same row or same distance)."""
    return float(np.mean((approx_rows == exact_rows) | (approx_d <= exact_d)))


class ApproxBank(Bank):
    """A fitted ``Bank`` searched through FAISS IVF/HNSW indexes (build with :func:`approx_bank`)."""

    def _search(self, q: np.ndarray, cls: str, channel: str):
        rows = getattr(self, f"{cls}_")[channel]
        key = (cls, channel)
        if key not in self.indexes_:
            self.indexes_[key] = build_index(rows, self.approx_kind_, **self.approx_params_)
        return search(self.indexes_[key], rows, q)


def approx_bank(bank: Bank, kind: str = "hnsw", **params) -> ApproxBank:
    """An ``ApproxBank`` sharing ``bank``'s arrays; ``params`` go to :func:`build_index`."""
    bank._check_fitted()
    check_choice(kind, "approx", "approx_bank", index_kinds())
    _faiss()
    ab = ApproxBank.__new__(ApproxBank)
    ab.__dict__.update({k: v for k, v in bank.__dict__.items() if k not in ("_sqnorms", "_searches")})
    ab.approx_kind_, ab.approx_params_, ab.indexes_ = kind, dict(params), {}
    return ab
