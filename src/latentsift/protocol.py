"""The evaluation protocol on any canonical labelled pools with stored states (``latentsift crossval``).

Disjoint folds (by repository, agent or instance; banks and scorers from the other folds) -> the
paper's method, its ablations, the variants and the inner-CV default, the baselines -> agent
transfer (banks and scorers from one agent's trajectories only) -> the cascade on seeded draws ->
diagnostics, paired bootstrap differences, per-agent retention -> report.

``reproduce`` is import + extract + verify + ``evaluate_protocol`` on the shared pools; ``crossval``
is ``evaluate_protocol`` on a team's own pools. One code path: the same settings on the same pools
and states give the same Stage-1 numbers.

    OUT/manifest.json      settings (written once the inputs are checked)
    OUT/folds/fold-<k>/    banks and scorers of fold k (reused when their settings match)
    OUT/report/            summary.json, report.md, figures (written last: presence = finished)
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ._io import atomic_write_json
from ._validation import LatentSiftError, check_choice, check_positive_int
from .trajectory import Trajectory, group_pools

GROUP_BY = ("repo", "agent", "instance")
ON_LEAK_CROSSVAL = ("error", "skip")
NO_VERIFIER = "no verifier results given: Stage 4 keeps every survivor (Best@K = expected label of a " \
              "uniform pick among them) and no verifier tokens are charged; 'EF calls' counts the survivors " \
              "a verifier would have scored"


def group_of(traj: Trajectory, group_by: str) -> str:
    """The fold group of a trajectory: its repository, agent or instance."""
    return {"repo": traj.repo, "agent": traj.agent, "instance": traj.instance_id}[group_by]


@dataclass
class CrossvalSettings:
    """Settings of ``crossval`` (all recorded in the manifest and in summary.json).

    The protocol fields have the meaning and defaults of ``ReproduceSettings``; ``pools`` is a
    canonical JSONL of labelled candidates, ``states`` their state store, ``verifier`` optional EF
    verifier results (``latentsift`` verifier output folder or verdicts.jsonl) for the cascade's
    Stage 4 and the token columns.
    """

    pools: str
    states: str
    out: str
    group_by: str = "repo"
    n_folds: int = 4
    ks: tuple[int, ...] = (4, 5, 6)
    n_draws: int = 200
    n_boot: int = 1000
    seed: int = 0
    scorer_epochs: int = 40
    variants: bool = True
    curve_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    agent_transfer: bool = True
    verifier: str | None = None
    instances: int | None = None
    sweep: tuple[str, ...] = ()
    on_leak: str = "error"
    sources: dict | None = None  # several pools files / stores: their paths (``pools`` is then their union)
    guard_false_alarm: float = 0.05   # shift.FALSE_ALARM: the guard's stated false-alarm rate

    def __post_init__(self):
        check_choice(self.group_by, "group_by", "crossval", GROUP_BY)
        if self.on_leak == "allow":
            raise LatentSiftError("crossval: --on-leak allow would score pools against banks holding their own "
                                  "instance (leakage, not an evaluation); pass --on-leak error or skip.")
        check_choice(self.on_leak, "on_leak", "crossval", ON_LEAK_CROSSVAL)
        if not 0.0 < self.guard_false_alarm < 1.0:
            raise LatentSiftError(f"crossval: --guard-false-alarm must be in (0, 1); got {self.guard_false_alarm}.")
        for name in ("n_folds", "n_draws", "n_boot", "scorer_epochs"):
            check_positive_int(getattr(self, name), name, "crossval")
        self.ks = tuple(check_positive_int(k, "ks", "crossval") for k in self.ks)
        if not self.ks:
            raise LatentSiftError("The 'ks' parameter of crossval must name at least one K. Got [] instead.")

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("ks", "curve_fractions", "sweep"):
            d[k] = list(getattr(self, k))
        return d


# ------------------------------------------------------------------------------- input checks
def check_labelled(trajs: Sequence[Trajectory], owner: str) -> None:
    """Every candidate needs a test outcome (reward) to be evaluated or banked."""
    if not trajs:
        raise LatentSiftError(f"{owner}: the pools file holds no trajectory.")
    missing = [t.traj_id for t in trajs if t.label is None]
    if missing:
        raise LatentSiftError(f"{owner}: {len(missing)} of {len(trajs)} candidates have no label (reward), "
                              f"e.g. {missing[0]!r}. Cross-validation and fitting need the test outcome of every "
                              "candidate: import the pools with --labels, or leave the unlabelled pools out.")


def check_states_present(store, trajs: Sequence[Trajectory], owner: str) -> None:
    missing = [t.traj_id for t in trajs if not store.has(t.traj_id)]
    if missing:
        raise LatentSiftError(f"{owner}: the state store {str(store.path)!r} has no states for {len(missing)} of "
                              f"{len(trajs)} candidates, e.g. {missing[0]!r}; run 'latentsift extract' on the "
                              "same pools file first.")


def group_noun(group_by: str, n: int = 2) -> str:
    """'repository' / 'repositories', 'agent(s)', 'instance(s)': the fold group in messages."""
    one = {"repo": "repository", "agent": "agent", "instance": "instance"}.get(group_by, group_by)
    return one if n == 1 else ("repositories" if one == "repository" else one + "s")


def check_folds(trajs: Sequence[Trajectory], folds, group: Callable[[Trajectory], str], owner: str, *,
                fix: str = "Use fewer folds (--folds), another grouping (--group-by) or more labelled pools.") -> None:
    """Each fold's bank needs trajectories of both classes (a bank with one class has no margin)."""
    for k, (bank_groups, eval_groups) in enumerate(folds):
        bank = set(bank_groups)
        labels = [t.label for t in trajs if group(t) in bank]
        n_pos = sum(labels)
        if n_pos == 0 or n_pos == len(labels):
            cls = "resolved (label 1)" if n_pos == 0 else "unresolved (label 0)"
            raise LatentSiftError(f"{owner}: fold {k}'s bank (groups {list(bank_groups)[:5]}) has no {cls} "
                                  f"trajectory ({n_pos} resolved of {len(labels)}); every fold needs both classes. "
                                  + fix)


def check_group_by(trajs: Sequence[Trajectory], group_by: str, owner: str) -> None:
    """Pools must not straddle fold groups (a pool split across folds would leak its instance)."""
    for p in group_pools(trajs):
        gs = {group_of(c, group_by) for c in p.candidates}
        if len(gs) > 1:
            raise LatentSiftError(
                f"{owner}: the pool of {p.instance_id!r} holds candidates of several {group_by}s {sorted(gs)}; "
                f"folds by {group_by} must keep whole pools together (the bank refuses instances it holds). "
                "Use --group-by repo, or pools with one " + group_by + " each (the report's agent-transfer "
                "table already trains on one agent and evaluates on mixed pools).")


def leaking_pools(trajs: Sequence[Trajectory], group_by: str) -> list[dict]:
    """The pools that straddle fold groups (their instance would sit in a bank that scores them), with
    the groups they span, sorted by instance."""
    out = []
    for p in sorted(group_pools(trajs), key=lambda p: p.instance_id):
        gs = sorted({group_of(c, group_by) for c in p.candidates})
        if len(gs) > 1:
            out.append({"instance_id": p.instance_id, "groups": gs, "action": "pool skipped: not evaluated"})
    return out


def no_verifier_table(trajs: Sequence[Trajectory]) -> dict:
    """A final-verifier table that scores nobody: Stage 4 keeps every survivor, charges nothing."""
    from .verifier import VerifierFailure
    return {t.traj_id: VerifierFailure(t.traj_id, error="no verifier results given", attempts=0) for t in trajs}


# ------------------------------------------------------------------------------- the protocol
def evaluate_protocol(run, trajs: Sequence[Trajectory], store, *, tokenizer=None, verifier=None,
                      extra_stage1: Callable[[list], tuple[dict, dict, dict]] | None = None,
                      meta: dict | None = None, t_all: float | None = None) -> Path:
    """Everything after the states exist: folds -> Stage-1 filters -> cascade -> report.

    ``run``: a ``reproduce.Run`` (settings, cached folds, timings, log); ``store``: the opened
    state store of ``trajs``; ``verifier``: EF results (dict traj_id -> result), a callable giving
    them (called after Stage 1, e.g. to run the verifier), or None (no Stage-4 verifier, see
    ``NO_VERIFIER``); ``extra_stage1(folds)``: more Stage-1 filters on states of their own (the
    sweep): returns (draw scorers, full-pool scores, report info). Returns the report folder.
    """
    from .diagnostics import diagnostics_table
    from .evaluate import evaluate_run, pools_from_trajectories
    from .report import write_report
    from .reproduce import ablation_tables, candidate_table, per_agent_retention, retention_differences

    settings, out, log = run.s, run.out, run.log
    t_all = time.perf_counter() if t_all is None else t_all
    report_dir = out / "report"

    t0 = time.perf_counter()
    states = store.load([t.traj_id for t in trajs])
    fingerprint = store.fingerprint
    run._timed("load_states", t0)

    folds = run.folds(trajs)
    draw_scorers, full_scores, fold_info = run.stage1_filters(trajs, folds, states, fingerprint, tokenizer)
    transfer_scorers, transfer_info = ({}, {})
    if getattr(settings, "agent_transfer", False):
        transfer_scorers, transfer_info = run.agent_transfer(trajs, folds, states, fingerprint)
    # --- shift guard's error rates (issue 24): false alarms per fold, detection across agents ---
    from .shift import FALSE_ALARM
    from .shift_eval import protocol_guard
    t0 = time.perf_counter()
    guard_info = protocol_guard(run, trajs, folds, states, fingerprint,
                                false_alarm=getattr(settings, "guard_false_alarm", FALSE_ALARM),
                                n_boot=settings.n_boot, seed=settings.seed,
                                agent_transfer=getattr(settings, "agent_transfer", False))
    run._timed("shift_guard", t0)
    # --- end shift guard ---
    ef = verifier() if callable(verifier) else verifier
    del states
    sweep_info = {}
    if extra_stage1 is not None:
        ds, fs, sweep_info = extra_stage1(folds)
        draw_scorers |= ds
        full_scores |= fs
    draw_scorers |= transfer_scorers

    t0 = time.perf_counter()
    pools, records = pools_from_trajectories(trajs, regression_key="p2p_passed")
    filters: dict[str, Any] = {"ef_verifier": ef} if ef is not None else {}
    filters.update(draw_scorers)
    components = full_scores.pop("_components")
    distributions = {**{k: v for k, v in components.items() if k.startswith("q_")},
                     "s (LatentSift)": full_scores["latentsift"]}
    if ef is not None:
        distributions["EF verifier"] = {t: r.score for t, r in ef.items() if r.score is not None}
    names = {"ef_verifier": "LLM EF verifier (original workflow)", "latentsift": "LatentSift (paper)",
             "default": "LatentSift default (inner-CV choice)",
             "random": "random", "shortest_tokens": "shortest (tokens)", "shortest_chars": "shortest (chars)",
             "fewest_steps": "fewest steps"}
    names |= {name: f"LatentSift, bank and scorer from {a} only" for a, name in transfer_info.get("filters", {}).items()}
    small = "drop" if any(p.n < max(settings.ks) for p in pools) else "error"
    run_meta = dict(meta or {})
    run_meta |= {"folds": fold_info["folds"], "fingerprint": fingerprint.to_dict()}
    if ef is None:
        run_meta["stage4"] = NO_VERIFIER
    summary = evaluate_run(
        pools, filters, records, final_verifier=ef if ef is not None else no_verifier_table(trajs),
        ks=list(settings.ks), n_draws=settings.n_draws, seed=settings.seed, n_boot=settings.n_boot,
        reference="ef_verifier" if ef is not None else None, small_pools=small,
        ablations=ablation_tables(list(filters)), distributions=distributions, names=names,
        headline=[f for f in ("latentsift", "default", "ef_verifier", "random", "shortest_chars", "shortest_tokens",
                              "fewest_steps") if f in filters],
        meta=run_meta)
    data = summary.data if hasattr(summary, "data") else summary
    table = candidate_table(trajs)
    ids = table["traj_id"].tolist()
    scores = {name: np.array([sc.get(t, np.nan) for t in ids], dtype=float) for name, sc in full_scores.items()}
    if ef is not None:
        scores["ef_verifier"] = np.array([ef[t].score if ef[t].score is not None else np.nan for t in ids])
    data["selection"] = {
        "reference": "shortest_chars",
        "diagnostics": diagnostics_table(table, scores, reference="shortest_chars", n_boot=settings.n_boot,
                                         seed=settings.seed),
        "retention_difference": retention_differences(summary.ledger, "shortest_chars", settings.ks,
                                                      n_boot=settings.n_boot, seed=settings.seed),
        "default_choice": [{"fold": f["fold"], **f.get("variants", {})} for f in fold_info["folds"]],
        "per_agent_retention": per_agent_retention(summary.ledger, trajs, settings.ks),
        "training_size": {"fractions": [f"{round(100 * f)}%" for f in settings.curve_fractions],
                          "bank_trajectories": run.curve_sizes,
                          "rule": "nested subsets of bank instances in a seeded hash order; gated head "
                                  "(SPEC 5 settings) and logistic probe refitted on each"},
        "sweep": sweep_info,
        "agent_transfer": transfer_info,
    }
    data["shift_guard"] = guard_info
    run._timed("evaluate", t0)
    # --- pruning (issue 17) ---
    # offline early pruning by prefix truncation of the stored states (latentsift.prune); reuses the
    # folds' banks and scorers; stored in summary.json under "pruning". Token counts need the tokenizer
    # (reproduce has it; crossval on stored states alone skips this section and says so)
    if tokenizer is not None:
        from .prune import reproduce_pruning
        t0 = time.perf_counter()
        data["pruning"] = reproduce_pruning(
            run, trajs, store, tokenizer, folds,
            cascade={"stage1": draw_scorers["latentsift"], "records": records, "final_verifier": ef}
            if ef is not None else None)
        run._timed("prune", t0)
    else:
        log("[prune] skipped: the offline pruning evaluation needs the policy's tokenizer (run reproduce)")
    # --- end pruning ---
    run.timings["total"] = round(time.perf_counter() - t_all, 2)
    atomic_write_json(out / "timings.json", run.timings)  # kept out of summary.json: wall times vary run to run
    # --- protocol hook: before write_report
    write_report(summary, report_dir)
    log(f"report: {report_dir / 'report.md'}")
    # --- explorer (issue 18): per-candidate Stage-1 results (scores, evidence, retained sets) and the site ---
    from .explore import save_stage1, write_run_site
    pools_path = Path(getattr(settings, "pools", None) or out / "pools.jsonl")
    save_stage1(draw_scorers, out / "stage1",
                tables={"ef_verifier": {t: r.score for t, r in ef.items()}} if ef is not None else None,
                seed=settings.seed, inputs={"pools": str(pools_path.resolve())}, fingerprint=fingerprint.to_dict())
    log(f"explorer: {write_run_site(out, pools=pools_path)}")
    # --- end explorer ---
    return report_dir


def crossval(pools_path: str | Path, states_dir: str | Path, out: str | Path, *, group_by: str = "repo",
             n_folds: int = 4, ks: Sequence[int] = (4, 5, 6), n_draws: int = 200, seed: int = 0,
             verifier: str | Path | None = None, instances: int | None = None, log: Callable[[str], None] = print,
             progress: Callable[[str, int, int, str], None] | None = None, **protocol) -> Path:
    """``latentsift crossval``: the reproduce protocol on any labelled pools with stored states.

    ``protocol``: the other ``CrossvalSettings`` fields (``n_boot``, ``scorer_epochs``, ``variants``,
    ``curve_fractions``, ``agent_transfer``). ``instances``: only the first N instances by id (the
    rule of ``extract --instances N``). Every input is checked before anything is written:
    labels, states, fold classes and verifier results. Returns the report folder.
    """
    from .reproduce import Run
    from .extract import select_instances
    from .store import StateStore
    from .trajectory import load_jsonl

    several = not isinstance(pools_path, (str, Path)) or not isinstance(states_dir, (str, Path))
    if several:  # several runs and stores (same model and settings): read as one (latentsift.library)
        from .library import load_runs
        pools_paths = [pools_path] if isinstance(pools_path, (str, Path)) else list(pools_path)
        states_dirs = [states_dir] if isinstance(states_dir, (str, Path)) else list(states_dir)
        pools_path = Path(out) / "pools.jsonl"  # the combined pools, written below (the explorer reads them)
        protocol.setdefault("sources", {"pools": [str(p) for p in pools_paths], "states": [str(d) for d in states_dirs]})
        states_dir = states_dirs[0]
    s = CrossvalSettings(pools=str(pools_path), states=str(states_dir), out=str(out), group_by=group_by,
                         n_folds=n_folds, ks=tuple(ks), n_draws=n_draws, seed=seed,
                         verifier=None if verifier is None else str(verifier), instances=instances, **protocol)
    t_all = time.perf_counter()
    if several:
        trajs, store = load_runs(pools_paths, states_dirs, "crossval", instances=instances)
    else:
        trajs = select_instances(load_jsonl(pools_path), instances)
        check_labelled(trajs, "crossval")
        if not Path(states_dir).is_dir():
            raise LatentSiftError(f"crossval: no state store at {str(states_dir)!r}; run 'latentsift extract "
                                  f"{pools_path} --out {states_dir}' first.")
        store = StateStore(states_dir).open()
        check_states_present(store, trajs, "crossval")
    leak = {"on_leak": s.on_leak, "pools": []}
    if s.on_leak == "skip":  # leave out (named) the pools whose instance a fold's bank would hold
        leak["pools"] = leaking_pools(trajs, group_by)
        bad = {x["instance_id"] for x in leak["pools"]}
        trajs = [t for t in trajs if t.instance_id not in bad]
        for x in leak["pools"]:
            log(f"[leak] {x['instance_id']}: candidates of several {group_by}s {x['groups']}; {x['action']}")
        if not trajs:
            raise LatentSiftError(f"crossval: every pool straddles {group_by}s; nothing is left to evaluate. "
                                  "Use --group-by repo.")
    check_group_by(trajs, group_by, "crossval")
    run = Run(s, log=log, progress=progress)
    folds = run.folds(trajs)
    check_folds(trajs, folds, run.group, "crossval")
    ef = None
    if verifier is not None:
        from .verifier import load_results
        _, ef, _ = load_results(verifier)
        missing = [t.traj_id for t in trajs if t.traj_id not in ef]
        if missing:
            raise LatentSiftError(f"crossval: the verifier results {str(verifier)!r} have no result for "
                                  f"{len(missing)} candidates, e.g. {missing[0]!r}.")
        ef = {t.traj_id: ef[t.traj_id] for t in trajs}
    run.out.mkdir(parents=True, exist_ok=True)
    if several:
        from .trajectory import save_jsonl
        save_jsonl(trajs, pools_path)
    if (run.out / "report" / "summary.json").exists():
        (run.out / "report" / "summary.json").unlink()  # presence of summary.json = this run finished
    atomic_write_json(run.out / "manifest.json", {"command": "latentsift crossval", "settings": s.to_dict(),
                                                  "format": 1})
    meta = {"crossval": s.to_dict(), "group_by": group_by,
            "stage3": "not evaluated (no generated tests): Stage 3 is skipped and never charged",
            "stage2": "regression = tests.p2p_passed where the pools record it; rule 'skip-stage'",
            "leak": leak}
    return evaluate_protocol(run, trajs, store, tokenizer=None, verifier=ef, meta=meta, t_all=t_all)
