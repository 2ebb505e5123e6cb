"""``import_paths``: any supported input -> canonical trajectories, labels and an import summary."""
from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from .._core.validation import LatentSiftError, check_choice
from .trajectory import Pool, Trajectory, group_pools
from . import _canonical, _chat, _openhands, _r2egym, _sweagent, _sweagent1  # noqa: F401 (each registers its format)
from ._common import RecordError, Where
from ._labels import LabelRow, Report, is_candidates_csv, parse_report, read_candidates_csv
from ._registry import described, format_names, importers
from ._sources import Source, iter_sources

#: The ``import --format`` names of the package's own importers, ``auto`` first (plugins left out).
FORMATS = format_names(plugins=False)  # the package's own formats (``_registry``), "auto" first
# Runs whose trajectories contain the evaluation outcome (dataset README caveat). Any AutoCodeRover
# run whose harness replies report the test outcome is marked too (LEAK_MARKERS).
KNOWN_LEAKING_RUNS = frozenset({"acr-val-only", "acr-val-sbfl"})
LEAK_MARKERS = ("Written a patch that resolves the issue", "Written an applicable patch, but it did not resolve")


@dataclass
class SkippedRecord:
    """A record (file, or JSONL line) that was not imported, and why."""

    source: str
    line: int | None
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: " + (f"field {self.field!r}: " if self.field else "") + self.reason


@dataclass
class ImportSummary:
    """What an import read: counts of trajectories, instances, steps and labels, per run and per file, and what
    was skipped or warned about (``latentsift import`` prints it; ``to_dict`` is its JSON)."""

    n_trajectories: int
    n_instances: int
    n_steps: int
    candidates_per_instance: dict[int, int]
    labels: dict[str, int]
    runs: dict[str, dict[str, Any]]
    files: dict[str, int]
    leaking_runs: list[str]
    skipped_records: list[SkippedRecord]
    skipped_files: list[tuple[str, str]]
    warnings: list[str]
    label_files: dict[str, int] = field(default_factory=dict)  # label file -> trajectories it labelled
    # what the import inferred and from where: ids and runs from names, the run each report labels
    inferred: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["skipped_records"] = [s.__dict__ for s in self.skipped_records]
        d["skipped_files"] = [{"file": f, "reason": r} for f, r in self.skipped_files]
        return d

    def to_text(self) -> str:
        out = [f"{self.n_trajectories} trajectories (candidates), {self.n_instances} instances, "
               f"{self.n_steps} steps",
               "candidates per instance: " + ", ".join(f"{k}: {n} instances"
                                                       for k, n in sorted(self.candidates_per_instance.items())),
               "labels: " + ", ".join(f"{k} {v}" for k, v in self.labels.items()),
               "files read: " + ", ".join(f"{k} {v}" for k, v in sorted(self.files.items()))]
        out += [f"labels from {f}: {n} of {self.n_trajectories} trajectories" for f, n in self.label_files.items()]
        out += [f"inferred: {line}" for line in self.inferred]
        out.append(f"{'run':<16} {'agent':<10} {'cands':>5} {'resolved':>8} {'unres':>6} {'unknown':>7} "
                   f"{'steps med(max)':>14}")
        for run, r in sorted(self.runs.items()):
            out.append(f"{run:<16} {r['agent']:<10} {r['candidates']:>5} {r['resolved']:>8} {r['unresolved']:>6} "
                       f"{r['unknown']:>7} {r['steps_median']:>9g} ({r['steps_max']})"
                       + ("  LEAKS LABEL" if r["leaks_label"] else ""))
        if self.leaking_runs:
            out.append("runs marked leaks_label (their trajectories contain the test outcome; mask or drop them "
                       "when scoring from trajectory text): " + ", ".join(self.leaking_runs))
        for w in self.warnings:
            out.append(f"warning: {w}")
        if self.skipped_files:
            out.append(f"{len(self.skipped_files)} file(s) not read:")
            out += [f"  {f}: {r}" for f, r in self.skipped_files]
        if self.skipped_records:
            out.append(f"{len(self.skipped_records)} record(s) skipped:")
            out += [f"  {s}" for s in self.skipped_records]
        return "\n".join(out)


@dataclass
class ImportResult:
    """What ``import_paths`` returns: the trajectories read, their summary and the records skipped."""

    trajectories: list[Trajectory]
    summary: ImportSummary
    skipped: list[SkippedRecord] = field(default_factory=list)

    @property
    def pools(self) -> list[Pool]:
        return group_pools(self.trajectories)


def import_paths(paths: str | Path | Iterable[str | Path], format: str = "auto",
                 labels: str | Path | Iterable[str | Path] | None = None,
                 skip_bad: bool = False, scaffold: str | None = None) -> ImportResult:
    """Read trajectories from files, folders, ``.gz`` files and ``.tar.gz`` archives.

    ``format`` forces one parser for every trajectory file (``auto`` detects it from the content).
    ``labels``: ``candidates.csv`` file(s) or harness report(s) applied after import. Label files and
    run-level reports found among ``paths`` are applied to the trajectories beside them.
    With ``skip_bad`` a record that cannot be imported is reported in ``skipped`` (file, line,
    field, reason) instead of raising; nothing is dropped without a record of it.

    The scaffold the shift guard compares (``shift.scaffold_of``) is the trajectory's agent as read
    from each record (an R2E-Gym record's ``agent_args.scaffold``, SWE-agent's own format, a chat
    log's agent field or file name), never the file format; ``scaffold`` names it for every imported
    trajectory instead (recorded as ``meta["scaffold"]``).
    """
    check_choice(format, "format", "import_paths", format_names())
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise LatentSiftError("The 'paths' parameter of import_paths must name at least one input. Got [] instead.")
    label_paths = [] if labels is None else ([labels] if isinstance(labels, (str, Path)) else list(labels))
    skipped: list[SkippedRecord] = []
    skipped_files: list[tuple[str, str]] = []
    trajs: list[tuple[Trajectory, str]] = []   # with the source group
    how: dict[int, dict[str, str]] = {}        # id(trajectory) -> what was inferred of it, from where
    reports: list[Report] = []
    tables: list[tuple[str, dict[tuple[str, str], LabelRow]]] = []   # (source, rows)
    files: Counter = Counter()

    def fail(e: RecordError) -> None:
        if not skip_bad:
            raise e
        skipped.append(SkippedRecord(e.source, e.line, e.field, e.reason))

    for src in iter_sources(paths, skipped_files):
        n_before = len(trajs)
        try:
            kind = _read_source(src, format, trajs, reports, tables, fail)
        except RecordError as e:
            fail(e)
            kind = "bad"
        for t, _ in trajs[n_before:]:
            how[id(t)] = dict(src.inferred)
        files[kind] += 1
        if kind.startswith("not read:"):
            skipped_files.append((src.name, kind[len("not read: "):]))
    files = Counter({k: v for k, v in files.items() if not k.startswith("not read:")})

    given: list[tuple[str, list[str]]] = []  # each --labels file or folder, its files: it must label something
    for lp in label_paths:
        names: list[str] = []
        given.append((str(lp), names))
        for src in iter_sources([lp], skipped_files):
            text = src.text()
            names.append(src.name)
            if src.basename.endswith(".csv"):
                tables.append((src.name, read_candidates_csv(text, src.name)))
            else:
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    raise RecordError(src.name, e.lineno, None, f"not valid JSON ({e.msg})") from None
                rep = parse_report(obj, src.name, group="")
                if rep is None:
                    raise RecordError(src.name, None, None, "not a candidates.csv or a SWE-bench report")
                rep.harness_run = _harness_run(src, rep)
                reports.append(rep)

    trajs = _dedupe(trajs, fail)
    warnings, labelled, inferred = _apply_labels(trajs, reports, tables)
    for arg, names in given:
        if trajs and not any(labelled[_label_key(n, reports)] for n in names):
            raise LatentSiftError(_labels_nothing(names[0] if len(names) == 1 else arg, len(trajs), reports,
                                                  tables, names))
    out = [t for t, _ in trajs]
    if scaffold is not None:
        if not isinstance(scaffold, str) or not scaffold.strip():
            raise LatentSiftError(f"The 'scaffold' parameter of import_paths must be a non-empty name. "
                                  f"Got {scaffold!r} instead.")
        for t in out:
            t.meta["scaffold"] = scaffold.strip()
    leaking = _mark_leaks(out)
    summary = _summarise(out, files, leaking, skipped, skipped_files, warnings)
    summary.label_files = dict(labelled)
    summary.inferred = _identity_inferred(trajs, how) + inferred
    return ImportResult(out, summary, skipped)


# ---------------------------------------------------------------------------------------------------------
def _read_source(src: Source, fmt: str, trajs, reports, tables, fail) -> str:
    name = src.basename
    if name.endswith(".csv"):
        text = src.text()
        if is_candidates_csv(text):
            tables.append((src.name, read_candidates_csv(text, src.name)))
            return "labels csv"
        return "not read: a CSV without 'run' and 'instance_id' columns"
    if name.endswith(".jsonl"):
        return _read_jsonl(src, fmt, trajs, fail)
    text = src.text()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(src.name, e.lineno, None, f"not valid JSON ({e.msg})") from None
    rep = parse_report(obj, src.name, src.group) if fmt == "auto" or not _is_traj_shape(obj) else None
    if rep is not None:
        rep.harness_run = _harness_run(src, rep)
        reports.append(rep)
        return "report"
    if _is_predictions(obj):
        return "not read: predictions file (patches are read from the trajectories)"
    where = Where(src.name)
    t = _parse_one(obj, where, fmt, src)
    if t is None:
        raise RecordError(src.name, None, None, f"unrecognised content: not {described()} trajectory "
                                                "(use --format to force one)")
    trajs.append((t, src.group))
    return t.source_format


def _read_jsonl(src: Source, fmt: str, trajs, fail) -> str:
    text = src.text()
    kind = None
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            fail(RecordError(src.name, lineno, None, f"not valid JSON ({e.msg}, column {e.colno})"))
            continue
        if kind is None and _is_predictions_record(obj):
            return "not read: predictions file (patches are read from the trajectories)"
        where = Where(src.name, lineno)
        try:
            t = _parse_one(obj, where, fmt, src)
            if t is None:
                raise where.error(None, f"unrecognised record: not {described()} trajectory "
                                        "(use --format to force one)")
        except RecordError as e:
            fail(e)
            continue
        kind = kind or t.source_format
        trajs.append((t, src.group))
    return kind or "jsonl (no trajectory)"


def _is_traj_shape(obj: Any) -> bool:
    return any(e.detect(obj) for e in importers())


def _is_predictions_record(obj: Any) -> bool:
    return isinstance(obj, dict) and "model_patch" in obj and "instance_id" in obj and "messages" not in obj \
        and "trajectory_steps" not in obj


def _is_predictions(obj: Any) -> bool:
    if isinstance(obj, list):
        return bool(obj) and all(_is_predictions_record(x) for x in obj)
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, dict) and "model_patch" in v for v in obj.values())


def _parse_one(obj: Any, where: Where, fmt: str, src: Source) -> Trajectory | None:
    """One record by the forced format ``fmt``, or by the first registered format that detects it
    (``auto``); None when none does."""
    if fmt != "auto":
        entry = next(e for e in importers() if e.name == fmt)
        if not entry.accepts(obj):
            raise where.error(*entry.missing)
        return entry.read(obj, where, src)
    return next((e.read(obj, where, src) for e in importers() if e.detect(obj)), None)


def _dedupe(trajs: list[tuple[Trajectory, str]], fail) -> list[tuple[Trajectory, str]]:
    seen: dict[str, str] = {}
    out = []
    for t, g in trajs:
        if t.traj_id in seen:
            src, line = (t.source_id.rsplit(":", 1) + [""])[:2] if t.source_id.rsplit(":", 1)[-1].isdigit() \
                else (t.source_id, "")
            fail(RecordError(src, int(line) if line else None, "traj_id",
                             f"duplicate {t.traj_id!r} (first read from {seen[t.traj_id]})"))
            continue
        seen[t.traj_id] = t.source_id
        out.append((t, g))
    return out


def nothing_read(paths: Iterable[str | Path], summary: ImportSummary) -> str:
    """The one line of an import that found no trajectory (``latentsift import`` refuses it): what was
    read and what was ignored."""
    paths = list(paths)
    files, skipped, skipped_files = Counter(summary.files), summary.skipped_records, summary.skipped_files
    named = ", ".join(str(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    parts = []
    if skipped:
        reasons = Counter((f"field {s.field!r}: " if s.field else "") + s.reason for s in skipped)
        top = reasons.most_common(1)[0][0]
        parts.append(f"{len(skipped)} record(s) ignored ({top}"
                     + (f"; {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else "") + ")")
    if files.get("jsonl (no trajectory)") and not skipped:
        parts.append(f"{files['jsonl (no trajectory)']} JSONL file(s) with no record (empty)")
    other = {k: n for k, n in files.items() if k in ("labels csv", "report")}
    if other:
        parts.append("only label files read (" + ", ".join(f"{k} {n}" for k, n in other.items()) + ")")
    if skipped_files:
        f, why = skipped_files[0]
        parts.append(f"{len(skipped_files)} file(s) not read ({f}: {why}"
                     + (" ..." if len(skipped_files) > 1 else "") + ")")
    if not parts:
        parts.append("no file found")
    return f"read 0 trajectories from {named}: " + "; ".join(parts) + ". Nothing to import."


def _labels_nothing(name: str, n: int, reports: list[Report], tables, names: list[str]) -> str:
    """The one line of a --labels file (or folder) that labels none of the ``n`` imported trajectories."""
    rows = next((r for src, r in tables if src == names[0]), None)
    if len(names) > 1:
        what = f"none of its {len(names)} label files matches an imported run and instance"
    elif rows is not None:
        runs = sorted({k[0] for k in rows if k[0] is not None})
        what = (f"its {len(rows)} rows name runs {runs[:3]}" if runs else f"its {len(rows)} rows name instances "
                f"{sorted(k[1] for k in rows)[:3]}") if rows else "it holds no row, a header only"
    else:
        rep = next(r for r in reports if r.source == names[0])
        ids = sorted(rep.per_instance) if rep.resolved is None else sorted(rep.resolved | (rep.covered or set()))
        what = (f"it names {len(ids)} instance(s), e.g. {ids[0]!r}" if ids else "it names no instance")
    return (f"{name} labels none of the {n} imported trajectories ({what}); pass the labels of these runs "
            "(a candidates.csv row matches by run and instance_id, a report by run and instance id).")


def _harness_run(src: Source, rep: Report) -> str | None:
    """The harness's ``run_id`` of a per-instance report at
    ``logs/run_evaluation/<run_id>/<model>/<instance_id>/report.json`` (``swebench/harness/constants``:
    ``RUN_EVALUATION_LOG_DIR``, ``LOG_REPORT``), else None."""
    if rep.resolved is not None or src.basename != "report.json":
        return None
    parts = PurePosixPath(src.group.rsplit(":", 1)[-1]).parts + (src.basename,)
    if len(parts) >= 5 and parts[-5] == "run_evaluation" and parts[-2] in rep.per_instance:
        return parts[-4]
    return None


def _shown(rep: Report) -> str:
    """The name a report is counted under in the summary: a harness run's per-instance reports as one
    (``.../run_evaluation/<run_id>/*/*/report.json``)."""
    if rep.harness_run is None:
        return rep.source
    path = PurePosixPath(rep.source)
    return f"{path.parents[2]}/*/*/report.json" if len(path.parts) >= 4 else rep.source


def _label_key(name: str, reports: list[Report]) -> str:
    return next((_shown(r) for r in reports if r.source == name), name)


def _identity_inferred(trajs: list[tuple[Trajectory, str]], how: dict[int, dict[str, str]]) -> list[str]:
    """'instance id from the file name for 3 trajectories (e.g. x.traj), ...': what was inferred of the
    trajectories' identity and from where."""
    seen: dict[tuple[str, str], list[Trajectory]] = defaultdict(list)
    for t, _ in trajs:
        for what, where in how.get(id(t), {}).items():
            seen[(what, where)].append(t)
    out = []
    for (what, where), ts in sorted(seen.items()):
        value = {"instance_id": "instance id", "run": "run", "repo": "repository"}.get(what, what)
        values = sorted({getattr(t, "instance_id" if what == "instance_id" else what) for t in ts})
        out.append(f"{value} from {where} for {len(ts)} trajectories ({', '.join(values[:3])}"
                   + (f" and {len(values) - 3} more" if len(values) > 3 else "") + ")")
    return out


def _report_run(rep: Report, trajs: list[tuple[Trajectory, str]]) -> tuple[str | None, str]:
    """The one imported run a report labels, and how it was found; None (with a warning) for a report
    among the inputs that no run can be matched to. A report that could label several runs is an error
    naming them, never a guess.

    In order: the run its name says (the harness's ``run_id``: ``<model>.<run_id>.json``,
    ``run_evaluation/<run_id>/``), the one run in its folder and below (a report found among the
    inputs), the one run imported."""
    runs = sorted({t.run for t, _ in trajs})
    base = PurePosixPath(rep.source.rsplit(":", 1)[-1]).name
    if rep.harness_run is not None:
        named, claim = [r for r in runs if r == rep.harness_run], f"its run_id {rep.harness_run!r} (from its path)"
    elif rep.run_report:
        named = [r for r in runs if base.endswith(f".{r}.json")]
        claim = f"the run_id in its name {base!r}"
    else:
        named, claim = [], ""
    if len(named) == 1:
        return named[0], (claim if rep.harness_run is not None
                          else f"its name {base!r} ends in .{named[0]}.json (the harness's <model>.<run_id>.json)")
    if len(named) > 1:
        raise LatentSiftError(f"{rep.source}: {claim} matches {len(named)} imported runs ({', '.join(named)}); "
                              "rename the run folders so that one run carries the harness's run_id.")
    beside = sorted({t.run for t, g in trajs if rep.group and _under(g, rep.group)})
    unmatched = f"{claim} matches none of the imported runs; " if claim else ""
    if len(beside) == 1:
        return beside[0], f"{unmatched}the one run beside it"
    if len(beside) > 1:
        raise LatentSiftError(f"{rep.source}: {unmatched}{len(beside)} runs sit beside it ({', '.join(beside)}) "
                              f"and it labels one; {_how_to_name(rep)}")
    if rep.group and not claim:
        return None, "no trajectory beside it"
    if len(runs) == 1:
        return runs[0], f"{unmatched}the only run imported"
    if rep.resolved is None and not claim:
        return None, ""   # a per-instance report given with --labels: matched by instance id
    raise LatentSiftError(f"{rep.source}: {unmatched}it labels one of the {len(runs)} imported runs "
                          f"({', '.join(runs[:6])}{' ...' if len(runs) > 6 else ''}); {_how_to_name(rep)}")


def _how_to_name(rep: Report) -> str:
    if rep.harness_run is not None or rep.run_report:
        return "name each run's folder by the harness's run_id, or import and label one run at a time."
    return "put it beside its run's files, or import and label one run at a time."


def _apply_labels(trajs: list[tuple[Trajectory, str]], reports: list[Report],
                  tables: list[tuple[str, dict[tuple[str | None, str], LabelRow]]]
                  ) -> tuple[list[str], Counter, list[str]]:
    """Apply the reports and tables; (warnings, source -> number of trajectories it labelled or gave
    test counts, what was inferred: the run each report labels and how it was found)."""
    warnings: list[str] = []
    mismatch: list[str] = []
    labelled: Counter = Counter()
    matched: dict[tuple[str, str, str], int] = {}   # (shown report, run, how) -> reports

    def set_reward(t: Trajectory, r: float, where: str, key: str) -> None:
        labelled[key] += 1
        if t.reward is None:
            t.reward = r
            t.meta["label_source"] = where
        elif (t.reward >= 0.5) != (r >= 0.5):
            mismatch.append(f"{t.traj_id}: reward {t.reward} in the trajectory, {r} in {where}")

    by_run: dict[str, list[Trajectory]] = defaultdict(list)
    by_instance: dict[str, list[Trajectory]] = defaultdict(list)
    for t, _ in trajs:
        by_run[t.run].append(t)
        by_instance[t.instance_id].append(t)
    for rep in reports:
        key = _shown(rep)
        run, how = _report_run(rep, trajs)
        if run is None and how:
            warnings.append(f"{rep.source}: report with {how} (not applied)")
            continue
        if run is not None:
            matched[(key, run, how)] = matched.get((key, run, how), 0) + 1
        targets = by_run[run] if run is not None else [t for t, _ in trajs]
        for t in targets:
            if rep.resolved is not None:
                if rep.covered is None or t.instance_id in rep.covered:
                    set_reward(t, float(t.instance_id in rep.resolved), rep.source, key)
            elif t.instance_id in rep.per_instance:
                if run is None and len(by_instance[t.instance_id]) > 1:
                    runs = sorted(x.run for x in by_instance[t.instance_id])
                    raise LatentSiftError(f"{rep.source}: per-instance report for {t.instance_id!r} matches "
                                          f"candidates of {len(runs)} runs ({', '.join(runs)}); put it beside its "
                                          "run's files, or pass the harness's logs/ folder (its run_id names the run).")
                r, tests = rep.per_instance[t.instance_id]
                set_reward(t, r, rep.source, key)
                t.tests.update(tests)
    for source, table in tables:
        used = set()
        missing = 0
        by_id = any(k[0] is None for k in table)
        for t, _ in trajs:
            k = (None, t.instance_id) if by_id else (t.run, t.instance_id)
            row = table.get(k)
            if row is None:
                missing += 1
                continue
            if by_id and len(by_instance[t.instance_id]) > 1:
                runs = sorted(x.run for x in by_instance[t.instance_id])
                raise LatentSiftError(f"{row.where}: {t.instance_id!r} is in {len(runs)} imported runs "
                                      f"({', '.join(runs)}); add a 'run' column to say which row labels which.")
            used.add(k)
            t.tests.update(row.tests)
            if row.resolved is not None:
                set_reward(t, float(row.resolved), row.where, source)
            else:
                labelled[source] += 1  # test counts only
        if by_id and used:
            matched[(source, ", ".join(sorted({t.run for t, _ in trajs if (None, t.instance_id) in used})),
                     "no run column: each instance id is in one imported run")] = 1
        unused = [k for k in table if k not in used]
        if missing:
            warnings.append(f"{missing} trajectories have no row in the labels table")
        if unused:
            warnings.append(f"{len(unused)} labels-table rows match no imported trajectory "
                            f"(e.g. {unused[0][1] if by_id else f'{unused[0][0]}/{unused[0][1]}'})")
    if mismatch:
        warnings.append(f"{len(mismatch)} label disagreement(s) (the trajectory's own reward is kept): "
                        + "; ".join(mismatch[:5]) + (" ..." if len(mismatch) > 5 else ""))
    inferred = [f"{key}{f' ({n} reports)' if n > 1 else ''} labels run {run}: {how}"
                for (key, run, how), n in matched.items()]
    return warnings, labelled, inferred


def _under(group: str, folder: str) -> bool:
    return group == folder or group.startswith(folder.rstrip("/") + "/") or folder.endswith(":") \
        and group.startswith(folder)


def _mark_leaks(trajs: list[Trajectory]) -> list[str]:
    runs = {t.run for t in trajs if t.run in KNOWN_LEAKING_RUNS}
    runs |= {t.run for t in trajs if t.agent == "acr" and any(m in s.obs for s in t.steps for m in LEAK_MARKERS)}
    for t in trajs:
        if t.run in runs:
            t.meta["leaks_label"] = True
    return sorted(runs)


def _summarise(trajs: list[Trajectory], files: Counter, leaking: list[str], skipped, skipped_files,
               warnings) -> ImportSummary:
    per_inst = Counter(t.instance_id for t in trajs)
    runs: dict[str, dict[str, Any]] = {}
    by_run: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_run[t.run].append(t)
    for run, ts in by_run.items():
        steps = [t.n_steps for t in ts]
        runs[run] = {"agent": ts[0].agent, "candidates": len(ts),
                     "resolved": sum(t.label == 1 for t in ts), "unresolved": sum(t.label == 0 for t in ts),
                     "unknown": sum(t.label is None for t in ts),
                     "steps_median": float(statistics.median(steps)) if steps else 0.0,
                     "steps_max": max(steps) if steps else 0, "leaks_label": run in leaking}
    return ImportSummary(
        n_trajectories=len(trajs), n_instances=len(per_inst), n_steps=sum(t.n_steps for t in trajs),
        candidates_per_instance=dict(sorted(Counter(per_inst.values()).items())),
        labels={"resolved": sum(t.label == 1 for t in trajs), "unresolved": sum(t.label == 0 for t in trajs),
                "unknown": sum(t.label is None for t in trajs)},
        runs=runs, files=dict(files), leaking_runs=leaking, skipped_records=list(skipped),
        skipped_files=list(skipped_files), warnings=warnings)
