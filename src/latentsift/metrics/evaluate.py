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

The draws and bootstrap intervals live in ``latentsift.metrics.bootstrap`` (shared with the diagnostics,
pruning, transfer and guard evaluations). Length: about 640 lines, one module because its file
formats (pools, scores) and ``evaluate_run`` are one contract: every file it reads is checked
against the draws it feeds.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .._core.validation import LatentSiftError, check_choice, check_positive_int, param_error
from .._core.io import atomic_path, atomic_write_text, iter_jsonl, jsonable
from ..cascade.cascade import (MISSING_RULES, TIE_RULES, CandidateRecord, Filter, PoolSpec, VerifierTable,
                      after_stage1, filter_kind, pool_priority, saving, stage1_retain, stage1_scores)
from ..sift.retain import KEEP_FRAC, MIN_KEEP, retain_count
from .bootstrap import (CI_LEVEL, N_BOOT, bootstrap_indices, bootstrap_weights, draw_subsets, instance_seed,
                        mean_ci, ratio_ci)
from ..cascade.verifier import RESULTS_FILE, load_results

N_DRAWS = 200       # paper: 200 seeded draws per K
SMALL_POOL_RULES = ("error", "drop")


# ----------------------------------------------------------------------------- pools on disk

def load_pool_file(path: str | Path) -> tuple[list[PoolSpec], dict[str, CandidateRecord]]:
    """Read POOLS.jsonl: one pool per line (format in docs/evaluation.md). Strict: errors name
    file, line and field; a missing label, a duplicate traj_id or a foreign instance id is an error."""
    path = Path(path)
    if not path.is_file():
        raise LatentSiftError(f"No such pools file: {str(path)!r}.")
    pools: list[PoolSpec] = []
    records: dict[str, CandidateRecord] = {}
    seen_inst: set[str] = set()
    for where, d in iter_jsonl(path):
        pool, recs = _pool_from_dict(d, where)
        if pool.instance_id in seen_inst:
            raise LatentSiftError(f"{where}: instance {pool.instance_id!r} appears on two lines.")
        seen_inst.add(pool.instance_id)
        for r in recs:
            if r.traj_id in records:
                raise LatentSiftError(f"{where}: duplicate traj_id {r.traj_id!r}.")
            records[r.traj_id] = r
        pools.append(pool)
    if not pools:
        raise LatentSiftError(f"{path}: no pools.")
    return pools, records


def _num_or_none(v: Any, where: str, name: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise LatentSiftError(f"{where}: field {name!r} must be a finite number or null. Got {v!r} instead.")
    return float(v)


def _pool_from_dict(d: Any, where: str) -> tuple[PoolSpec, list[CandidateRecord]]:
    if not isinstance(d, dict):
        raise LatentSiftError(f"{where}: a pool line must be a JSON object.")
    extra = set(d) - {"instance_id", "testgen_tokens", "candidates"}
    if extra:
        raise LatentSiftError(f"{where}: unknown field(s) {sorted(extra)} in a pool.")
    iid = d.get("instance_id")
    if not isinstance(iid, str) or not iid:
        raise LatentSiftError(f"{where}: field 'instance_id' must be a non-empty string.")
    cands = d.get("candidates")
    if not isinstance(cands, list) or not cands:
        raise LatentSiftError(f"{where}: field 'candidates' must be a non-empty list.")
    testgen = _num_or_none(d.get("testgen_tokens"), where, "testgen_tokens")
    recs = []
    for i, c in enumerate(cands):
        w = f"{where}: candidates[{i}]"
        if not isinstance(c, dict):
            raise LatentSiftError(f"{w}: must be a JSON object.")
        extra = set(c) - {"traj_id", "label", "regression", "gen_test"}
        if extra:
            raise LatentSiftError(f"{w}: unknown field(s) {sorted(extra)}.")
        tid = c.get("traj_id")
        if not isinstance(tid, str) or not tid:
            raise LatentSiftError(f"{w}: field 'traj_id' must be a non-empty string.")
        label = c.get("label")
        if label is None:
            raise LatentSiftError(f"{w}: candidate {tid!r} has no label (field 'label' is missing or "
                                  "null); every candidate of an evaluation pool needs its outcome.")
        if isinstance(label, bool) or label not in (0, 1):
            raise LatentSiftError(f"{w}: field 'label' of {tid!r} must be 0 or 1. Got {label!r} instead.")
        recs.append(CandidateRecord(tid, iid, int(label), _num_or_none(c.get("regression"), w, "regression"),
                                    _num_or_none(c.get("gen_test"), w, "gen_test")))
    return PoolSpec(iid, tuple(r.traj_id for r in recs), testgen), recs


def save_pool_file(pools: Sequence[PoolSpec], records: Mapping[str, CandidateRecord], path: str | Path) -> Path:
    """Write POOLS.jsonl atomically (the format :func:`load_pool_file` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for p in pools:
            cands = [{"traj_id": t, "label": records[t].label, "regression": records[t].regression,
                      "gen_test": records[t].gen_test} for t in p.traj_ids]
            f.write(json.dumps({"instance_id": p.instance_id, "testgen_tokens": p.testgen_tokens,
                                "candidates": cands}, ensure_ascii=False) + "\n")
    return path


def pools_from_trajectories(trajectories: Iterable, *, regression_key: str | None = "p2p_passed",
                            gen_test_key: str | None = None,
                            testgen_tokens: Mapping[str, float] | None = None,
                            ) -> tuple[list[PoolSpec], dict[str, CandidateRecord]]:
    """Pools and records from canonical trajectories: label = 1[reward >= 0.5]; regression count =
    ``traj.tests[regression_key]`` when present (never invented); pools sorted by instance id,
    candidates by traj_id. A trajectory without a reward is an error."""
    by: dict[str, list[CandidateRecord]] = {}
    for t in trajectories:
        if t.label is None:
            raise LatentSiftError(f"Trajectory {t.traj_id!r} has no reward: it cannot be evaluated.")
        reg = t.tests.get(regression_key) if regression_key else None
        gen = t.tests.get(gen_test_key) if gen_test_key else None
        by.setdefault(t.instance_id, []).append(CandidateRecord(
            t.traj_id, t.instance_id, int(t.label), None if reg is None else float(reg),
            None if gen is None else float(gen)))
    pools, records = [], {}
    for iid in sorted(by):
        recs = sorted(by[iid], key=lambda r: r.traj_id)
        for r in recs:
            if r.traj_id in records:
                raise LatentSiftError(f"Duplicate traj_id {r.traj_id!r}.")
            records[r.traj_id] = r
        cost = None if testgen_tokens is None else testgen_tokens.get(iid)
        pools.append(PoolSpec(iid, tuple(r.traj_id for r in recs), cost))
    return pools, records


# ----------------------------------------------------------------------------- score files

SCORES_FILE = "scores.jsonl"


@dataclass
class ScoreSet:
    """One ``--scores`` input: a Stage-1 filter (``kind="filter"``: ``scores`` maps traj_id ->
    float, ``components`` holds optional extra per-candidate values such as per-channel margins
    q_cot / q_obs / q_fn for the distribution figure) or EF-verifier results (``kind="ef"``:
    ``scores`` maps traj_id -> Verdict | VerifierFailure)."""

    name: str
    kind: str
    scores: dict
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    path: str = ""


def load_scores(path: str | Path, *, known_ids: Iterable[str] | None = None) -> ScoreSet:
    """Read one score input (format in docs/evaluation.md): a folder with ``manifest.json`` and
    ``scores.jsonl`` (filter) or ``verdicts.jsonl`` (EF verifier), or one such ``.jsonl`` file, or a
    ``.parquet`` table with columns ``traj_id``, ``score`` and optional numeric component columns.
    With ``known_ids``, a candidate id in no pool is an error naming file and line."""
    p = Path(path)
    if not p.exists():
        raise LatentSiftError(f"No such score file or folder: {str(p)!r}.")
    man: dict = {}
    if p.is_dir():
        if (p / "manifest.json").is_file():
            try:
                man = json.loads((p / "manifest.json").read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise LatentSiftError(f"{p / 'manifest.json'}: not valid JSON ({e.msg}).") from None
            if not isinstance(man, dict):
                raise LatentSiftError(f"{p / 'manifest.json'}: must be a JSON object. Got {type(man).__name__} "
                                      "instead.")
        files = [p / n for n in (SCORES_FILE, RESULTS_FILE, "scores.parquet") if (p / n).is_file()]
        if len(files) != 1:
            raise LatentSiftError(f"{p}: expected exactly one of {SCORES_FILE}, {RESULTS_FILE} or scores.parquet; "
                                  f"found {[f.name for f in files]}.")
        f = files[0]
    else:
        f = p
    name = str(man.get("name") or (p.name if p.is_dir() else p.stem))
    known = set(known_ids) if known_ids is not None else None
    if f.name == RESULTS_FILE or man.get("kind") == "ef":
        _, results, man2 = load_results(f)
        if known is not None:
            bad = sorted(t for t in results if t not in known)
            if bad:
                raise LatentSiftError(f"{f}: {len(bad)} candidate id(s) are in no pool, e.g. {bad[:3]!r}.")
        return ScoreSet(name, "ef", results, {}, man or man2, str(f))
    rows = _read_score_rows(f)
    scores: dict[str, float] = {}
    comps: dict[str, dict[str, float]] = {}
    for where, d in rows:
        if not isinstance(d, dict):
            raise LatentSiftError(f"{where}: a score row must be a JSON object.")
        t = d.get("traj_id")
        if not isinstance(t, str) or not t:
            raise LatentSiftError(f"{where}: field 'traj_id' must be a non-empty string.")
        if known is not None and t not in known:
            raise LatentSiftError(f"{where}: unknown candidate id {t!r} (it is in no pool).")
        if t in scores:
            raise LatentSiftError(f"{where}: duplicate traj_id {t!r}.")
        v = d.get("score")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise LatentSiftError(f"{where}: field 'score' of {t!r} must be a finite number. Got {v!r} instead.")
        scores[t] = float(v)
        if not isinstance(d.get("components") or {}, dict):
            raise LatentSiftError(f"{where}: field 'components' of {t!r} must be an object of numbers. "
                                  f"Got {d['components']!r} instead.")
        extra = dict(d.get("components") or {})
        extra.update({k: d[k] for k in d if k not in ("traj_id", "score", "components", "instance_id")})
        for k, x in extra.items():
            if x is None or (isinstance(x, float) and math.isnan(x)):
                continue  # a missing component (e.g. a channel with no state) is left out, not invented
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise LatentSiftError(f"{where}: component {k!r} of {t!r} must be a number or null. Got {x!r} instead.")
            comps.setdefault(k, {})[t] = float(x)
    if not scores:
        raise LatentSiftError(f"{f}: no scores.")
    return ScoreSet(name, "filter", scores, comps, man, str(f))


def _read_score_rows(f: Path) -> list[tuple[str, Any]]:
    if f.suffix == ".parquet":
        import pyarrow.parquet as pq
        table = pq.read_table(f)
        return [(f"{f}: row {i}", row) for i, row in enumerate(table.to_pylist())]
    rows = []
    with open(f, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{f}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise LatentSiftError(f"{f}:{lineno}: not valid JSON ({e.msg}).") from None
    return rows


def save_scores(scores: Mapping[str, float], out_dir: str | Path, *, name: str,
                components: Mapping[str, Mapping[str, float]] | None = None,
                manifest: Mapping[str, Any] | None = None) -> Path:
    """Write a filter's scores as a folder ``manifest.json`` + ``scores.jsonl`` (atomic)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    comps = components or {}
    lines = []
    for t in sorted(scores):
        row: dict[str, Any] = {"traj_id": t, "score": float(scores[t])}
        c = {k: float(v[t]) for k, v in comps.items() if t in v}
        if c:
            row["components"] = c
        lines.append(json.dumps(row, ensure_ascii=False))
    for fname, text in (("manifest.json", json.dumps({"kind": "filter", "name": name, **dict(manifest or {})},
                                                     indent=1, ensure_ascii=False) + "\n"),
                        (SCORES_FILE, "\n".join(lines) + "\n")):
        atomic_write_text(out / fname, text, fsync=False)
    return out


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


def evaluate_run(
    pools: Sequence[PoolSpec],
    filters: Mapping[str, Filter],
    records: Mapping[str, CandidateRecord],
    *,
    final_verifier: VerifierTable | None = None,
    ks: Sequence[int] | None = None,
    n_draws: int = N_DRAWS,
    seed: int = 0,
    tie: str = "mean",
    missing: str = "skip-stage",
    stop_when_single: bool = True,
    exact: bool = True,
    small_pools: str = "error",
    n_boot: int = N_BOOT,
    ci_level: float = CI_LEVEL,
    min_keep: int = MIN_KEEP,
    keep_frac: float = KEEP_FRAC,
    reference: str | None = None,
    headline: Sequence[str] | None = None,
    ablations: Mapping[str, Mapping[str, Any]] | None = None,
    ablation_k: int | None = None,
    distributions: Mapping[str, Mapping[str, float]] | None = None,
    dist_instances: int | None = None,
    names: Mapping[str, str] | None = None,
    meta: Mapping[str, Any] | None = None,
    progress=None,
) -> Summary:
    """Evaluate every Stage-1 filter through the cascade on the same draws (module docstring).

    ``filters``: name -> filter (``None`` = no filter, a score table, a callable
    ``score_draw(instance_id, traj_ids) -> {traj_id: score}`` called once per draw, or an EF
    verifier table = the *original* workflow, charged for all K and reused in Stage 4).
    ``final_verifier``: EF results used in Stage 4 by every non-EF filter.
    ``reference``: the workflow token savings are measured against (default: the first EF filter).
    ``headline``: filters shown in the main table and figures (default: those in no ablation, the
    reference, and the first filter of each ablation table, i.e. the full method).
    ``ablations``: table name -> ``{"title": str, "filters": [names], "layout": "rows"|"columns",
    "labels": {name: label}}``, reported at ``ablation_k`` (default: the largest K).
    ``distributions``: panel name -> {traj_id: value} for the score-distribution figure
    (resolved vs unresolved), over ``dist_instances`` instances drawn with ``seed`` (None = all).
    ``names``: display names of filters. ``meta``: free-form run information kept in settings.
    ``progress``: optional callable(done, total) called after each instance.
    """
    owner = "evaluate_run"
    check_choice(tie, "tie", owner, TIE_RULES)
    check_choice(missing, "missing", owner, MISSING_RULES)
    check_choice(small_pools, "small_pools", owner, SMALL_POOL_RULES)
    n_draws = check_positive_int(n_draws, "n_draws", owner)
    n_boot = check_positive_int(n_boot, "n_boot", owner)
    if not 0 < ci_level < 1:
        raise param_error("ci_level", owner, "a float in (0, 1)", ci_level)
    kinds, all_ids = _check_inputs(pools, records, filters, final_verifier)
    sizes = [p.n for p in pools]
    if ks is None:
        ks = list(range(2, min(sizes) + 1)) or [1]
    ks = sorted({check_positive_int(k, "ks", owner) for k in ks})
    too_big = [k for k in ks if k > min(sizes)]
    if too_big and small_pools == "error":
        small = sorted({p.instance_id for p in pools if p.n < max(too_big)})
        raise LatentSiftError(f"K={too_big} is larger than some pools ({len(small)} pool(s) have fewer "
                              f"candidates, smallest {min(sizes)}, e.g. {small[:3]!r}). Use K <= {min(sizes)}, "
                              "drop the small pools, or pass small_pools='drop' (--small-pools drop).")
    if max(ks) > max(sizes):
        raise LatentSiftError(f"K={max(ks)} is larger than every pool (largest {max(sizes)} candidates).")
    if reference is None:
        efs = [n for n, k in kinds.items() if k == "ef"]
        reference = efs[0] if efs else None
    elif reference not in filters:
        raise param_error("reference", owner, f"one of the filters {sorted(filters)}", reference)
    ablations = dict(ablations or {})
    for tname, spec in ablations.items():
        bad = [f for f in spec.get("filters", []) if f not in filters]
        if bad or not spec.get("filters"):
            raise LatentSiftError(f"The ablation table {tname!r} names unknown filters {bad} (known: {sorted(filters)}).")
    in_ablation = {f for spec in ablations.values() for f in spec["filters"]}
    if headline is None:
        firsts = {spec["filters"][0] for spec in ablations.values()}
        headline = [n for n in filters if n not in in_ablation or n == reference or n in firsts]
    else:
        bad = [h for h in headline if h not in filters]
        if bad:
            raise param_error("headline", owner, f"names of filters {sorted(filters)}", bad)
    if ablation_k is None:
        ablation_k = max(ks)
    elif ablation_k not in ks:
        raise param_error("ablation_k", owner, f"one of ks {ks}", ablation_k)

    fnames = list(filters)
    # per K: arrays (n_inst,) per metric per filter, built instance by instance
    acc: dict[int, dict[str, Any]] = {}
    ledger: list[dict] = []
    rules: dict[str, dict[int, dict[str, Counter]]] = {
        f: {k: {"stage2": Counter(), "stage3": Counter(), "stage4": Counter()} for k in ks} for f in fnames}
    fail_calls = {f: {k: 0 for k in ks} for f in fnames}
    draws_info = {k: {"exact": 0, "sampled": 0, "n_draws": 0} for k in ks}
    for k in ks:
        acc[k] = {"inst": [], "pass": [], "random": [], "best": {f: [] for f in fnames},
                  "ret_num": {f: [] for f in fnames}, "ef": {f: [] for f in fnames},
                  "testgen": {f: [] for f in fnames}, "reach3": {f: [] for f in fnames},
                  "calls": {f: [] for f in fnames}}
    for pi, pool in enumerate(pools):
        ids = list(pool.traj_ids)
        labels = [records[t].label for t in ids]
        has_gen = any(records[t].gen_test is not None for t in ids)
        priorities = {f: (pool_priority(ids, stage1_scores(filters[f], kinds[f], ids, pool.instance_id), seed=seed)
                          if kinds[f] in ("table", "ef") else None) for f in fnames}
        for k in ks:
            if k > pool.n:
                continue
            subsets, was_exact = draw_subsets(pool.n, k, n_draws, instance_seed(seed, k, pool.instance_id), exact=exact)
            draws_info[k]["exact" if was_exact else "sampled"] += 1
            draws_info[k]["n_draws"] += len(subsets)
            nd = len(subsets)
            a = acc[k]
            a["inst"].append(pool.instance_id)
            solvable = [any(labels[i] for i in s) for s in subsets]
            a["pass"].append(sum(solvable) / nd)
            a["random"].append(sum(sum(labels[i] for i in s) / k for s in subsets) / nd)
            r_keep = retain_count(k, min_keep, keep_frac)
            for f in fnames:
                tot = {"best": 0.0, "ret": 0.0, "ef": 0.0, "testgen": 0.0, "reach": 0.0, "calls": 0.0}
                r = rules[f][k]
                kind, prio = kinds[f], priorities[f]
                verifier = filters[f] if kind == "ef" else final_verifier
                for d, s in enumerate(subsets):
                    drawn = [ids[i] for i in s]
                    if kind == "none":
                        s1 = drawn
                    elif kind == "callable":
                        s1 = stage1_retain(drawn, stage1_scores(filters[f], kind, drawn, pool.instance_id),
                                           seed=seed, min_keep=min_keep, keep_frac=keep_frac)
                    else:  # rank-invariant: top r of the draw in the pool-wide order
                        keep = set(sorted(drawn, key=prio.__getitem__)[:r_keep])
                        s1 = [t for t in drawn if t in keep]
                    out = after_stage1(drawn, s1, records, verifier, kind == "ef",
                                       instance_id=pool.instance_id, has_gen=has_gen,
                                       testgen_tokens=pool.testgen_tokens, seed=seed, tie=tie,
                                       missing=missing, stop_when_single=stop_when_single,
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
                    fail_calls[f][k] += len(out.failures)
                a["best"][f].append(tot["best"] / nd)
                a["ret_num"][f].append(tot["ret"] / nd)
                a["ef"][f].append(tot["ef"] / nd)
                a["testgen"][f].append(tot["testgen"] / nd)
                a["reach3"][f].append(tot["reach"] / nd)
                a["calls"][f].append(tot["calls"] / nd)
                ledger.append({"instance_id": pool.instance_id, "k": k, "filter": f, "n_draws": nd,
                               "exact": was_exact, "best": tot["best"] / nd, "pass": sum(solvable) / nd,
                               "retained_solvable": tot["ret"] / nd, "ef_tokens": tot["ef"] / nd,
                               "ef_calls": tot["calls"] / nd, "testgen_tokens": tot["testgen"] / nd,
                               "stage3_rate": tot["reach"] / nd})
        if progress is not None:
            progress(pi + 1, len(pools))

    # aggregate with paired bootstrap per K
    best_at_k: dict[str, Any] = {"oracle_pass": {}, "random": {}, "filters": {f: {} for f in fnames}}
    retention: dict[str, dict] = {f: {} for f in fnames}
    tokens: dict[str, Any] = {"workflows": {f: {} for f in fnames}, "savings": {}, "reference": reference}
    n_by_k = {}
    for k in ks:
        a = acc[k]
        n_i = len(a["inst"])
        n_by_k[k] = n_i
        boot = bootstrap_indices(n_i, n_boot, np.random.default_rng([int(seed), int(k), 7]))
        best_at_k["oracle_pass"][k] = mean_ci(np.array(a["pass"]), boot, ci_level)
        best_at_k["random"][k] = mean_ci(np.array(a["random"]), boot, ci_level)
        for f in fnames:
            best_at_k["filters"][f][k] = mean_ci(np.array(a["best"][f]), boot, ci_level)
            retention[f][k] = ratio_ci(np.array(a["ret_num"][f]), np.array(a["pass"]), boot, ci_level)
            ef, tg = np.array(a["ef"][f]), np.array(a["testgen"][f])
            tokens["workflows"][f][k] = {
                "ef": mean_ci(ef, boot, ci_level), "testgen": mean_ci(tg, boot, ci_level),
                "total": mean_ci(ef + tg, boot, ci_level),
                "stage3_rate": mean_ci(np.array(a["reach3"][f]), boot, ci_level),
                "ef_calls": float(np.mean(a["calls"][f])),
            }
        if reference is not None:
            ref_ef, ref_tot = np.array(a["ef"][reference]), np.array(a["ef"][reference]) + np.array(a["testgen"][reference])
            for f in fnames:
                if f == reference:
                    continue
                ef = np.array(a["ef"][f])
                tokens["savings"].setdefault(f, {})[k] = {
                    "ef": saving_ci(ref_ef, ef, boot, ci_level),
                    "total": saving_ci(ref_tot, ef + np.array(a["testgen"][f]), boot, ci_level)}

    abl_out = {}
    for tname, spec in ablations.items():
        labels_map = dict(spec.get("labels", {}))
        abl_out[tname] = {
            "title": spec.get("title", tname), "k": ablation_k, "layout": spec.get("layout", "rows"),
            "rows": [{"filter": f, "label": labels_map.get(f, (names or {}).get(f, f)),
                      "best_at_k": best_at_k["filters"][f][ablation_k], "retention": retention[f][ablation_k]}
                     for f in spec["filters"]]}

    all_labels = [records[t].label for p in pools for t in p.traj_ids]
    per_pool_pos = [sum(records[t].label for t in p.traj_ids) for p in pools]
    pools_info = {
        "n_instances": len(pools), "n_candidates": len(all_ids), "n_resolved_candidates": int(sum(all_labels)),
        "pool_sizes": {str(s): c for s, c in sorted(Counter(sizes).items())},
        "n_resolved_any": int(sum(1 for c in per_pool_pos if c > 0)),
        "n_resolved_all": int(sum(1 for c, p in zip(per_pool_pos, pools) if c == p.n)),
        "n_mixed": int(sum(1 for c, p in zip(per_pool_pos, pools) if 0 < c < p.n)),
        "n_with_regression": int(sum(1 for t in all_ids if records[t].regression is not None)),
        "n_with_gen_test": int(sum(1 for t in all_ids if records[t].gen_test is not None)),
        "n_pools_with_testgen_cost": int(sum(1 for p in pools if p.testgen_tokens is not None)),
        "ks": list(ks), "n_instances_by_k": n_by_k, "draws": draws_info,
    }
    diagnostics = {
        "rules": {f: {k: {st: dict(c) for st, c in rules[f][k].items()} for k in ks} for f in fnames},
        "ef_failed_calls": fail_calls,
        "final_verifier": _verifier_diag(final_verifier) if final_verifier is not None else None,
        "ef_filters": {f: _verifier_diag(filters[f]) for f in fnames if kinds[f] == "ef"},
    }
    settings = {
        "n_draws": n_draws, "seed": seed, "tie": tie, "missing": missing, "stop_when_single": stop_when_single,
        "exact": exact, "small_pools": small_pools, "n_boot": n_boot, "ci_level": ci_level,
        "min_keep": min_keep, "keep_frac": keep_frac, "ks": list(ks), "ablation_k": ablation_k,
        "reference": reference, "headline": list(headline), "filters": fnames, "filter_kinds": kinds,
        "names": {f: (names or {}).get(f, f) for f in fnames}, "meta": dict(meta or {}),
    }
    data = {"settings": settings, "pools": pools_info, "retention": retention, "best_at_k": best_at_k,
            "tokens": tokens, "ablations": abl_out, "diagnostics": diagnostics,
            "distributions": _distributions(distributions, pools, records, dist_instances, seed)}
    return Summary(data=data, ledger=ledger)


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
