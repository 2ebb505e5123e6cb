"""Effect of the approximate FAISS bank search (``--approx ivf|hnsw``) on the real pools of a finished run.

For every fold of a finished ``reproduce`` (or ``crossval``) run folder, the fold's bank and scorer
(RUN_DIR/folds/fold-k/paper/{bank,scorer}, trained on the other folds' repositories) score that
fold's evaluation pools (the pools of its held-out repositories: ``protocol.Run.cached_fold``, the
fold loop of Stage 1) with the paper's filter, ``LatentSift(bank, scorer, seed=<run seed>)`` as
``reproduce`` builds it: once with exact search and once per approximate backend
(``scale.approx.approx_bank``, the library's default index settings unless --nprobe / --ef-search).

Every bank search the filter makes is recorded (it makes one per (class, channel) for all query
states of a fold), so recall@1 compares the rows of the very searches behind the scores. The first
search of a (class, channel) is preceded by a one-query search of it, timed apart as "build": it
builds the FAISS index (approximate) or the rows' squared norms (exact). Search times are the best of
--repeats calls of the same search. Torch (exact) and FAISS use --threads threads each.

Printed per backend, over the selected folds (one table at the end, markdown):

- recall@1: share of query states (both class banks, every channel) whose returned row is an exact
  nearest row (``scale.approx.recall_at_1``);
- q changed: candidates with a channel score q_c other than exact (beyond float32 rounding: the
  approximate path recomputes each distance itself, rtol 1e-5);
- s changed: candidates whose final score s (fused within-pool ranks) differs;
- retained differs: pools whose retained set differs;
- resolved kept: pools with >= 1 resolved candidate whose retained set keeps one, exact -> approx;
- build, search, and the exact search time next to it (ratio exact / approx).

Usage (reads the run folder, writes nothing):

    .venv/bin/python bench/approx_pools.py RUN_DIR [--folds 0,1,2,3] [--backends ivf,hnsw]
        [--threads 1] [--repeats 3] [--nprobe N] [--ef-search N]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from latentsift._core.validation import LatentSiftError

Q_RTOL, Q_ATOL = 1e-5, 1e-6


# ---------------------------------------------------------------------- the run folder
# ---------------------------------------------------------------------- recorded searches
@dataclasses.dataclass
class SearchLog:
    rows: dict = dataclasses.field(default_factory=dict)  # (class, channel) -> (distances, rows)
    build_s: float = 0.0
    search_s: float = 0.0
    n_queries: int = 0


@contextmanager
def recorded(bank, repeats: int):
    """Record (and time) every search of ``bank`` by the filter; the bank's own ``_search`` answers."""
    log, inner = SearchLog(), bank._search

    def _search(q, cls, channel):
        key = (cls, channel)
        if key in log.rows:
            raise RuntimeError(f"a second search of {key} in one filter pass")
        t0 = time.perf_counter()
        inner(q[:1], cls, channel)  # builds the index / the squared norms
        log.build_s += time.perf_counter() - t0
        best = np.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            d, i = inner(q, cls, channel)
            best = min(best, time.perf_counter() - t0)
        log.search_s += best
        log.n_queries += len(q)
        log.rows[key] = (np.asarray(d), np.asarray(i))
        return d, i

    bank._search = _search
    try:
        yield log
    finally:
        del bank._search  # the class's search again


# ---------------------------------------------------------------------- comparison
@dataclasses.dataclass
class Tally:
    hits: float = 0.0
    n_queries: int = 0
    q_changed: int = 0
    s_changed: int = 0
    n_cands: int = 0
    retained_differs: int = 0
    n_pools: int = 0
    kept_exact: int = 0
    kept: int = 0
    n_solvable: int = 0
    build_s: float = 0.0
    search_s: float = 0.0
    exact_search_s: float = 0.0


def _q_vec(c, channels):
    return np.array([np.nan if c.q is None or c.q.get(ch) is None else c.q[ch] for ch in channels])


def compare(t: Tally, ex_log: SearchLog, ap_log: SearchLog, ex_res, ap_res, resolved: set, channels) -> None:
    from latentsift.scale.approx import recall_at_1

    for key, (d0, i0) in ex_log.rows.items():
        d, i = ap_log.rows[key]
        t.hits += recall_at_1(i, i0, d0, d) * len(i0)
        t.n_queries += len(i0)
    for pe, pa in zip(ex_res, ap_res):
        assert pe.instance_id == pa.instance_id
        for ce, ca in zip(pe.candidates, pa.candidates):
            qe, qa = _q_vec(ce, channels), _q_vec(ca, channels)
            t.q_changed += int(not np.allclose(qe, qa, rtol=Q_RTOL, atol=Q_ATOL, equal_nan=True))
            t.s_changed += int(ce.s != ca.s)
            t.n_cands += 1
        t.retained_differs += int(set(pe.retained) != set(pa.retained))
        t.n_pools += 1
        if any(c.traj_id in resolved for c in pe.candidates):
            t.n_solvable += 1
            t.kept_exact += int(bool(resolved & set(pe.retained)))
            t.kept += int(bool(resolved & set(pa.retained)))
    t.build_s += ap_log.build_s
    t.search_s += ap_log.search_s
    t.exact_search_s += ex_log.search_s


def table(tallies: dict[str, Tally], exact: Tally, exact_build: float) -> str:
    def frac(a, n):
        return f"{a / n:.3f} ({a}/{n})" if n else "-"

    lines = ["| backend | recall@1 | q changed | s changed | retained set differs | resolved kept (exact -> approx) "
             "| build | search | exact search / search |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines.append(f"| exact | 1.000 | 0 | 0 | 0 | {exact.kept_exact}/{exact.n_solvable} | {exact_build:.3f} s "
                 f"(norms) | {exact.exact_search_s:.3f} s | 1.00x |")
    for name, t in tallies.items():
        rec = f"{t.hits / t.n_queries:.4f}" if t.n_queries else "-"
        ratio = f"{t.exact_search_s / t.search_s:.2f}x" if t.search_s > 0 else "-"
        lines.append(f"| {name} | {rec} | {frac(t.q_changed, t.n_cands)} | {frac(t.s_changed, t.n_cands)} "
                     f"| {frac(t.retained_differs, t.n_pools)} "
                     f"| {t.kept_exact}/{t.n_solvable} -> {t.kept}/{t.n_solvable} "
                     f"| {t.build_s:.3f} s | {t.search_s:.3f} s | {ratio} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--folds", default=None, help="comma-separated fold numbers (default: all)")
    ap.add_argument("--backends", default="ivf,hnsw")
    ap.add_argument("--threads", type=int, default=1, help="torch and FAISS threads (same for both)")
    ap.add_argument("--repeats", type=int, default=3, help="best of N calls of each search")
    ap.add_argument("--nprobe", type=int, default=None, help="IVF cells probed (default: the library's)")
    ap.add_argument("--ef-search", type=int, default=None, help="HNSW efSearch (default: the library's)")
    a = ap.parse_args()
    try:
        run_bench(a)
    except LatentSiftError as e:
        sys.exit(f"error: {e}")


def run_bench(a) -> None:
    import torch

    from latentsift.scale.approx import approx_bank, index_kinds
    from latentsift.protocol import open_run_dir
    from latentsift.sift.sift import LatentSift

    KINDS = index_kinds()

    backends = [b for b in a.backends.split(",") if b]
    bad = sorted(set(backends) - set(KINDS))
    if bad or not backends:
        raise LatentSiftError(f"The 'backends' parameter must name backends among {list(KINDS)}. Got {bad or []} "
                              "instead.")
    if a.threads < 1 or a.repeats < 1:
        raise LatentSiftError(f"--threads and --repeats must be positive. Got {a.threads}, {a.repeats} instead.")
    try:
        import faiss
    except ImportError:
        raise LatentSiftError('this benchmark needs faiss-cpu: pip install -e ".[faiss]"') from None
    torch.set_num_threads(a.threads)
    faiss.omp_set_num_threads(a.threads)
    params = {"ivf": {} if a.nprobe is None else {"nprobe": a.nprobe},
              "hnsw": {} if a.ef_search is None else {"ef_search": a.ef_search}}

    run, trajs, store = open_run_dir(a.run_dir)
    folds = run.folds(trajs)
    try:
        ks = list(range(len(folds))) if a.folds is None else [int(x) for x in a.folds.split(",") if x]
    except ValueError:
        ks = []
    if not ks or any(k < 0 or k >= len(folds) for k in ks):
        raise LatentSiftError(f"The 'folds' parameter must name folds in [0, {len(folds) - 1}]. Got {a.folds!r} "
                              "instead.")
    resolved = {t.traj_id for t in trajs if t.label == 1}
    print(f"{a.run_dir}: {len({t.instance_id for t in trajs})} pools, {len(trajs)} candidates, {len(folds)} folds; "
          f"folds {ks}; backends {backends}; threads {a.threads} (torch {torch.get_num_threads()}, "
          f"faiss {faiss.omp_get_max_threads()}); best of {a.repeats}")
    tallies = {b: Tally() for b in backends}
    exact_tally, exact_build = Tally(), 0.0
    for k in ks:
        t0 = time.perf_counter()
        bank, scorer, pools = run.cached_fold(trajs, folds, k)
        if not pools:
            print(f"fold {k}: no evaluation pool")
            continue
        ids = sorted(c.traj_id for p in pools for c in p.candidates)
        states = store.load(ids)  # as reproduce loads them (float32), once for every pass of the fold
        load_s = time.perf_counter() - t0
        sizes = {c: sum(len(getattr(bank, f"{x}_")[c]) for x in ("pos", "neg")) for c in bank.channels}

        def score(b):
            filt = LatentSift(b, scorer, seed=run.settings.seed)
            with recorded(b, a.repeats) as log:
                res = filt.score_pools(pools, states, fingerprint=store.fingerprint)
            return log, res, filt.channels

        ex_log, ex_res, channels = score(bank)
        exact_build += ex_log.build_s
        # exact against itself: only its retention and search time count in the exact row
        compare(exact_tally, ex_log, ex_log, ex_res, ex_res, resolved, channels)
        line = (f"fold {k}: {len(pools)} pools, {len(ids)} candidates, {ex_log.n_queries:,} query-state searches "
                f"(bank rows per channel {sizes}), states loaded in {load_s:.1f} s; "
                f"exact search {ex_log.search_s:.3f} s")
        for b in backends:
            ap_log, ap_res, _ = score(approx_bank(bank, b, **params[b]))
            before = dataclasses.replace(tallies[b])
            compare(tallies[b], ex_log, ap_log, ex_res, ap_res, resolved, channels)
            t = tallies[b]
            line += (f"; {b}: recall@1 {(t.hits - before.hits) / (t.n_queries - before.n_queries):.4f}, "
                     f"build {ap_log.build_s:.3f} s, search {ap_log.search_s:.3f} s, "
                     f"retained differs in {t.retained_differs - before.retained_differs} pools")
        print(line, flush=True)
        del states, ex_res, ex_log
    print()
    print(table(tallies, exact_tally, exact_build))


if __name__ == "__main__":
    main()
