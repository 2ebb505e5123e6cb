"""Labels and per-candidate test results: ``candidates.csv`` and SWE-bench harness reports.

- ``candidates.csv`` (the shared dataset's table): one row per candidate, keyed by ``run`` and
  ``instance_id`` (a table without ``run``, e.g. ``instance_id,resolved``, keys by instance: each
  must be in one imported run); ``resolved`` (0/1) and the test counts ``f2p_passed``, ``f2p_total``,
  ``p2p_passed``, ``p2p_total`` (an empty cell = unknown, the key is left out).
- Run-level reports, applied to the trajectories in the same folder: SWE-agent's
  ``final_report.json`` / AutoCodeRover's ``report.json`` (``{"resolved": [ids], ...}``) and the
  SWE-bench harness summary ``<model>.<run_id>.json`` (``{"resolved_ids": [...],
  "unresolved_ids": [...], "completed_ids": [...], "empty_patch_ids": [...], "error_ids": [...]}``,
  ``swebench/harness/reporting.py``). An instance not in the resolved list is unresolved (reward 0);
  of a harness summary, only the instances it evaluated (completed, unresolved, empty patch) are
  labelled, ``error_ids`` (no usable report) and ``infra_failure_ids`` (the environment failed) stay
  unknown. Its run is the imported run whose name the file name ends with (``.<run_id>.json``).
- Per-instance harness reports (``logs/run_evaluation/<run>/<model>/<id>/report.json``:
  ``{id: {"resolved": bool, "tests_status": {"FAIL_TO_PASS": {"success": [...], "failure": [...]},
  "PASS_TO_PASS": {...}}}}``, ``get_eval_report`` of ``swebench/harness/grading.py``): reward and the
  four test counts; an entry with ``"infra_failure": true`` (the environment failed) stays unknown.
  Its run is the imported run named ``<run>`` (the harness's ``run_id``).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any

from ._common import RecordError

TEST_KEYS = ("f2p_passed", "f2p_total", "p2p_passed", "p2p_total")


@dataclass
class LabelRow:
    resolved: int | None
    tests: dict[str, int]
    where: str


@dataclass
class Report:
    """A run-level list of resolved ids, or per-instance results."""

    source: str
    group: str
    resolved: set[str] | None = None              # run-level
    covered: set[str] | None = None               # ids the run-level report evaluated (None = all)
    per_instance: dict[str, tuple[float, dict[str, int]]] = field(default_factory=dict)
    # the run the harness evaluated: ``run_id`` of ``logs/run_evaluation/<run_id>/<model>/<id>/report.json``
    # (``harness_run``), or, of a run report ``<model>.<run_id>.json`` (``run_report``), the file name
    # to end in ``.<run>.json``
    harness_run: str | None = None
    run_report: bool = False


def read_candidates_csv(text: str, source: str) -> dict[tuple[str | None, str], LabelRow]:
    """Rows keyed by (run, instance_id); run is None in a table without a ``run`` column (each
    instance then names the one imported run that holds it)."""
    reader = csv.DictReader(io.StringIO(text))
    cols = reader.fieldnames or []
    if "instance_id" not in cols:
        raise RecordError(source, 1, "instance_id", "column is missing from the CSV header")
    has_run = "run" in cols
    rows: dict[tuple[str | None, str], LabelRow] = {}
    for lineno, row in enumerate(reader, 2):
        key = (row["run"] if has_run else None, row["instance_id"])
        if has_run and not key[0] or not key[1]:
            raise RecordError(source, lineno, "run" if has_run and not key[0] else "instance_id", "is empty")
        if key in rows:
            raise RecordError(source, lineno, "instance_id",
                              f"duplicate row for run {key[0]!r}" if has_run else f"duplicate row for {key[1]!r}")
        resolved = None
        if row.get("resolved", "") not in ("", None):
            if row["resolved"] not in ("0", "1"):
                raise RecordError(source, lineno, "resolved", f"must be 0, 1 or empty, got {row['resolved']!r}")
            resolved = int(row["resolved"])
        tests: dict[str, int] = {}
        for k in TEST_KEYS:
            v = row.get(k, "")
            if v in ("", None):
                continue
            if not v.isdigit():
                raise RecordError(source, lineno, k, f"must be a non-negative integer or empty, got {v!r}")
            tests[k] = int(v)
        rows[key] = LabelRow(resolved, tests, f"{source}:{lineno}")
    return rows


def is_candidates_csv(text: str) -> bool:
    """A header with ``instance_id`` and ``run`` or ``resolved``."""
    head = [c.strip() for c in text.split("\n", 1)[0].split(",")]
    return "instance_id" in head and ("run" in head or "resolved" in head)


def parse_report(obj: Any, source: str, group: str) -> Report | None:
    """A ``Report`` when ``obj`` has one of the report shapes, else None."""
    if not isinstance(obj, dict) or not obj:
        return None
    for key in ("resolved_ids", "resolved"):
        if isinstance(obj.get(key), list):
            ids = _id_set(obj, key, source)
            covered = None
            if "completed_ids" in obj or "unresolved_ids" in obj:
                # the harness: completed (its resolved and unresolved, and those whose report was
                # empty or broken: error_ids) and empty patches (counted unresolved); errors unknown
                # (schema 2: those whose failure it blames on the environment, infra_failure_ids, unknown)
                covered = (_id_set(obj, "completed_ids", source) | _id_set(obj, "unresolved_ids", source) | ids
                           | _id_set(obj, "empty_patch_ids", source)) - _id_set(obj, "error_ids", source) \
                    - _id_set(obj, "infra_failure_ids", source)
            return Report(source, group, resolved=ids, covered=covered, run_report=covered is not None)
    if all(isinstance(v, dict) and "resolved" in v for v in obj.values()):
        per: dict[str, tuple[float, dict[str, int]]] = {}
        for iid, v in obj.items():
            if v.get("infra_failure") is True:
                continue   # the harness blames the environment, not the patch: unknown
            if not isinstance(v["resolved"], bool):
                raise RecordError(source, None, f"{iid}.resolved", "must be true or false")
            tests: dict[str, int] = {}
            ts = v.get("tests_status")
            if ts is not None:
                if not isinstance(ts, dict):
                    raise RecordError(source, None, f"{iid}.tests_status", "must be an object")
                for name, short in (("FAIL_TO_PASS", "f2p"), ("PASS_TO_PASS", "p2p")):
                    if name in ts:
                        st = ts[name]
                        if not (isinstance(st, dict) and isinstance(st.get("success"), list)
                                and isinstance(st.get("failure"), list)):
                            raise RecordError(source, None, f"{iid}.tests_status.{name}",
                                              "must have 'success' and 'failure' lists")
                        tests[f"{short}_passed"] = len(st["success"])
                        tests[f"{short}_total"] = len(st["success"]) + len(st["failure"])
            per[iid] = (float(v["resolved"]), tests)
        return Report(source, group, per_instance=per)
    return None


def _id_set(obj: dict, key: str, source: str) -> set[str]:
    """``obj[key]`` as a set of instance ids (empty when absent)."""
    ids = obj.get(key, [])
    if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise RecordError(source, None, key, "must be a list of instance ids (strings)")
    return set(ids)
