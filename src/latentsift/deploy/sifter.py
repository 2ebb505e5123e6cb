"""A saved sifter: the bank and the scorer fitted on all of a team's labelled trajectories.

``Sifter.fit`` builds the paper's bank and gated scorer from every given labelled trajectory and
records the in-bank evidence for the configuration (cross-fitted within-pool AUC of the paper's
distance branch over inner repository folds of the bank; no scorer is retrained for it). The
configuration choice is restricted to the paper's method: the inner-CV choice among the
stacked variants of ``reproduce`` needs one probe and stack per inner fold and candidate set and
is not run here (``config["choice"]`` says so). ``save(dir)`` writes one directory:

    SIFTER_DIR/bank/        the bank (safetensors + manifest)
    SIFTER_DIR/scorer/      the gated linear scorer (safetensors + json)
    SIFTER_DIR/sifter.json  format, model fingerprint, configuration and its evidence, the agents,
                            scaffolds and repositories seen, the shift guard's reference numbers
    SIFTER_DIR/library/     with ``fit(per_agent=True)``: a bank and scorer per agent (and per
                            scaffold where they differ), listed in sifter.json "library" with each
                            one's shift reference (``latentsift.deploy.library``)

The directory is written beside the target and renamed into place: a failed save leaves nothing.
``Sifter.load(path)`` gives a Stage-1 filter with the verbs of the others (``prepare``,
``prepare_many``, ``rank_subset``, ``retained_subset``, ``score``, ``score_pools``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._core.io import ArtefactKind, jsonable, member, output_lock, read_artefact, replaced_folder, write_artefact
from .._core.validation import FingerprintMismatch, LatentSiftError, check_choice, check_labelled
from ..bank.bank import Bank, Fold, as_fingerprint, inner_folds
from ..metrics.diagnostics import within_pool_auc
from .leak import ON_LEAK, apply_on_leak
from .library import BANK_CHOICES, SubBank, fit_sub_banks, load_sub_banks, load_runs, nearest_choice, pool_distances, \
    save_sub_banks
from ..sift.rank import grouped_normalized_ranks, min_channel_rank
from ..sift.scorer import LinearScorer
from .shift import (FALSE_ALARM, ON_SHIFT, REFERENCE_KIND, REFERENCE_KINDS, Reference, check_false_alarm, guard,
                    scaffold_of)
from ..sift.sift import FilterRun, LatentSift, load_selected_pools, resolve_states
from ..states.store import StateStore, check_recorded_settings
from ..trajectories.trajectory import Trajectory

SIFTER_FORMAT = "latentsift-sifter"
SIFTER_VERSION = 1
SIFTER_JSON = "sifter.json"
SIFTER_ARTEFACT = ArtefactKind(SIFTER_FORMAT, SIFTER_VERSION, SIFTER_JSON, noun="a sifter directory",
                               make="make one with 'latentsift fit'", redo="fit the sifter again")


class Sifter(LatentSift):
    """The paper's Stage-1 filter with its provenance: fitted on labelled trajectories, saved, loaded.

    Extra attributes after ``fit`` / ``load``: ``config_`` (method, settings, choice and its
    evidence), ``seen_`` (agents, scaffolds, repositories, counts), ``reference_`` (the shift guard's
    ``shift.Reference``).
    """

    name = "latentsift-sifter"

    def __init__(self, bank: Bank | None = None, scorer: LinearScorer | None = None, *, scorer_epochs: int = 40,
                 **settings):
        self.scorer_epochs = scorer_epochs
        self._settings = settings
        if bank is not None:
            super().__init__(bank, scorer, **settings)

    # ------------------------------------------------------------------ fit
    def fit(self, trajs: Sequence[Trajectory], states, *, fingerprint: Any = None, per_agent: bool = False,
            log=lambda m: None, false_alarm: float | None = None, reference_kind: str | None = None) -> "Sifter":
        """Bank + scorer from every trajectory of ``trajs`` (all labelled); ``states``: dict or store.

        ``per_agent``: also a sub-bank and scorer per agent (and per scaffold where they differ) in
        ``library_`` (``latentsift.deploy.library``), for ``filter --bank-choice nearest``.
        ``false_alarm`` / ``reference_kind``: the shift guard's stated false-alarm rate and in-bank
        reference (``shift.Reference.from_bank``; defaults ``shift.FALSE_ALARM``, ``shift.REFERENCE_KIND``),
        for the all-agent bank and every sub-bank.
        """
        trajs = list(trajs)
        check_labelled(trajs, "fit")
        ids = sorted(t.traj_id for t in trajs)
        sts, fp = resolve_states(states, ids, fingerprint, owner="fit")
        labels = {t.traj_id: int(t.label) for t in trajs}
        seed = self._settings.get("seed", 0)
        bank = Bank.from_trajectories(trajs, sts, fp)
        log(f"[fit] bank: {bank.label_counts()}; training the scorer ({self.scorer_epochs} epochs)")
        scorer = LinearScorer(max_epochs=self.scorer_epochs, seed=seed).fit(
            [sts[i] for i in ids], [labels[i] for i in ids], fingerprint=fp)
        super().__init__(bank, scorer, **self._settings)
        agents = sorted({t.agent for t in trajs})
        scaffolds = sorted({scaffold_of(t) for t in trajs})
        self.config_ = {"method": "latentsift", "settings": LatentSift.get_params(self),
                        "scorer_epochs": self.scorer_epochs,
                        "choice": {"chosen": "latentsift", "restricted": True,
                                   "reason": "fit evaluates the paper's method only; the inner-CV choice among "
                                             "the stacked variants runs in 'crossval'/'reproduce' (see its "
                                             "report's default-choice lines before switching)"},
                        "evidence": in_bank_evidence(bank, trajs, sts, fp, seed=seed)}
        self.seen_ = {"agents": agents, "scaffolds": scaffolds, "repos": sorted({t.repo for t in trajs}),
                      "n_trajectories": len(trajs), "n_instances": len({t.instance_id for t in trajs}),
                      "label_counts": bank.label_counts()}
        ref_kw = {"kind": reference_kind or REFERENCE_KIND,
                  "false_alarm": FALSE_ALARM if false_alarm is None else false_alarm}
        self.reference_ = Reference.from_bank(bank, agents=agents, scaffolds=scaffolds, **ref_kw)
        self.library_: list[SubBank] = []
        self.library_skipped_: list[dict] = []
        if per_agent:
            self.library_, self.library_skipped_ = fit_sub_banks(trajs, sts, fp, scorer_epochs=self.scorer_epochs,
                                                                 seed=seed, log=log, reference_kw=ref_kw)
        return self

    # ------------------------------------------------------------------ io
    def manifest(self) -> dict:
        return jsonable({"format": SIFTER_FORMAT, "version": SIFTER_VERSION,
                         "fingerprint": self.bank.fingerprint_.to_dict(), "config": self.config_,
                         "seen": self.seen_, "shift_reference": self.reference_.to_dict(),
                         "parts": {"bank": "bank", "scorer": "scorer"},
                         "library": [s.to_dict() for s in getattr(self, "library_", [])],
                         "library_skipped": getattr(self, "library_skipped_", [])})

    def save(self, path: str | Path) -> Path:
        """Write SIFTER_DIR (module docstring) into a sibling temporary folder, then rename it."""
        if not hasattr(self, "config_"):
            raise LatentSiftError("This Sifter is not fitted yet: call fit(...) or Sifter.load(path) first.")
        path = Path(path)
        if path.exists() and not (path / SIFTER_JSON).is_file():
            raise LatentSiftError(f"{path} exists and is not a sifter directory; choose another --out.")
        with replaced_folder(path) as tmp:  # the umask's permissions; an old sifter stays until the new is whole
            recorded = getattr(self, "store_settings_", None)  # the states' settings, checked by filter
            self.bank.save(tmp / "bank", source={"sifter": True} | ({"store_settings": recorded} if recorded else {}))
            self.scorer.save(tmp / "scorer", plot=False)
            save_sub_banks(getattr(self, "library_", []), tmp)
            write_artefact(tmp, SIFTER_ARTEFACT, self.manifest())
        return path

    @classmethod
    def load(cls, path: str | Path, *, fingerprint: Any = None, **settings) -> "Sifter":
        """Read a SIFTER_DIR; with ``fingerprint``, refuse a sifter fitted on another model's states.

        ``settings`` override the saved filter settings (e.g. ``min_keep``, ``frac``, ``n_evidence``).
        """
        path = Path(path)
        mpath = path / SIFTER_JSON
        man, _ = read_artefact(path, SIFTER_ARTEFACT)
        if fingerprint is not None:
            check_sifter_fingerprint(man, fingerprint, path)
        parts = man.get("parts") if isinstance(man.get("parts"), dict) else {}
        bank = Bank.load(member(path, parts.get("bank"), mpath))
        scorer = LinearScorer.load(member(path, parts.get("scorer"), mpath))
        params = {k: v for k, v in man["config"]["settings"].items()} | settings
        params["channels"] = tuple(params["channels"])
        s = cls(bank, scorer, scorer_epochs=man["config"].get("scorer_epochs", 40), **params)
        s.config_, s.seen_ = man["config"], man["seen"]
        s.reference_ = Reference(**man["shift_reference"])
        s.library_ = load_sub_banks(man.get("library", []), path)
        s.library_skipped_ = man.get("library_skipped", [])
        s.path_ = str(path.resolve())
        return s


def check_sifter_fingerprint(man: dict, fingerprint: Any, path) -> None:
    want = as_fingerprint(man["fingerprint"], "Sifter.load")
    got = as_fingerprint(fingerprint, "Sifter.load")
    if want.digest != got.digest:
        diff = {k: (getattr(want, k), getattr(got, k)) for k in want.__dataclass_fields__
                if getattr(want, k) != getattr(got, k)}
        raise FingerprintMismatch(
            f"The sifter {str(path)!r} was fitted on states of another model than the candidates' states "
            f"(sifter fingerprint {want.digest}, states {got.digest}; differing: {diff}). Extract the "
            "candidates' states with the sifter's model, or fit a sifter on states of this model.")


def fold_distance(fold: Fold, states, fingerprint, *, seed: int = 0) -> dict[str, dict[str, float]]:
    """traj_id -> channel -> q of the paper's distance branch for the evaluation pools of one fold,
    with a bank of the fold's bank side."""
    bank = Bank.from_trajectories(fold.bank_trajs, states, fingerprint)
    q: dict[str, dict[str, float]] = {}
    for p in LatentSift(bank, None, branches="distance", seed=seed).prepare_many(
            fold.eval_pools, states, fingerprint=fingerprint).values():
        for r, t in enumerate(p.traj_ids):
            q[t] = {c: float(p.q[r, j]) for j, c in enumerate(p.channels)}
    return q


def cross_fit_distance(folds: Sequence[Fold], states, fingerprint, *, seed: int = 0) -> dict[str, dict[str, float]]:
    """``fold_distance`` over inner ``folds`` (``bank.inner_folds``): cross-fitted q of every trajectory."""
    q: dict[str, dict[str, float]] = {}
    for f in folds:
        q |= fold_distance(f, states, fingerprint, seed=seed)
    return q


def distance_auc(q: dict[str, dict[str, float]], trajs: Sequence[Trajectory]) -> float:
    """Within-pool AUC of the paper's distance branch (minimum channel rank) on cross-fitted ``q``."""
    by = {t.traj_id: t for t in trajs}
    ids = sorted(q)
    inst = np.array([by[t].instance_id for t in ids])
    y = np.array([int(by[t].label) for t in ids])
    ranks = np.stack([grouped_normalized_ranks(np.array([q[t][c] for t in ids]), inst) for c in ("cot", "obs", "fn")])
    return within_pool_auc(inst, y, min_channel_rank(ranks)).auc


def in_bank_evidence(bank: Bank, trajs: Sequence[Trajectory], states, fingerprint, *, seed: int = 0) -> dict:
    """Cross-fitted within-pool AUC of the paper's distance branch on the bank (inner repository folds).

    Two repository-disjoint halves: a bank from one half scores the pools of the other. NaN when the
    trajectories span fewer than two repositories or a half has one class only.
    """
    if len({t.repo for t in trajs}) < 2:
        return {"paper-distance_within_pool_auc": None, "reason": "one repository: no inner folds"}
    folds = list(inner_folds(trajs, seed=seed))
    if any(len({int(t.label) for t in f.bank_trajs}) < 2 for f in folds):
        return {"paper-distance_within_pool_auc": None, "reason": "an inner fold's bank has one class only"}
    auc = distance_auc(cross_fit_distance(folds, states, fingerprint, seed=seed), trajs)
    return {"paper-distance_within_pool_auc": None if np.isnan(auc) else float(auc),
            "rule": "2 inner repository folds; bank from one, pools of the other; ties 1/2"}


def fit_sifter(pools_path, states_dir, out, *, scorer_epochs: int = 40, seed: int = 0, instances: int | None = None,
               per_agent: bool = False, false_alarm: float | None = None, reference_kind: str | None = None,
               log=print) -> Sifter:
    """``latentsift fit``: a sifter from every labelled candidate of one or several pools files, saved to ``out``.

    ``pools_path`` / ``states_dir``: a path or a list of paths (several runs, e.g. the Lite pools and
    the Verified pairs); the stores must share the model fingerprint and the value-changing extraction
    settings (refused before any work otherwise, ``library.open_stores``). ``instances``: only the
    first N instances by id of each pools file (the rule of ``extract --instances N``). ``per_agent``:
    also a sub-bank and scorer per agent (``Sifter.fit``).
    """
    if reference_kind is not None:
        check_choice(reference_kind, "reference", "fit", REFERENCE_KINDS)
    if false_alarm is not None:
        check_false_alarm(false_alarm, "--false-alarm", "fit")
    pools_paths = [pools_path] if isinstance(pools_path, (str, Path)) else list(pools_path)
    states_dirs = [states_dir] if isinstance(states_dir, (str, Path)) else list(states_dir)
    with output_lock(out):  # a second 'fit' to the same --out is refused, not lost
        trajs, store = load_runs(pools_paths, states_dirs, "fit", instances=instances)
        sifter = Sifter(scorer_epochs=scorer_epochs, seed=seed).fit(trajs, store, per_agent=per_agent, log=log,
                                                                    false_alarm=false_alarm,
                                                                    reference_kind=reference_kind)
        sifter.store_settings_ = store.settings
        sifter.save(out)
    return sifter


def run_sifter_filter(pools_path, states_dir, sifter_dir, *, on_shift: str = "warn", on_leak: str = "allow",
                      instances: Sequence[str] | None = None, **settings):
    """``latentsift filter --sifter``: the saved sifter on every pool, with the shift guard.

    Returns the ``FilterRun`` (the format of ``filter``) with ``configuration`` (the sifter's
    config and what it has seen), ``shift`` (per pool: the decision and its numbers) and ``leak``.
    ``on_leak`` defaults to "allow": a sifter is a deployed filter, and a bank that has seen other
    attempts at a pool's task is knowledge, not leakage (``latentsift.deploy.leak``); each such pool is
    named in the output and in the warnings.
    """
    check_choice(on_shift, "on_shift", "filter", ON_SHIFT)
    check_choice(on_leak, "on_leak", "filter", ON_LEAK)
    pools = load_selected_pools(pools_path, instances)
    if states_dir is None:
        raise LatentSiftError("filter --sifter needs --states (the candidates' states).")
    store = StateStore(states_dir).open()
    sifter = Sifter.load(sifter_dir, fingerprint=store.fingerprint, **settings)
    check_recorded_settings(sifter.bank.source_.get("store_settings"), store, f"The sifter {sifter_dir}")
    pools, leak, leak_warnings = apply_on_leak(pools, sifter.bank, on_leak)
    ids = [c.traj_id for p in pools for c in p.candidates]
    missing = [t for t in ids if not store.has(t)]
    if missing:
        raise LatentSiftError(f"filter: the state store {str(states_dir)!r} has no states for {len(missing)} "
                              f"candidates, e.g. {missing[0]!r}; run 'latentsift extract' on the pools first.")
    states = store.load(ids)
    results = sifter.score_pools(pools, states, fingerprint=store.fingerprint)
    shift, warnings = guard(results, pools, states, sifter.bank, sifter.reference_, on_shift)
    inputs = {"pools": str(Path(pools_path).resolve()), "states_dir": str(Path(states_dir).resolve()),
              "sifter_dir": sifter.path_, "bank_repos": sifter.bank.repo_names_,
              "bank_label_counts": sifter.bank.label_counts()}
    eval_repos = sorted({c.repo for p in pools for c in p.candidates})
    inputs["repos_shared_with_bank"] = sorted(set(eval_repos) & set(sifter.bank.repo_names_))
    run = FilterRun(method=sifter.name, settings=sifter.get_params(), inputs=inputs,
                    fingerprint=store.fingerprint.to_dict(), pools=results)
    run.extra = {"configuration": {"config": sifter.config_, "seen": sifter.seen_},
                 "shift": shift, "leak": {**leak, "warnings": leak_warnings}}
    return run, warnings


def run_sifter_filter_chosen(pools_path, states_dir, sifter_dir, *, bank_choice: str = "nearest",
                             on_shift: str = "warn", on_leak: str = "allow", instances: Sequence[str] | None = None,
                             **settings):
    """``latentsift filter --sifter --bank-choice nearest``: each pool scored with the sub-bank nearest to it.

    The sifter must have a bank library (``fit --per-agent``). Per pool: the median nearest-bank
    distance of its candidates to every sub-bank (the shift guard's distance), the nearest one's bank
    and scorer score it, and the shift guard judges it against that sub-bank's reference. The
    ``FilterRun`` gains ``bank_choice`` (mode, sub-banks, per pool the choice and the distances).
    ``bank_choice="all"`` is ``run_sifter_filter``. ``on_leak`` as there, against the all-agent bank
    (every sub-bank's trajectories are in it).
    """
    check_choice(bank_choice, "bank_choice", "filter", BANK_CHOICES)
    if bank_choice == "all":
        return run_sifter_filter(pools_path, states_dir, sifter_dir, on_shift=on_shift, on_leak=on_leak,
                                 instances=instances, **settings)
    check_choice(on_shift, "on_shift", "filter", ON_SHIFT)
    check_choice(on_leak, "on_leak", "filter", ON_LEAK)
    if states_dir is None:
        raise LatentSiftError("filter --sifter needs --states (the candidates' states).")
    pools = load_selected_pools(pools_path, instances)
    store = StateStore(states_dir).open()
    sifter = Sifter.load(sifter_dir, fingerprint=store.fingerprint, **settings)
    if not sifter.library_:
        raise LatentSiftError(f"filter --bank-choice {bank_choice}: the sifter {str(sifter_dir)!r} has no bank "
                              "library; refit it with 'latentsift fit --per-agent', or use --bank-choice all.")
    check_recorded_settings(sifter.bank.source_.get("store_settings"), store, f"The sifter {sifter_dir}")
    pools, leak, leak_warnings = apply_on_leak(pools, sifter.bank, on_leak)
    for sub in sifter.library_:  # the overlap allowed on the all-agent bank holds for its parts too
        sub.bank.allowed_instances_ = set(getattr(sifter.bank, "allowed_instances_", set()))
    ids = [c.traj_id for p in pools for c in p.candidates]
    missing = [t for t in ids if not store.has(t)]
    if missing:
        raise LatentSiftError(f"filter: the state store {str(states_dir)!r} has no states for {len(missing)} "
                              f"candidates, e.g. {missing[0]!r}; run 'latentsift extract' on the pools first.")
    states = store.load(ids)
    dist = pool_distances(pools, states, sifter.library_)
    chosen = nearest_choice(dist)
    subs = {s.name: s for s in sifter.library_}
    params = sifter.get_params()
    results, shift_pools, warnings = [], [], []
    for name in sorted(set(chosen.values())):
        sub = subs[name]
        group = [p for p in pools if chosen[p.instance_id] == name]
        res = LatentSift(sub.bank, sub.scorer, **params).score_pools(group, states, fingerprint=store.fingerprint)
        sh, w = guard(res, group, states, sub.bank, sub.reference, on_shift)
        shift_pools += [dict(x, bank=name) for x in sh["pools"]]
        warnings += w
        results += res
    results.sort(key=lambda r: r.instance_id)
    shift_pools.sort(key=lambda x: x["instance_id"])
    inputs = {"pools": str(Path(pools_path).resolve()), "states_dir": str(Path(states_dir).resolve()),
              "sifter_dir": sifter.path_}
    run = FilterRun(method=sifter.name, settings=params, inputs=inputs, fingerprint=store.fingerprint.to_dict(),
                    pools=results)
    run.extra = {"configuration": {"config": sifter.config_, "seen": sifter.seen_},
                 "bank_choice": {"mode": bank_choice,
                                 "rule": "per pool, the sub-bank with the smallest median nearest-bank distance of "
                                         "the pool's candidates (the shift guard's distance)",
                                 "sub_banks": [{k: v for k, v in s.to_dict().items() if k != "parts"}
                                               for s in sifter.library_],
                                 "pools": [{"instance_id": i, "chosen": chosen[i], "distances": dist[i]}
                                           for i in sorted(chosen)]},
                 "shift": {"on_shift": on_shift, "reference": "the chosen sub-bank's (sub_banks[].shift_reference)",
                           "n_shifted": sum(x["shifted"] for x in shift_pools), "pools": shift_pools},
                 "leak": {**leak, "warnings": leak_warnings}}
    return run, warnings
