"""The evaluation's file formats (docs/evaluation.md): POOLS.jsonl (pools with each candidate's
outcome) and score files (``scores.jsonl``, one score per candidate), read strictly (errors name file,
line and field) and written atomically; and pools built from canonical trajectories. ``evaluate_run``
(``evaluate``) checks every file it reads against the draws it feeds."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .._core.io import atomic_path, atomic_write_text, iter_jsonl, read_json
from .._core.manifests import VerifierManifest, check_manifest
from .._core.validation import LatentSiftError
from ..cascade.cascade import CandidateRecord, PoolSpec
from ..cascade.verifier import RESULTS_FILE, load_results


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


def check_gen_test_key(trajectories: Sequence, key: str | None, owner: str) -> None:
    """Refuse a ``--gen-test-key`` that no candidate's ``tests`` holds (Stage 3 would score nothing, silently),
    naming the keys they do hold."""
    if key is None or any(key in t.tests for t in trajectories):
        return
    held = sorted({k for t in trajectories for k in t.tests})
    raise LatentSiftError(f"{owner}: --gen-test-key {key!r}: no candidate's tests hold it (they hold "
                          f"{', '.join(map(repr, held)) or 'no key'}); pass one of those, or leave the option out.")


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
            man = check_manifest(read_json(p / "manifest.json"), VerifierManifest, p / "manifest.json",
                                 "write it again (docs/evaluation.md, 'Score inputs')")
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
