"""``latentsift filter`` on files, the one driver of the command: its options declared once with their
constraints and cross-option rules (``FilterOptions``, checked when built), then the pools, states, bank and
scorer (or a sifter) loaded, every pool scored with the chosen filter (``latentsift.sift.rules``), the keep
rule applied (the paper's, a registered one, or the recall-targeted one) and FILTER.json written under the
output guard and lock (``filter_to_file``)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, ClassVar, ContextManager, Sequence

from .._core.outputs import owned_output
from .._core.params import (COUNT, FLAG, OUT, POSITIVE, RATE, RAY_ADDRESS, RECALL, SEED, STATE_STORE, CommandOptions,
                            ExistingPath, Interval, Matches, OneOf, Registered, Rule, option)
from .._core.threads import blas_fixed
from .._core.validation import LatentSiftError, check_choice
from ..bank.bank import Bank
from ..deploy.leak import ON_LEAK, apply_on_leak, shared_repos
from ..deploy.library import BANK_CHOICES
from ..sift.rules import filter_entry, make_baseline, method_names
from ..scale.approx import approx_bank  # ray and faiss themselves load only when used
from ..scale.bank import shard_bank
from ..scale.cluster import RAY_LOCAL, require_ray
from ..sift.scorer import LinearScorer
from ..deploy.operating import target_recall_filter
from ..deploy.shift import ON_SHIFT, Reference, guard
from ..sift.calibration import DEFAULT_CALIBRATION, calibration_methods
from ..sift.keep import FixedKeep, keep_rules
from ..sift.retain import KEEP_FRAC, MIN_KEEP, TARGET_MIN_KEEP
from ..sift.margin import DISTANCES, WEIGHTINGS
from ..sift.sift import FilterRun, LatentSift, Stage1Filter, load_selected_pools
from ..states.store import StateStore, check_recorded_settings
from ..deploy.operating_file import OPERATING_POINT_JSON
from ..deploy.sifter import sifter_has_bank
from ..trajectories.trajectory import CHANNELS
from .calibration import calibration_guard, calibration_pools_for_filter
from .operating import COSTS, check_saved_rule, keep_rule_filter, saved_operating_point, target_recall_options
from .sifter import _sifter_filter_chosen

#: ``filter --method`` by default: the paper's filter (a name: the registry is read, and the plugins loaded, only
#: when the command runs or its help is shown). ``--keep-rule`` by default: the paper's rule, or with
#: ``--target-recall`` the recall rule (decided when the command runs).
DEFAULT_METHOD = LatentSift.name

__all__ = ["DEFAULT_CALIBRATION", "DEFAULT_METHOD", "FILTER_RULES", "FilterOptions", "FilterOutcome", "KEEP_FRAC",
           "MIN_KEEP", "TARGET_MIN_KEEP", "calibration_methods", "filter_options", "filter_to_file", "keep_rules",
           "method_names", "run_filter"]


def _channels_ok(text: str) -> bool:
    chans = [c.strip() for c in text.split(",") if c.strip()]
    return bool(chans) and len(set(chans)) == len(chans) and set(chans) <= set(CHANNELS)


def _sifter_given(s) -> list[str]:
    """The method settings given beside --sifter (it keeps those it was fitted with)."""
    return [o for o, v in (("--channels", s.channels), ("--distance", s.distance), ("--weighting", s.weighting),
                           ("--fusion-weight", s.fusion_weight), ("--distance-only", s.distance_only or None),
                           ("--learned-only", s.learned_only or None)) if v is not None]


def _on_ray(s) -> bool:
    return s.ray_address is not None or s.bank_shards is not None


#: The cross-option rules of ``filter`` (each a contradiction and its one line), checked in this order.
FILTER_RULES = (
    Rule(lambda s: s.distance_only and s.learned_only, "Pass at most one of --distance-only and --learned-only."),
    Rule(lambda s: _on_ray(s) and s.approx is not None, "Pass --approx or --ray/--bank-shards, not both."),
    Rule(lambda s: s.bank_choice != "all" and s.sifter is None,
         "--bank-choice needs --sifter (a sifter fitted with 'latentsift fit --per-agent')."),
    Rule(lambda s: s.sifter is not None and (s.bank is not None or s.scorer is not None or s.method != DEFAULT_METHOD),
         "--sifter replaces --bank, --scorer and --method: pass only --sifter."),
    Rule(lambda s: s.sifter is not None and (_on_ray(s) or s.approx is not None),
         "--sifter runs in one process: drop --ray, --bank-shards and --approx."),
    Rule(lambda s: s.sifter is not None and _sifter_given(s),
         lambda s: f"--sifter scores with the settings it was fitted with: drop {', '.join(_sifter_given(s))}."),
    Rule(lambda s: s.cost == "tokens", "--cost tokens needs each candidate's verifier token count, which no input "
         "of 'filter' holds (the verifier runs after Stage 1); use --cost calls, the candidates kept."),
    Rule(lambda s: s.max_keep is not None and s.target_recall is None and s.operating_point is None,
         "--max-keep caps the recall-targeted rule: pass --target-recall R (or --operating-point)."),
    Rule(lambda s: (s.target_recall is not None or s.operating_point is not None)  # the cap is the recall rule's
         and None not in (s.min_keep, s.max_keep) and s.min_keep > s.max_keep,
         lambda s: f"--min-keep {s.min_keep} exceeds --max-keep {s.max_keep}: a pool cannot keep at least "
                   f"{s.min_keep} and at most {s.max_keep}; lower --min-keep or raise --max-keep."),
)

_OPTIONAL_FILE = (ExistingPath("file"), None)
_OPTIONAL_FOLDER = (ExistingPath("folder"), None)


@dataclass(frozen=True, kw_only=True)
class FilterOptions(CommandOptions):
    """The options of ``latentsift filter``, each declared once with the values it allows (``_core.params``),
    and its cross-option rules (``FILTER_RULES``); built = validated, before any file is read. The fields are
    the command's options (their flags in the declarations); ``channels`` and ``instances`` are the
    comma-separated text the user wrote. ``show``: pools printed as tables (the command line's)."""

    command: ClassVar[str] = "filter"
    rules: ClassVar[tuple[Rule, ...]] = FILTER_RULES

    pools: Path = option("POOLS", ExistingPath("file"))
    out: Path = option("--out", OUT)
    states: Path | None = option("--states", STATE_STORE, None, default=None)
    bank: Path | None = option("--bank", *_OPTIONAL_FOLDER, default=None)
    scorer: Path | None = option("--scorer", *_OPTIONAL_FOLDER, default=None)
    sifter: Path | None = option("--sifter", *_OPTIONAL_FOLDER, default=None)
    method: str = option("--method", Registered("filter"), default=DEFAULT_METHOD)
    channels: str | None = option("--channels", Matches(f"channels, comma-separated, each once: {', '.join(CHANNELS)}",
                                                        _channels_ok, "cot,foo"), None, default=None)
    distance: str | None = option("--distance", OneOf(DISTANCES), None, default=None)
    weighting: str | None = option("--weighting", OneOf(WEIGHTINGS), None, default=None)
    distance_only: bool = option("--distance-only", FLAG, default=False)
    learned_only: bool = option("--learned-only", FLAG, default=False)
    fusion_weight: float | None = option("--fusion-weight", Interval(Real, 0, 1), None, default=None)
    min_keep: int | None = option("--min-keep", POSITIVE, None, default=None)
    frac: float | None = option("--frac", Interval(Real, 0, 1), None, default=None)
    seed: int = option("--seed", SEED, default=0)
    evidence: int = option("--evidence", COUNT, default=3)
    instances: str | None = option("--instance-ids", Matches("instance ids, comma-separated",
                                                             lambda t: any(x.strip() for x in t.split(",")), ","),
                                   None, default=None)
    show: int = option("--show", COUNT, default=10)
    ray_address: str | None = option("--ray", RAY_ADDRESS, None, default=None)
    bank_shards: int | None = option("--bank-shards", POSITIVE, None, default=None)
    approx: str | None = option("--approx", Registered("index_kind"), None, default=None)
    on_shift: str | None = option("--on-shift", OneOf(ON_SHIFT), None, default=None)
    target_recall: float | None = option("--target-recall", RECALL, None, default=None)
    calibration: Path | None = option("--calibration", *_OPTIONAL_FILE, default=None)
    operating_point: Path | None = option("--operating-point", *_OPTIONAL_FILE, default=None)
    max_keep: int | None = option("--max-keep", POSITIVE, None, default=None)
    cost: str = option("--cost", OneOf(COSTS), default="calls")
    confidence: float | None = option("--confidence", RATE, None, default=None)
    calibration_states: Path | None = option("--calibration-states", STATE_STORE, None, default=None)
    calibration_method: str = option("--calibration-method", Registered("calibration"), default=DEFAULT_CALIBRATION)
    calibration_epochs: int = option("--calibration-epochs", POSITIVE, default=40)
    keep_rule: str | None = option("--keep-rule", Registered("keep_rule"), None, default=None)
    bank_choice: str = option("--bank-choice", OneOf(BANK_CHOICES), default="all")
    on_leak: str | None = option("--on-leak", OneOf(ON_LEAK), None, default=None)

    @property
    def instance_ids(self) -> list[str] | None:
        """``--instance-ids`` as a list (None: every pool)."""
        return None if self.instances is None else [x.strip() for x in self.instances.split(",") if x.strip()]

    def resolved(self) -> dict:
        """The settings the options resolve to (``filter_options``' result) for valid settings."""
        return _resolved(self)


def _resolved(s) -> dict:
    branches = "distance" if s.distance_only else "learned" if s.learned_only else "both"
    chosen = {"channels": None if s.channels is None else tuple(c.strip() for c in s.channels.split(",") if c.strip()),
              "distance": s.distance, "weighting": s.weighting, "fusion_weight": s.fusion_weight}
    return {"branches": branches, "on_leak": s.on_leak or ("allow" if s.sifter is not None else "error"),
            "sift_settings": {k: v for k, v in chosen.items() if v is not None} | {"branches": branches}}


def filter_options(*, method: str = LatentSift.name, bank_dir=None, scorer_dir=None, sifter_dir=None,
                   bank_choice: str = "all", on_leak: str | None = None, ray_address: str | None = None,
                   bank_shards: int | None = None, approx: str | None = None, distance_only: bool = False,
                   learned_only: bool = False, channels: str | None = None, distance: str | None = None,
                   weighting: str | None = None, fusion_weight: float | None = None) -> dict:
    """Check a ``latentsift filter`` combination of options (``FILTER_RULES``) before any work; the settings
    they resolve to.

    A sifter (``sifter_dir``) replaces the bank, the scorer and the method, and runs in one process;
    ``bank_choice`` other than "all" needs a sifter; Ray (``ray_address`` / ``bank_shards``) and the
    approximate search (``approx``) exclude each other, and Ray must be installed. A conflict raises
    ``LatentSiftError`` naming the options. Returns ``{"branches", "on_leak"}``: the LatentSift
    branches (both, or one of ``distance_only`` / ``learned_only``) and ``on_leak``, which defaults
    to "error" with a bank (evaluation: a bank holding a pool's instance is leakage) and to "allow"
    with a sifter (deployment: a bank that has seen other attempts at the task is knowledge), and
    ``sift_settings``: the LatentSift settings given (``channels`` comma-separated, ``distance``,
    ``weighting``, ``fusion_weight``; None = the filter's default) with the branches. A sifter keeps
    its saved settings, so any of them given with ``sifter_dir`` is refused.
    """
    s = SimpleNamespace(**FilterOptions.defaults() | dict(  # the other options at their defaults
        method=method, bank=bank_dir, scorer=scorer_dir, sifter=sifter_dir, bank_choice=bank_choice, on_leak=on_leak,
        ray_address=ray_address, bank_shards=bank_shards, approx=approx, distance_only=distance_only, learned_only=learned_only,
        channels=channels, distance=distance, weighting=weighting, fusion_weight=fusion_weight))
    for rule in FILTER_RULES:
        rule.check(s)
    if _on_ray(s):
        require_ray()
    return _resolved(s)


def run_filter(pools_path, states_dir=None, *, method: str = LatentSift.name, on_shift: str | None = None,
               on_leak: str = "error", **options) -> FilterRun:
    """``latentsift filter``: score every pool of a canonical JSONL file.

    ``method`` is a registered filter: a state filter (the paper's ``LatentSift``; built as
    ``factory(bank, scorer, **settings)``, needs ``bank_dir``, and ``scorer_dir`` unless
    ``branches="distance"``) or a rule filter (a baseline). ``settings`` go to the filter's constructor
    (``channels``, ``distance``, ``weighting``, ``branches``, ``fusion_weight``, ``min_keep``, ``frac``,
    ``seed``, ``n_evidence``). ``instances`` keeps only those pools. ``ray_address`` /
    ``bank_shards`` search the bank on Ray actors (same results, ``latentsift.scale``); ``approx``
    ("ivf" or "hnsw") searches it approximately with FAISS (off by default). ``on_shift``
    ("warn", "keep-all", "error"; None = no guard) runs the shift guard's state-space check against
    the bank (``latentsift.deploy.shift``; a bare bank records no agents, so that check is skipped).
    ``on_leak`` ("error", "skip", "allow"; ``latentsift.deploy.leak``) decides, per pool, what happens to a
    pool whose instance is in the bank; the decisions go to the output's ``leak`` section. Other ``options``:
    ``bank_dir``, ``scorer_dir``, ``instances``, ``ray_address``, ``bank_shards``, ``approx`` and the settings.
    ``method``, ``on_shift`` and ``on_leak`` are checked here (the command line checks them as ``FilterOptions``
    and calls ``_run_filter``).
    """
    check_choice(method, "method", "run_filter", method_names())
    check_choice(on_leak, "on_leak", "filter", ON_LEAK)
    if on_shift is not None:
        check_choice(on_shift, "on_shift", "run_filter", ON_SHIFT)
    return _run_filter(pools_path, states_dir, method=method, on_shift=on_shift, on_leak=on_leak, **options)


@blas_fixed
def _run_filter(pools_path, states_dir=None, *, bank_dir=None, scorer_dir=None, method: str,
                instances: Sequence[str] | None = None, ray_address: str | None = None, bank_shards: int | None = None,
                approx: str | None = None, on_shift: str | None, on_leak: str, **settings) -> FilterRun:
    """``run_filter`` with checked arguments."""
    pools = load_selected_pools(pools_path, instances)
    store = StateStore(states_dir).open() if states_dir is not None else None
    inputs = {"pools": str(Path(pools_path).resolve()),
              "states_dir": None if states_dir is None else str(Path(states_dir).resolve())}
    entry = filter_entry(method)
    stateful = entry.kind == "state"
    if stateful:
        if bank_dir is None or store is None:
            raise LatentSiftError(f"The {entry.name} filter needs --bank and --states.")
        bank = base_bank = Bank.load(bank_dir)
        check_recorded_settings(base_bank.source_.get("store_settings"), store, f"The bank {bank_dir}")
        # scale-out: the same bank searched on Ray shards, or approximately with FAISS
        if approx is not None:
            bank = approx_bank(bank, approx)
            inputs["approx"] = approx
        elif ray_address is not None or bank_shards is not None:
            bank = shard_bank(bank, bank_shards or 2, ray_address=ray_address or RAY_LOCAL)
            inputs["bank_shards"] = bank.n_shards_
        scorer = None
        if settings.get("branches", "both") != "distance":
            if scorer_dir is None:
                raise LatentSiftError(f"The {entry.name} filter needs --scorer (or --distance-only).")
            scorer = LinearScorer.load(scorer_dir)
            check_recorded_settings(scorer.source_.get("store_settings"), store, f"The scorer {scorer_dir}")
        filt: Stage1Filter = entry.factory(bank, scorer, **settings)
        pools, leak, leak_warnings = apply_on_leak(pools, bank, on_leak)
        inputs |= {"bank_dir": str(Path(bank_dir).resolve()), "bank_repos": bank.repo_names_,
                   "bank_label_counts": bank.label_counts(),
                   "scorer_dir": None if scorer_dir is None or scorer is None else str(Path(scorer_dir).resolve())}
        inputs["repos_shared_with_bank"] = shared_repos(pools, bank)
    else:
        filt = make_baseline(method, **settings)
    try:
        results = filt.score_pools(pools, store, fingerprint=None)
    finally:
        if hasattr(getattr(filt, "bank", None), "close"):
            filt.bank.close()
    fp = store.fingerprint.to_dict() if store is not None else None
    run = FilterRun(method=filt.name, settings=filt.get_params(), inputs=inputs, fingerprint=fp, pools=results)
    if stateful:
        run.extra["leak"] = {**leak, "warnings": leak_warnings}
    if stateful and on_shift is not None:
        # shift guard with a bare bank: it records no agents or scaffolds, so only the
        # state-space check runs (candidates' nearest-bank distances against the bank's own
        # leave-one-instance-out distances)
        states = store.load([c.traj_id for p in pools for c in p.candidates])
        shift, warnings = guard(results, pools, states, base_bank, Reference.from_bank(base_bank), on_shift)
        run.extra["shift"] = {**shift, "warnings": warnings}
    return run


@dataclass
class FilterOutcome:
    """What ``filter_to_file`` wrote: the ``run`` (saved to ``out``), the shift ``warnings``, the ``settings``
    the filter ran with, the resolved ``on_shift`` and ``target_recall``, and the ``operating_point``
    section (with a target recall) or the ``keep_rule`` section (another registered keep rule)."""

    run: FilterRun
    out: Path
    warnings: list[str]
    settings: dict
    on_shift: str
    target_recall: float | None = None
    operating_point: dict | None = None
    keep_rule: dict | None = None


def filter_to_file(s: FilterOptions, *, log: Callable[[str], None] = lambda m: None,
                   status: Callable[[str], ContextManager[Any]] = lambda m: contextlib.nullcontext()) -> FilterOutcome:
    """``latentsift filter`` with the settings ``s`` (validated when built): the output guarded and locked, then
    what needs the files checked before any work (the paths, a saved operating point, the calibration file:
    one-line refusals), the pools scored (``run_filter``'s or ``run_sifter_filter_chosen``'s work), the
    keep rule applied and FILTER.json written to ``s.out``. ``status(message)``: a context manager around each
    long stage (the command line's spinner); ``log(line)``: what the recall-targeted rule needs, before any
    work. With a target recall: ``confidence`` (the high-probability mode), a saved operating point
    (``operating_point``, or the sifter's own without ``calibration``: ``_jobs.operating``), ``max_keep``
    and ``cost`` (``_jobs.operating.target_recall_options``); the calibration pools are scored before the
    pools to filter, so that their states are refused first; a rule filter's pools are checked against
    the calibration pools (``calibration_guard``)."""
    if _on_ray(s):
        require_ray()
    resolved = s.resolved()
    pools, states, bank, scorer, sifter, method = s.pools, s.states, s.bank, s.scorer, s.sifter, s.method
    calibration, instances = s.calibration, s.instance_ids
    with owned_output(s.out, [pools, states, bank, scorer, sifter, calibration, s.calibration_states,
                              s.operating_point], file="filter") as owned:  # a second filter to this --out is refused
        out = owned.path                                                     # while this one runs
        s.check_paths()
        saved = saved_operating_point(operating_point=s.operating_point, target_recall=s.target_recall,
                                      confidence=s.confidence, calibration=calibration, sifter_dir=sifter, pools=pools,
                                      instances=instances)
        target = target_recall_options(target_recall=s.target_recall, calibration=calibration,
                                       bank_choice=s.bank_choice, calibration_method=s.calibration_method,
                                       calibration_epochs=s.calibration_epochs, on_shift=s.on_shift,
                                       min_keep=s.min_keep, keep_rule=s.keep_rule, pools=pools, instances=instances,
                                       confidence=s.confidence, saved=saved is not None, max_keep=s.max_keep,
                                       frac=s.frac)
        target_recall, on_shift, min_keep = target["target_recall"], target["on_shift"], target["min_keep"]
        rule = target["rule"]
        if saved is not None:
            check_saved_rule(saved, s.operating_point or Path(sifter, OPERATING_POINT_JSON), keep_rule=s.keep_rule,
                             min_keep=min_keep, max_keep=s.max_keep)
            target_recall, min_keep, rule = saved[0].target_recall, saved[0].min_keep, saved[0].name
        frac = KEEP_FRAC if s.frac is None else s.frac
        if saved is not None:
            log(f"operating point {saved[1]['path']} (fitted on {saved[0].n_calibration_pools_} calibration pools "
                "with a resolved candidate): applied without refitting.")
        elif target_recall is not None:  # before any work: what the bound needs and what the calibration file has
            given = "" if s.confidence is None else f" --confidence {s.confidence:g}"
            log(f"--target-recall {target_recall:g}{given}"
                + f" needs at least {target['needed']} calibration pools holding a resolved candidate; {calibration} "
                f"has {target['have']}.")
        settings: dict = {"min_keep": min_keep, "frac": frac, "seed": s.seed}
        stateful = sifter_has_bank(sifter) if sifter is not None else filter_entry(method).kind == "state"
        if sifter is None and stateful:
            settings |= resolved["sift_settings"]
        cal = None
        if (target_recall is not None and saved is None) or (rule != FixedKeep.name and calibration is not None):
            with status("calibrating ..."):  # first: its states are checked (and refused) before the pools are scored
                cal = calibration_pools_for_filter(calibration, s.calibration_states or states, method=method,
                                                   bank_dir=bank, scorer_dir=scorer, sifter_dir=sifter,
                                                   settings=dict(settings), scorer_epochs=s.calibration_epochs,
                                                   states_dir=states)
        if sifter is not None:
            settings["n_evidence"] = s.evidence
            with status("scoring ..."):
                run, warnings = _sifter_filter_chosen(pools, states, sifter, bank_choice=s.bank_choice,
                                                      on_shift=on_shift, on_leak=resolved["on_leak"],
                                                      instances=instances, **settings)
            settings["channels"] = tuple(run.settings["channels"])
        else:
            if stateful:
                settings["n_evidence"] = s.evidence
            with status("scoring ..."):
                run = _run_filter(pools, states, bank_dir=bank, scorer_dir=scorer, method=method, instances=instances,
                                  ray_address=s.ray_address, bank_shards=s.bank_shards, approx=s.approx,
                                  on_shift=on_shift if stateful else None, on_leak=resolved["on_leak"], **settings)
            warnings = list(run.extra.get("shift", {}).get("warnings", []))
        if cal is not None and target_recall is not None and not stateful:  # a rule has no bank: the guard
            calibration_guard(run, pools, states, cal, on_shift, instances)     # compares with the calibration pools
            warnings = list(run.extra.get("shift", {}).get("warnings", []))
        outcome = FilterOutcome(run, out, warnings, settings, on_shift, target_recall)
        if target_recall is not None:
            outcome.operating_point = target_recall_filter(run, target_recall, cal, method=s.calibration_method,
                                                           min_keep=min_keep, on_shift=on_shift,
                                                           confidence=target["confidence"], saved=saved,
                                                           max_keep=target["max_keep"], rule=rule)
        elif rule != FixedKeep.name:
            outcome.keep_rule = keep_rule_filter(run, rule, cal if calibration is not None else None)
        run.save(out)
    return outcome
