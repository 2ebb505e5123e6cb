"""A protocol run: its folder, its settings, the per-fold cache of banks and scorers, and the
protocol itself (``evaluate_protocol``: everything after the states exist).

    OUT/manifest.json      settings (written once the inputs are checked)
    OUT/folds/fold-<k>/    banks and scorers of fold k (reused when their settings match)
    OUT/report/            summary.json, report.md, figures (written last: presence = finished)
    OUT/stage1/            per-candidate Stage-1 scores and evidence (the explorer's input)
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .._core.io import atomic_write_json, read_json
from .._core.manifests import RunManifest, check_manifest
from .._core.validation import LatentSiftError
from ..bank.bank import Bank, Fold, iter_folds
from ..metrics.score_table import diagnostics_table
from ..metrics.evaluate import EvaluateSettings, evaluate_run
from ..metrics.formats import pools_from_trajectories
from ..report.explore import save_stage1, write_run_site
from ..report.report import write_report
from ..sift.rules import PAPER, REFERENCE, labels, rule_keys, rules
from ..sift.scorer import LinearScorer, early_stopping_groups
from ..states.store import StateStore
from ..trajectories.trajectory import Trajectory, load_jsonl
from ..sift.variants import DEFAULT, RECOMMENDED
from ..cascade.verifier import EF, VerifierFailure
from .decide import REF_LENGTH_STACK, decision_section
from .folds import Split, fold_splits, group_of
from .guard import protocol_guard
from .nested import nested_calibration
from .operating import keep_records, operating_points
from .premise import OPERATING_FILE, PREMISE_RECALLS, SCORES_FILE, premise_section, save_operating, save_scores
from .pruning import reproduce_pruning
from .settings import ProtocolSettings, digest
from .single_agent import single_agent_guard, single_agent_pools
from .stage1 import stage1_filters
from .tables import ablation_tables, candidate_table, per_agent_retention, retention_differences
from .transfer_agents import agent_transfer
from .verdict import verdict_lines

#: What a run without verifier results records: Stage 4 keeps every survivor and charges no tokens.
NO_VERIFIER = "no verifier results given: Stage 4 keeps every survivor (Best@K = expected label of a " \
              "uniform pick among them) and no verifier tokens are charged; 'EF calls' counts the survivors " \
              "a verifier would have scored"


class Run:
    """One run folder: settings, log, progress, stage timings and the per-fold cache.

    ``settings``: a ``ProtocolSettings`` (``ReproduceSettings`` or ``CrossvalSettings``) with ``out``.
    After Stage 1, ``curve_scores`` (per-candidate scores of the training-set size curves) and
    ``curve_sizes`` (bank trajectories per fraction and fold) hold the learning curves.
    """

    def __init__(self, settings: ProtocolSettings, log: Callable[[str], None] = print,
                 progress: Callable[[str, int, int, str], None] | None = None):
        self.settings = settings
        self.out = Path(settings.out)
        self.log = log
        self.progress = progress or (lambda stage, done, total, info: None)
        self.timings: dict[str, float] = {}
        self.curve_scores: dict[str, dict[str, float]] = {}
        self.curve_sizes: dict[str, dict[str, int]] = {}

    def timed(self, name: str, t0: float) -> None:
        """Record (and log) the wall time of stage ``name`` started at ``t0``."""
        self.timings[name] = round(time.perf_counter() - t0, 2)
        self.log(f"[{name}] {self.timings[name]:.1f} s")

    def group(self, traj: Trajectory) -> str:
        """The fold group of a trajectory (``settings.group_by``: repo, agent or instance)."""
        return group_of(traj, self.settings.group_by)

    def folds(self, trajs: Sequence[Trajectory]) -> list[Split]:
        """(bank groups, eval groups) per fold: disjoint groups, balanced by trajectory count."""
        return fold_splits(trajs, self.settings.group_by, self.settings.n_folds, self.settings.seed)

    def iter_folds(self, trajs: Sequence[Trajectory], splits: Sequence[Split], **kw) -> list[Fold]:
        """``bank.iter_folds`` with this run's fold groups (the one fold loop)."""
        return list(iter_folds(trajs, splits, self.group, **kw))

    def fit_fold(self, k: int, bank_trajs: Sequence[Trajectory], states: dict, fingerprint, bank_params: dict,
                 name: str = "paper"):
        """Bank + scorer of fold k for one representation setting, cached under OUT/folds/fold-k/<name>."""
        s = self.settings
        fold_dir = self.out / "folds" / f"fold-{k}" / name
        ids = sorted(t.traj_id for t in bank_trajs)
        key = digest({"ids": ids, "bank": bank_params, "epochs": s.scorer_epochs, "seed": s.seed,
                      "fp": fingerprint.digest, "val_split": [s.group_by, "or instance"]})
        key_path = fold_dir / "key.json"
        if key_path.is_file() and json.loads(key_path.read_text()).get("key") == key:
            return Bank.load(fold_dir / "bank"), LinearScorer.load(fold_dir / "scorer")
        twin = self._fitted_twin(key, fold_dir)
        if twin is not None:  # the same bank trajectories and settings were fitted under another name
            bank, scorer = Bank.load(twin / "bank"), LinearScorer.load(twin / "scorer")
        else:
            labels = {t.traj_id: int(t.label) for t in bank_trajs}
            bank = Bank.from_trajectories(bank_trajs, states, fingerprint, **bank_params)
            # the early-stopping split by the fold groups (task, repository), as the folds are (by task in a
            # bank of one group)
            scorer = LinearScorer(max_epochs=s.scorer_epochs, seed=s.seed, train_loss=False).fit(
                [states[i] for i in ids], [labels[i] for i in ids], fingerprint=fingerprint,
                groups=early_stopping_groups(bank_trajs, self.group))
        bank.save(fold_dir / "bank")
        scorer.save(fold_dir / "scorer")
        atomic_write_json(key_path, {"key": key})
        # continue from the saved files, exactly as a cached rerun does (same arrays, same results)
        return Bank.load(fold_dir / "bank"), LinearScorer.load(fold_dir / "scorer")

    def _fitted_twin(self, key: str, fold_dir: Path) -> Path | None:
        """Another folder of OUT/folds whose bank and scorer were fitted with ``key`` (the fits are
        deterministic, so they are reused instead of refitted: the pruning's inner splits of
        different folds often leave the same bank trajectories)."""
        for path in sorted((self.out / "folds").glob("fold-*/*/key.json")):
            if path.parent != fold_dir and json.loads(path.read_text()).get("key") == key:
                return path.parent
        return None

    def cached_fold(self, trajs: Sequence[Trajectory], splits: Sequence[Split], k: int, name: str = "paper"):
        """(bank, scorer, evaluation pools) of fold k as a finished run left them in OUT/folds (read, never
        fitted); refused when the cached bank is not this split's."""
        fold = next((f for f in self.iter_folds(trajs, splits) if f.k == k), None)
        if fold is None:
            raise LatentSiftError(f"Fold {k} of {self.out} has no evaluation pools.")
        d = self.out / "folds" / f"fold-{k}" / name
        bank, scorer = Bank.load(d / "bank"), LinearScorer.load(d / "scorer")
        want = sorted(t.traj_id for t in fold.bank_trajs)
        if list(bank.traj_ids_) != want:
            raise LatentSiftError(f"{d / 'bank'} does not hold fold {k}'s bank trajectories of this run's split "
                                  f"({len(bank.traj_ids_)} vs {len(want)}): rerun the run to refresh its folds.")
        return bank, scorer, fold.eval_pools


def open_run(run_dir: str | Path, settings_classes: dict[str, type], *,
             log: Callable[[str], None] = lambda m: None) -> tuple[Run, list[Trajectory], StateStore]:
    """(Run, trajectories, opened state store) of a ``reproduce`` or ``crossval`` run folder.

    ``settings_classes``: the manifest's command -> its settings class (``ProtocolSettings.inputs``
    gives the pools file and the state store, ``ProtocolSettings.select`` the run's instances).
    """
    run_dir = Path(run_dir)
    man_path = run_dir / "manifest.json"
    if not man_path.is_file():
        raise LatentSiftError(f"{run_dir} is not a run folder (no manifest.json; run 'latentsift reproduce').")
    man = check_manifest(read_json(man_path), RunManifest, man_path, "run the command again into a new --out")
    cls = settings_classes.get(man.get("command"))
    if cls is None:
        raise LatentSiftError(f"{man_path}: unknown command {man.get('command')!r}.")
    names = {f.name for f in dataclasses.fields(cls)}
    settings = cls(**{k: v for k, v in man.get("settings", {}).items() if k in names} | {"out": str(run_dir)})
    pools, states = settings.inputs()
    for p in (pools, states):
        if not Path(p).exists():
            raise LatentSiftError(f"{p} is missing (paths of a crossval manifest are relative to where it ran).")
    if not (run_dir / "report" / "summary.json").is_file():
        print(f"warning: {run_dir} has no report/summary.json: the run is unfinished or running; its folds may "
              "still change.", file=sys.stderr)
    return Run(settings, log=log), settings.select(load_jsonl(pools)), StateStore(states).open()


def composition(trajs: Sequence[Trajectory], group_by: str) -> dict:
    """summary.json ``composition``: the agents, repositories and fold grouping of the evaluated candidates
    (the report's words follow it: one agent's pools are not 'pools of mixed agents')."""
    agents = sorted({t.agent for t in trajs})
    return {"agents": agents, "n_agents": len(agents), "n_repositories": len({t.repo for t in trajs}),
            "n_instances": len({t.instance_id for t in trajs}), "group_by": group_by,
            "n_fold_groups": len({group_of(t, group_by) for t in trajs})}


def missing_filters(fold_info: dict, settings: ProtocolSettings) -> dict[str, str]:
    """filter -> why it is absent from this run: not fitted in some fold (``stage1_filters``), or not run."""
    missing = dict(fold_info.get("missing") or {})
    if not settings.variants:
        missing.setdefault(REF_LENGTH_STACK, "not run: the beyond-paper variants are off (--no-variants)")
    return missing


def no_verifier_table(trajs: Sequence[Trajectory]) -> dict:
    """A final-verifier table that scores nobody: Stage 4 keeps every survivor, charges nothing."""
    return {t.traj_id: VerifierFailure(t.traj_id, error="no verifier results given", attempts=0) for t in trajs}


# ------------------------------------------------------------------------------- the protocol
def evaluate_protocol(run: Run, trajs: Sequence[Trajectory], store, *, tokenizer=None, verifier=None,
                      extra_stage1: Callable[[list], tuple[dict, dict, dict]] | None = None,
                      meta: dict | None = None, t_all: float | None = None) -> Path:
    """Everything after the states exist: folds -> Stage-1 filters -> cascade -> report.

    ``run``: a ``Run`` (settings, cached folds, timings, log); ``store``: the opened state store of
    ``trajs``; ``verifier``: EF results (dict traj_id -> result), a callable giving them (called
    after Stage 1, e.g. to run the verifier), or None (no Stage-4 verifier, see ``NO_VERIFIER``);
    ``extra_stage1(folds)``: more Stage-1 filters on states of their own (the sweep): returns (draw
    scorers, full-pool scores, report info). Returns the report folder.
    """
    settings, out, log = run.settings, run.out, run.log
    t_all = time.perf_counter() if t_all is None else t_all
    report_dir = out / "report"
    st = _stage1(run, trajs, store, tokenizer, verifier, extra_stage1)
    ef, folds, draw_scorers, fingerprint = st.ef, st.folds, st.draw_scorers, st.fingerprint
    summary, data, pools, records, filters, scores, table = _evaluate(run, trajs, st, meta)
    t0 = time.perf_counter()  # recall-targeted retention beside the paper's fixed rule (protocol.operating)
    keeps = keep_records(run, trajs, folds, filters, ef, nested=st.nested)
    data["operating_points"] = operating_points(run, trajs, folds, filters, ef, nested=st.nested, records=keeps)
    st.nested = {}  # the pair folds' banks and scorers: released before pruning
    run.timed("operating_points", t0)
    # the comparisons that decide, the single-agent pools and the verdict (protocol.decide, single_agent, verdict)
    t0 = time.perf_counter()
    data["composition"] = composition(trajs, settings.group_by)
    missing = missing_filters(st.fold_info, settings)
    data["decision"] = decision_section(table, {n: v for n, v in scores.items() if n in filters}, summary.ledger,
                                        reference_workflow=data["tokens"].get("reference"),
                                        n_boot=settings.n_boot, seed=settings.seed, missing=missing)
    data["single_agent"] = single_agent_pools(
        pools, records, filters, trajs, ks=settings.ks, n_draws=settings.n_draws, n_boot=settings.n_boot,
        seed=settings.seed, final_verifier=ef if ef is not None else no_verifier_table(trajs),
        reference=EF if ef is not None else None, missing=missing)
    if st.single_guard is not None:
        data["single_agent"]["shift_guard"] = st.single_guard
    if getattr(settings, "premise", False):  # the premise test on one policy's pools (protocol.premise)
        data["premise"] = premise_section(table, {n: v for n, v in scores.items() if n in filters}, data,
                                          missing=missing, n_boot=settings.n_boot, seed=settings.seed)
        save_scores(out / SCORES_FILE, table, {n: v for n, v in scores.items() if n in filters})
        save_operating(out / OPERATING_FILE, keeps, PREMISE_RECALLS)
    data["verdict"] = verdict_lines(data)
    run.timed("decide", t0)
    # offline early pruning by prefix truncation of the stored states (latentsift.sift.prune); reuses the
    # folds' banks and scorers; stored in summary.json under "pruning". Token counts need the tokenizer
    # (reproduce has it; crossval on stored states alone skips this section and says so)
    if tokenizer is not None:
        t0 = time.perf_counter()
        data["pruning"] = reproduce_pruning(
            run, trajs, store, tokenizer, folds,
            cascade={"stage1": draw_scorers[PAPER], "records": records, "final_verifier": ef}
            if ef is not None else None)
        run.timed("prune", t0)
    else:
        log("[prune] skipped: the offline pruning evaluation needs the policy's tokenizer (run reproduce)")
    run.timings["total"] = round(time.perf_counter() - t_all, 2)
    atomic_write_json(out / "timings.json", run.timings)  # kept out of summary.json: wall times vary run to run
    write_report(summary, report_dir)
    log(f"report: {report_dir / 'report.md'}")
    # the explorer: per-candidate Stage-1 results (scores, evidence, retained sets) and the site
    pools_path = Path(getattr(settings, "pools", None) or out / "pools.jsonl")
    save_stage1(draw_scorers, out / "stage1",
                tables={EF: {t: r.score for t, r in ef.items()}} if ef is not None else None,
                seed=settings.seed, inputs={"pools": str(pools_path.resolve())}, fingerprint=fingerprint.to_dict())
    log(f"explorer: {write_run_site(out, pools=pools_path)}")
    return report_dir


@dataclasses.dataclass
class _Stage1:
    """What Stage 1 on the folds gives the evaluation (the part of the protocol that reads the states)."""

    folds: list
    fingerprint: Any
    draw_scorers: dict
    full_scores: dict
    fold_info: dict
    transfer_info: dict
    guard_info: dict
    single_guard: dict | None
    ef: dict | None
    sweep_info: dict
    nested: dict


def _stage1(run: Run, trajs: Sequence[Trajectory], store, tokenizer, verifier, extra_stage1) -> _Stage1:
    """The folds' Stage-1 filters, agent transfer and the shift guard's error rates on the stored states;
    then the EF results (``verifier``) and the sweep's filters (``extra_stage1``)."""
    settings = run.settings
    t0 = time.perf_counter()
    states = store.load([t.traj_id for t in trajs])
    fingerprint = store.fingerprint
    run.timed("load_states", t0)

    folds = run.folds(trajs)
    draw_scorers, full_scores, fold_info = stage1_filters(run, trajs, folds, states, fingerprint, tokenizer)
    transfer_scorers, transfer_info = ({}, {})
    if settings.agent_transfer:
        transfer_scorers, transfer_info = agent_transfer(run, trajs, folds, states, fingerprint)
    # the shift guard's error rates: false alarms per fold, detection across agents
    t0 = time.perf_counter()
    guard_info = protocol_guard(run, trajs, folds, states, fingerprint, false_alarm=settings.guard_false_alarm,
                                n_boot=settings.n_boot, seed=settings.seed, agent_transfer=settings.agent_transfer)
    # one agent: its single-agent bank is the fold bank itself (the false alarms above), so no second table
    single_guard = single_agent_guard(run, trajs, folds, states, fingerprint, guard_info.get("detection", {}),
                                      false_alarm=settings.guard_false_alarm, n_boot=settings.n_boot,
                                      seed=settings.seed) \
        if settings.agent_transfer and len({t.agent for t in trajs}) >= 2 else None
    run.timed("shift_guard", t0)
    # the trained filters refitted on each pair of folds: clean calibration for the operating points
    nested = nested_calibration(run, trajs, folds, states, fingerprint, tokenizer, transfer=settings.agent_transfer)
    ef = verifier() if callable(verifier) else verifier
    del states
    sweep_info = {}
    if extra_stage1 is not None:
        ds, fs, sweep_info = extra_stage1(folds)
        draw_scorers |= ds
        full_scores |= fs
    draw_scorers |= transfer_scorers
    return _Stage1(folds, fingerprint, draw_scorers, full_scores, fold_info, transfer_info, guard_info, single_guard,
                   ef, sweep_info, nested)


def _evaluate(run: Run, trajs: Sequence[Trajectory], st: _Stage1, meta: dict | None):
    """The cascade on the same draws for every filter (``evaluate_run``) and the selection diagnostics:
    (summary, its data, pools, records, filters, full-pool score arrays, candidate table)."""
    settings, ef, full_scores, fold_info = run.settings, st.ef, st.full_scores, st.fold_info
    t0 = time.perf_counter()
    testgen = None if settings.gen_test_key is None else {t.instance_id: settings.testgen_tokens for t in trajs}
    pools, records = pools_from_trajectories(trajs, regression_key="p2p_passed", gen_test_key=settings.gen_test_key,
                                             testgen_tokens=testgen)
    filters: dict[str, Any] = {EF: ef} if ef is not None else {}
    filters.update(st.draw_scorers)
    components = full_scores.pop("_components")
    distributions = {**{k: v for k, v in components.items() if k.startswith("q_")},
                     "s (LatentSift)": full_scores[PAPER]}
    if ef is not None:
        distributions["EF verifier"] = {t: r.score for t, r in ef.items() if r.score is not None}
    names = {f: labels()[f] for f in (EF, PAPER, RECOMMENDED, DEFAULT)} | {e.key: e.label for e in rules()}
    names |= {name: f"LatentSift, bank and scorer from {a} only" for a, name in st.transfer_info.get("filters", {}).items()}
    small = "drop" if any(p.n < max(settings.ks) for p in pools) else "error"
    run_meta = dict(meta or {})
    run_meta |= {"folds": fold_info["folds"], "fingerprint": st.fingerprint.to_dict()}
    if ef is None:
        run_meta["stage4"] = NO_VERIFIER
    if settings.gen_test_key is not None:
        run_meta["stage3"] = settings.gen_test_key
    evaluation = EvaluateSettings(
        ks=list(settings.ks), n_draws=settings.n_draws, seed=settings.seed, n_boot=settings.n_boot,
        reference=EF if ef is not None else None, small_pools=small,
        ablations=ablation_tables(list(filters)), names=names,
        headline=[f for f in (PAPER, RECOMMENDED, DEFAULT, EF, *rule_keys("headline")) if f in filters],
        meta=run_meta)
    summary = evaluate_run(pools, filters, records, evaluation,
                           final_verifier=ef if ef is not None else no_verifier_table(trajs),
                           distributions=distributions)
    data = summary.data if hasattr(summary, "data") else summary
    table = candidate_table(trajs)
    ids = table["traj_id"].tolist()
    scores = {name: np.array([sc.get(t, np.nan) for t in ids], dtype=float) for name, sc in full_scores.items()}
    if ef is not None:
        scores[EF] = np.array([ef[t].score if ef[t].score is not None else np.nan for t in ids])
    data["selection"] = {
        "reference": REFERENCE,
        "diagnostics": diagnostics_table(table, scores, reference=REFERENCE, n_boot=settings.n_boot,
                                         seed=settings.seed),
        "retention_difference": retention_differences(summary.ledger, REFERENCE, settings.ks,
                                                      n_boot=settings.n_boot, seed=settings.seed),
        "default_choice": [{"fold": f["fold"], **f.get("variants", {})} for f in fold_info["folds"]],
        "recommended_choice": [{"fold": f["fold"], **f["recommendation"]} for f in fold_info["folds"]
                               if "recommendation" in f],
        "per_agent_retention": per_agent_retention(summary.ledger, trajs, settings.ks),
        "training_size": {"fractions": [f"{round(100 * f)}%" for f in settings.curve_fractions],
                          "bank_trajectories": run.curve_sizes,
                          "rule": "nested subsets of bank instances in a seeded hash order; gated head "
                                  "(SPEC 5 settings) and logistic probe refitted on each"},
        "sweep": st.sweep_info,
        "agent_transfer": st.transfer_info,
    }
    data["shift_guard"] = st.guard_info
    run.timed("evaluate", t0)
    return summary, data, pools, records, filters, scores, table
