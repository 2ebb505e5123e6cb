"""The paper's evaluation protocol (paper section "Experimental setup"): Best@K, Oracle Pass@K, random selection,
oracle retention, token ledger and bootstrap intervals, over seeded draws from fixed pools.

Protocol
--------
For every instance (a fixed pool of ``n`` candidates) and every ``K`` in ``ks``:

- **Draws.** ``n_draws`` (200) draws of ``K`` candidates without replacement from a generator
  seeded by ``(seed, K, sha256(instance_id))``, so adding or removing instances never changes the
  draws of the others. When ``C(n, K) <= n_draws`` and ``exact=True`` (default) all ``C(n, K)``
  subsets are enumerated once each instead: the exact expectation that the draws estimate
  (with the data's pools of 5-8 candidates every K is enumerated exactly).
- **Same draws for every filter** (paired comparison), as in the paper's tables.
- Per draw and filter, one :func:`~latentsift.cascade.cascade.run_cascade` run gives the expected label
  of the pick, whether the retained set keeps a resolved candidate, and its token charges.
- **Per-instance values** are means over the draws; reported numbers are means over instances.
  Oracle retention is a ratio over instances: sum of P(draw solvable and retained set solvable)
  over sum of P(draw solvable) (among the draws whose K contain a resolved candidate).
- **Bootstrap**: 95% percentile intervals from ``n_boot`` (1000) resamples of instances with
  replacement, seeded by ``(seed, K)``; the same resamples for every filter and metric.

Pools smaller than a requested K raise an error (``small_pools="error"``) or are left out of that
K's averages (``small_pools="drop"``; ``pools.n_instances_by_k`` records how many remain).

Numbers in the summary are fractions (0-1) and tokens per instance; the report prints percents.

The draws and bootstrap intervals live in ``bootstrap`` (shared with the diagnostics, pruning,
transfer and guard evaluations); the files it reads (pools, scores) in ``formats``. The settings are one
frozen ``EvaluateSettings``; ``evaluate_run`` checks them and the inputs, runs the draws pool by pool
(``_Tally``) and aggregates them with the paired bootstrap.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .._core.threads import blas_fixed
from .._core import words
from .._core.io import jsonable
from .._core.validation import LatentSiftError, check_choice, check_positive_int, param_error
from ..cascade.cascade import (MISSING_RULES, TIE_MEAN, TIE_RULES, CandidateRecord, Filter, PoolSpec, VerifierTable,
                               after_stage1, filter_kind, pool_priority, saving, stage1_retain, stage1_scores)
from ..sift.keep import FixedKeep
from ..sift.retain import KEEP_FRAC, MIN_KEEP
from .bootstrap import CI_LEVEL, N_BOOT, bootstrap_indices, draw_subsets, instance_seed, mean_ci, ratio_ci

#: best_at_k's key of the expected pass of one candidate picked at random among k.
RANDOM_PICK = words.RANDOM  # a random pick among k (a summary key), not the random filter

N_DRAWS = 200       # paper: 200 seeded draws per K
SMALL_POOL_RULES = ("error", "drop")


# ----------------------------------------------------------------------------- statistics

def saving_ci(ref: np.ndarray, ours: np.ndarray, boot: np.ndarray, level: float = CI_LEVEL) -> dict[str, float]:
    """Tokens saved, 1 - mean(ours) / mean(ref), with a paired bootstrap interval."""
    ref, ours = np.asarray(ref, np.float64), np.asarray(ours, np.float64)
    r = ref[boot].mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        stats = 1.0 - ours[boot].mean(axis=1) / r
    ok = stats[np.isfinite(stats)]
    lo, hi = (np.percentile(ok, [50 * (1 - level), 50 * (1 + level)]) if ok.size else (np.nan, np.nan))
    return {"mean": saving(float(ref.mean()), float(ours.mean())), "lo": float(lo), "hi": float(hi)}


# ----------------------------------------------------------------------------- the run

@dataclass
class Summary:
    """The result of :func:`evaluate_run`: ``data`` is summary.json (every reported number);
    ``ledger`` has one row per (instance, K, filter) with per-instance means over draws."""

    data: dict
    ledger: list[dict] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def to_json(self) -> str:
        return json.dumps(jsonable(self.data, finite=True), indent=1, ensure_ascii=False, allow_nan=True)


def _check_inputs(pools: Sequence[PoolSpec], records: Mapping[str, CandidateRecord],
                  filters: Mapping[str, Filter], final_verifier: VerifierTable | None,
                  ) -> tuple[dict[str, str], set[str]]:
    owner = "evaluate_run"
    if not pools:
        raise param_error("pools", owner, "a non-empty sequence of PoolSpec", pools)
    seen_inst: set[str] = set()
    all_ids: set[str] = set()
    for p in pools:
        if p.instance_id in seen_inst:
            raise LatentSiftError(f"evaluate_run: instance {p.instance_id!r} has two pools.")
        seen_inst.add(p.instance_id)
        if not p.traj_ids:
            raise LatentSiftError(f"evaluate_run: pool {p.instance_id!r} is empty.")
        for t in p.traj_ids:
            if t in all_ids:
                raise LatentSiftError(f"evaluate_run: traj_id {t!r} is in two pools.")
            all_ids.add(t)
            r = records.get(t)
            if r is None:
                raise LatentSiftError(f"evaluate_run: no candidate record for {t!r} (pool {p.instance_id!r}).")
            if r.instance_id != p.instance_id:
                raise LatentSiftError(f"evaluate_run: record {t!r} says instance {r.instance_id!r} but it is "
                                      f"in pool {p.instance_id!r}.")
            if r.label not in (0, 1):
                raise LatentSiftError(f"evaluate_run: candidate {t!r} has label {r.label!r}; labels must be 0 or 1 "
                                      "(a pool with a missing label cannot be evaluated).")
        if any(records[t].gen_test is not None for t in p.traj_ids) and p.testgen_tokens is None:
            raise LatentSiftError(f"evaluate_run: pool {p.instance_id!r} has generated-test scores but no "
                                  "'testgen_tokens' (the cost charged when Stage 3 is reached).")
    if not filters:
        raise param_error("filters", owner, "a non-empty dict name -> filter", filters)
    kinds = {name: filter_kind(f, name) for name, f in filters.items()}
    tables = {name: f for name, f in filters.items() if kinds[name] in ("table", "ef")}
    if final_verifier is not None:
        tables["final_verifier"] = final_verifier
    for name, table in tables.items():
        unknown = [t for t in table if t not in all_ids]
        if unknown:
            raise LatentSiftError(f"The scores of {name!r} name {len(unknown)} candidate id(s) that are in no "
                                  f"pool, e.g. {unknown[:3]!r}. Check that the score file matches the pools.")
        if name == "final_verifier":
            continue  # may cover only the candidates that can reach Stage 4; checked per call
        missing = [t for t in sorted(all_ids) if t not in table]
        if missing:
            raise LatentSiftError(f"The filter {name!r} has no score for {len(missing)} candidate(s), "
                                  f"e.g. {missing[:3]!r}.")
    if final_verifier is None and any(k != "ef" for k in kinds.values()):
        raise LatentSiftError("The 'final_verifier' parameter of evaluate_run is required: filters "
                              f"{[n for n, k in kinds.items() if k != 'ef']} are not EF verifiers, so "
                              "Stage 4 needs a final EF verifier's scores.")
    return kinds, all_ids


@dataclass(frozen=True)
class EvaluateSettings:
    """How :func:`evaluate_run` draws and reports (module docstring); checked by ``evaluate_run``.

    ``ks``: the K values (default: 2 .. the smallest pool). ``n_draws`` seeded draws per (instance,
    K), enumerated exactly when ``exact`` and C(n, K) <= ``n_draws``; ``seed`` seeds draws, tie
    breaks and the bootstrap. ``tie``, ``missing``, ``stop_when_single``: the cascade's rules
    (``cascade.run_cascade``). ``small_pools``: "error" or "drop" pools smaller than a K. ``n_boot``
    resamples for intervals at ``ci_level``. ``min_keep``, ``keep_frac``: Stage 1's retention.
    ``reference``: the workflow token savings are measured against (default: the first EF filter).
    ``headline``: filters shown in the main table and figures (default: those in no ablation, the
    reference, and the first filter of each ablation table, i.e. the full method).
    ``ablations``: table name -> ``{"title": str, "filters": [names], "layout": "rows"|"columns",
    "labels": {name: label}}``, reported at ``ablation_k`` (default: the largest K).
    ``dist_instances``: instances (drawn with ``seed``; None = all) of the score-distribution figure.
    ``names``: display names of filters. ``meta``: free-form run information kept in settings.
    """

    ks: Sequence[int] | None = None
    n_draws: int = N_DRAWS
    seed: int = 0
    tie: str = TIE_MEAN
    missing: str = "skip-stage"
    stop_when_single: bool = True
    exact: bool = True
    small_pools: str = "error"
    n_boot: int = N_BOOT
    ci_level: float = CI_LEVEL
    min_keep: int = MIN_KEEP
    keep_frac: float = KEEP_FRAC
    reference: str | None = None
    headline: Sequence[str] | None = None
    ablations: Mapping[str, Mapping[str, Any]] | None = None
    ablation_k: int | None = None
    dist_instances: int | None = None
    names: Mapping[str, str] | None = None
    meta: Mapping[str, Any] | None = None


@blas_fixed
def evaluate_run(pools: Sequence[PoolSpec], filters: Mapping[str, Filter], records: Mapping[str, CandidateRecord],
                 settings: EvaluateSettings | None = None, *, final_verifier: VerifierTable | None = None,
                 distributions: Mapping[str, Mapping[str, float]] | None = None, progress=None) -> Summary:
    """Evaluate every Stage-1 filter through the cascade on the same draws (module docstring).

    ``filters``: name -> filter (``None`` = no filter, a score table, a callable
    ``score_draw(instance_id, traj_ids) -> {traj_id: score}`` called once per draw, or an EF
    verifier table = the *original* workflow, charged for all K and reused in Stage 4).
    ``settings``: an :class:`EvaluateSettings` (default: the paper's).
    ``final_verifier``: EF results used in Stage 4 by every non-EF filter.
    ``distributions``: panel name -> {traj_id: value} for the score-distribution figure
    (resolved vs unresolved).
    ``progress``: optional callable(done, total) called after each instance.
    """
    s = _check_settings(settings or EvaluateSettings())
    kinds, all_ids = _check_inputs(pools, records, filters, final_verifier)
    s = _resolve(s, pools, filters, kinds)
    tally = _Tally(list(filters), s.ks)
    for pi, pool in enumerate(pools):
        tally.add_pool(pool, filters, kinds, records, final_verifier, s)
        if progress is not None:
            progress(pi + 1, len(pools))
    best_at_k, retention, tokens, n_by_k = _aggregate(tally, s)
    fnames = list(filters)
    diagnostics = {
        "rules": {f: {k: {st: dict(c) for st, c in tally.rules[f][k].items()} for k in s.ks} for f in fnames},
        "ef_failed_calls": tally.fail_calls,
        "final_verifier": _verifier_diag(final_verifier) if final_verifier is not None else None,
        "ef_filters": {f: _verifier_diag(filters[f]) for f in fnames if kinds[f] == "ef"},
    }
    recorded = {
        "n_draws": s.n_draws, "seed": s.seed, "tie": s.tie, "missing": s.missing,
        "stop_when_single": s.stop_when_single, "exact": s.exact, "small_pools": s.small_pools, "n_boot": s.n_boot,
        "ci_level": s.ci_level, "min_keep": s.min_keep, "keep_frac": s.keep_frac, "ks": list(s.ks),
        "ablation_k": s.ablation_k, "reference": s.reference, "headline": list(s.headline), "filters": fnames,
        "filter_kinds": kinds, "names": {f: (s.names or {}).get(f, f) for f in fnames}, "meta": dict(s.meta or {}),
    }
    data = {"settings": recorded, "pools": _pools_info(pools, records, all_ids, n_by_k, tally.draws_info, s.ks),
            "retention": retention, "best_at_k": best_at_k, "tokens": tokens,
            "ablations": _ablation_tables(s, best_at_k, retention), "diagnostics": diagnostics,
            "distributions": _distributions(distributions, pools, records, s.dist_instances, s.seed)}
    return Summary(data=data, ledger=tally.ledger)


def _check_settings(s: EvaluateSettings) -> EvaluateSettings:
    """The settings that do not depend on the inputs, checked (before the inputs are)."""
    owner = "evaluate_run"
    check_choice(s.tie, "tie", owner, TIE_RULES)
    check_choice(s.missing, "missing", owner, MISSING_RULES)
    check_choice(s.small_pools, "small_pools", owner, SMALL_POOL_RULES)
    n_draws = check_positive_int(s.n_draws, "n_draws", owner)
    n_boot = check_positive_int(s.n_boot, "n_boot", owner)
    if not 0 < s.ci_level < 1:
        raise param_error("ci_level", owner, "a float in (0, 1)", s.ci_level)
    return replace(s, n_draws=n_draws, n_boot=n_boot)


def _resolve(s: EvaluateSettings, pools: Sequence[PoolSpec], filters: Mapping[str, Filter],
             kinds: Mapping[str, str]) -> EvaluateSettings:
    """Every default that depends on the inputs filled in and checked against them (``ks``,
    ``reference``, ``headline``, ``ablations``, ``ablation_k``)."""
    owner = "evaluate_run"
    sizes = [p.n for p in pools]
    ks = s.ks
    if ks is None:
        ks = list(range(2, min(sizes) + 1)) or [1]
    ks = sorted({check_positive_int(k, "ks", owner) for k in ks})
    too_big = [k for k in ks if k > min(sizes)]
    if too_big and s.small_pools == "error":
        small = sorted({p.instance_id for p in pools if p.n < max(too_big)})
        raise LatentSiftError(f"K={too_big} is larger than some pools ({len(small)} pool(s) have fewer "
                              f"candidates, smallest {min(sizes)}, e.g. {small[:3]!r}). Use K <= {min(sizes)}, "
                              "drop the small pools, or pass small_pools='drop' (--small-pools drop).")
    if max(ks) > max(sizes):
        raise LatentSiftError(f"K={max(ks)} is larger than every pool (largest {max(sizes)} candidates).")
    reference = s.reference
    if reference is None:
        efs = [n for n, k in kinds.items() if k == "ef"]
        reference = efs[0] if efs else None
    elif reference not in filters:
        raise param_error("reference", owner, f"one of the filters {sorted(filters)}", reference)
    ablations = dict(s.ablations or {})
    for tname, spec in ablations.items():
        bad = [f for f in spec.get("filters", []) if f not in filters]
        if bad or not spec.get("filters"):
            raise LatentSiftError(f"The ablation table {tname!r} names unknown filters {bad} (known: {sorted(filters)}).")
    in_ablation = {f for spec in ablations.values() for f in spec["filters"]}
    headline = s.headline
    if headline is None:
        firsts = {spec["filters"][0] for spec in ablations.values()}
        headline = [n for n in filters if n not in in_ablation or n == reference or n in firsts]
    else:
        bad = [h for h in headline if h not in filters]
        if bad:
            raise param_error("headline", owner, f"names of filters {sorted(filters)}", bad)
    ablation_k = s.ablation_k
    if ablation_k is None:
        ablation_k = max(ks)
    elif ablation_k not in ks:
        raise param_error("ablation_k", owner, f"one of ks {ks}", ablation_k)
    return replace(s, ks=ks, reference=reference, ablations=ablations, headline=headline, ablation_k=ablation_k)


class _Tally:
    """The draws' results, pool by pool: per K, per-instance arrays per metric per filter (``acc``),
    the ledger rows, the cascade's rule counts, failed EF calls and how each K was drawn."""

    def __init__(self, fnames: list[str], ks: Sequence[int]):
        self.fnames = fnames
        self.acc: dict[int, dict[str, Any]] = {
            k: {"inst": [], "pass": [], RANDOM_PICK: [], "best": {f: [] for f in fnames},
                "ret_num": {f: [] for f in fnames}, "ef": {f: [] for f in fnames},
                "testgen": {f: [] for f in fnames}, "reach3": {f: [] for f in fnames},
                "calls": {f: [] for f in fnames}} for k in ks}
        self.ledger: list[dict] = []
        self.rules: dict[str, dict[int, dict[str, Counter]]] = {
            f: {k: {"stage2": Counter(), "stage3": Counter(), "stage4": Counter()} for k in ks} for f in fnames}
        self.fail_calls = {f: {k: 0 for k in ks} for f in fnames}
        self.draws_info = {k: {"exact": 0, "sampled": 0, "n_draws": 0} for k in ks}

    def add_pool(self, pool: PoolSpec, filters: Mapping[str, Filter], kinds: Mapping[str, str],
                 records: Mapping[str, CandidateRecord], final_verifier: VerifierTable | None,
                 s: EvaluateSettings) -> None:
        """Every K of one pool: the same draws for every filter."""
        ids = list(pool.traj_ids)
        labels = [records[t].label for t in ids]
        priorities = {f: (pool_priority(ids, stage1_scores(filters[f], kinds[f], ids, pool.instance_id), seed=s.seed)
                          if kinds[f] in ("table", "ef") else None) for f in self.fnames}
        for k in s.ks:
            if k > pool.n:
                continue
            subsets, was_exact = draw_subsets(pool.n, k, s.n_draws, instance_seed(s.seed, k, pool.instance_id),
                                              exact=s.exact)
            self.draws_info[k]["exact" if was_exact else "sampled"] += 1
            self.draws_info[k]["n_draws"] += len(subsets)
            nd = len(subsets)
            a = self.acc[k]
            a["inst"].append(pool.instance_id)
            solvable = [any(labels[i] for i in d) for d in subsets]
            a["pass"].append(sum(solvable) / nd)
            a[RANDOM_PICK].append(sum(sum(labels[i] for i in d) / k for d in subsets) / nd)
            for f in self.fnames:
                tot = self._draws(pool, k, f, subsets, solvable, filters, kinds, priorities[f], records,
                                  final_verifier, s)
                for key, metric in (("best", "best"), ("ret", "ret_num"), ("ef", "ef"), ("testgen", "testgen"),
                                    ("reach", "reach3"), ("calls", "calls")):
                    a[metric][f].append(tot[key] / nd)
                self.ledger.append({"instance_id": pool.instance_id, "k": k, "filter": f, "n_draws": nd,
                                    "exact": was_exact, "best": tot["best"] / nd, "pass": sum(solvable) / nd,
                                    "retained_solvable": tot["ret"] / nd, "ef_tokens": tot["ef"] / nd,
                                    "ef_calls": tot["calls"] / nd, "testgen_tokens": tot["testgen"] / nd,
                                    "stage3_rate": tot["reach"] / nd})

    def _draws(self, pool: PoolSpec, k: int, f: str, subsets, solvable, filters, kinds, prio, records,
               final_verifier, s: EvaluateSettings) -> dict[str, float]:
        """One filter on every draw of one (pool, K): the sums over draws of each metric."""
        ids = list(pool.traj_ids)
        has_gen = any(records[t].gen_test is not None for t in ids)
        rule = FixedKeep(s.min_keep, s.keep_frac, s.seed)  # Stage 1's keep rule (``sift.keep``)
        r_keep = rule.count(k)
        tot = {"best": 0.0, "ret": 0.0, "ef": 0.0, "testgen": 0.0, "reach": 0.0, "calls": 0.0}
        r = self.rules[f][k]
        kind = kinds[f]
        verifier = filters[f] if kind == "ef" else final_verifier
        for d, sub in enumerate(subsets):
            drawn = [ids[i] for i in sub]
            if kind == "none":
                s1 = drawn
            elif kind == "callable" or r_keep is None:
                s1 = stage1_retain(drawn, stage1_scores(filters[f], kind, drawn, pool.instance_id), rule=rule)
            else:  # a count fixed by K, rank-invariant: top r of the draw in the pool-wide order
                keep = set(sorted(drawn, key=prio.__getitem__)[:r_keep])
                s1 = [t for t in drawn if t in keep]
            out = after_stage1(drawn, s1, records, verifier, kind == "ef",
                               instance_id=pool.instance_id, has_gen=has_gen,
                               testgen_tokens=pool.testgen_tokens, seed=s.seed, tie=s.tie,
                               missing=s.missing, stop_when_single=s.stop_when_single,
                               draw_key=f"{k}/{d}")
            tot["best"] += out.value
            if solvable[d] and any(records[t].label for t in out.stage1):
                tot["ret"] += 1
            tot["ef"] += out.ef_tokens
            tot["testgen"] += out.testgen_tokens
            tot["reach"] += out.stage3_reached
            tot["calls"] += len(out.ef_calls)
            r["stage2"][out.stage2_rule] += 1
            r["stage3"][out.stage3_rule] += 1
            r["stage4"][out.stage4_rule] += 1
            self.fail_calls[f][k] += len(out.failures)
        return tot


def _aggregate(tally: _Tally, s: EvaluateSettings) -> tuple[dict, dict, dict, dict]:
    """Best@K, retention and tokens per K over instances, with the same paired bootstrap resamples for
    every filter and metric; and the number of instances per K."""
    fnames, reference, level = tally.fnames, s.reference, s.ci_level
    best_at_k: dict[str, Any] = {"oracle_pass": {}, RANDOM_PICK: {}, "filters": {f: {} for f in fnames}}
    retention: dict[str, dict] = {f: {} for f in fnames}
    tokens: dict[str, Any] = {"workflows": {f: {} for f in fnames}, "savings": {}, "reference": reference}
    n_by_k = {}
    for k in s.ks:
        a = tally.acc[k]
        n_i = len(a["inst"])
        n_by_k[k] = n_i
        boot = bootstrap_indices(n_i, s.n_boot, np.random.default_rng([int(s.seed), int(k), 7]))
        best_at_k["oracle_pass"][k] = mean_ci(np.array(a["pass"]), boot, level)
        best_at_k[RANDOM_PICK][k] = mean_ci(np.array(a[RANDOM_PICK]), boot, level)
        for f in fnames:
            best_at_k["filters"][f][k] = mean_ci(np.array(a["best"][f]), boot, level)
            retention[f][k] = ratio_ci(np.array(a["ret_num"][f]), np.array(a["pass"]), boot, level)
            ef, tg = np.array(a["ef"][f]), np.array(a["testgen"][f])
            tokens["workflows"][f][k] = {
                "ef": mean_ci(ef, boot, level), "testgen": mean_ci(tg, boot, level),
                "total": mean_ci(ef + tg, boot, level),
                "stage3_rate": mean_ci(np.array(a["reach3"][f]), boot, level),
                "ef_calls": float(np.mean(a["calls"][f])),
            }
        if reference is not None:
            ref_ef, ref_tot = np.array(a["ef"][reference]), np.array(a["ef"][reference]) + np.array(a["testgen"][reference])
            for f in fnames:
                if f == reference:
                    continue
                ef = np.array(a["ef"][f])
                tokens["savings"].setdefault(f, {})[k] = {
                    "ef": saving_ci(ref_ef, ef, boot, level),
                    "total": saving_ci(ref_tot, ef + np.array(a["testgen"][f]), boot, level)}
    return best_at_k, retention, tokens, n_by_k


def _ablation_tables(s: EvaluateSettings, best_at_k: dict, retention: dict) -> dict:
    out = {}
    for tname, spec in s.ablations.items():
        labels_map = dict(spec.get("labels", {}))
        out[tname] = {
            "title": spec.get("title", tname), "k": s.ablation_k, "layout": spec.get("layout", "rows"),
            "rows": [{"filter": f, "label": labels_map.get(f, (s.names or {}).get(f, f)),
                      "best_at_k": best_at_k["filters"][f][s.ablation_k], "retention": retention[f][s.ablation_k]}
                     for f in spec["filters"]]}
    return out


def _pools_info(pools: Sequence[PoolSpec], records: Mapping[str, CandidateRecord], all_ids: set[str],
                n_by_k: dict, draws_info: dict, ks: Sequence[int]) -> dict:
    sizes = [p.n for p in pools]
    all_labels = [records[t].label for p in pools for t in p.traj_ids]
    per_pool_pos = [sum(records[t].label for t in p.traj_ids) for p in pools]
    return {
        "n_instances": len(pools), "n_candidates": len(all_ids), "n_resolved_candidates": int(sum(all_labels)),
        "pool_sizes": {str(n): c for n, c in sorted(Counter(sizes).items())},
        "n_resolved_any": int(sum(1 for c in per_pool_pos if c > 0)),
        "n_resolved_all": int(sum(1 for c, p in zip(per_pool_pos, pools) if c == p.n)),
        "n_mixed": int(sum(1 for c, p in zip(per_pool_pos, pools) if 0 < c < p.n)),
        "n_with_regression": int(sum(1 for t in all_ids if records[t].regression is not None)),
        "n_with_gen_test": int(sum(1 for t in all_ids if records[t].gen_test is not None)),
        "n_pools_with_testgen_cost": int(sum(1 for p in pools if p.testgen_tokens is not None)),
        "ks": list(ks), "n_instances_by_k": n_by_k, "draws": draws_info,
    }


def _verifier_diag(table: VerifierTable) -> dict:
    vals = list(table.values())
    failed = [v for v in vals if v.score is None]
    return {"n_results": len(vals), "n_failed": len(failed),
            "failed": sorted(v.traj_id for v in failed)[:50],
            "mean_tokens": float(np.mean([v.n_in + v.n_out for v in vals])) if vals else None,
            "n_condensed": int(sum(1 for v in vals if getattr(v, "n_condensed", 0))),
            "n_patch_cut": int(sum(1 for v in vals if (getattr(v, "condensed", None) or {}).get("patch")))}


def _distributions(distributions, pools, records, dist_instances, seed) -> dict:
    if not distributions:
        return {}
    inst = sorted(p.instance_id for p in pools)
    if dist_instances is not None and dist_instances < len(inst):
        rng = np.random.default_rng([int(seed), 11])
        inst = sorted(rng.choice(inst, size=int(dist_instances), replace=False).tolist())
    chosen = {t for p in pools if p.instance_id in set(inst) for t in p.traj_ids}
    out = {}
    for panel, table in distributions.items():
        unknown = [t for t in table if t not in records]
        if unknown:
            raise LatentSiftError(f"The distribution panel {panel!r} names candidates in no pool, e.g. {unknown[:3]!r}.")
        res = [float(v) for t, v in sorted(table.items()) if t in chosen and v is not None
               and math.isfinite(float(v)) and records[t].label == 1]
        unr = [float(v) for t, v in sorted(table.items()) if t in chosen and v is not None
               and math.isfinite(float(v)) and records[t].label == 0]
        n_missing = sum(1 for t in chosen if t not in table or table[t] is None or not math.isfinite(float(table[t])))
        out[panel] = {"resolved": res, "unresolved": unr, "n_missing": n_missing,
                      "mean_resolved": float(np.mean(res)) if res else None,
                      "mean_unresolved": float(np.mean(unr)) if unr else None}
    return {"n_instances": len(inst), "panels": out}
