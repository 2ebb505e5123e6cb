"""A saved sifter: one deployable method fitted on all of a team's labelled trajectories.

``Sifter(method=NAME).fit`` fits the method (``latentsift.deploy.methods``: the paper's method by default, its
branches and ablations, the fitted fusion, the logistic probe and the stacked fusions, the free rules) on every
given labelled trajectory; ``method="auto"`` first chooses one by inner cross-validation on those trajectories
alone (``methods.recommend``; every candidate's number in ``config_["choice"]``). A method with a bank also
records the in-bank evidence (cross-fitted within-pool AUC of the paper's distance branch over inner
repository folds of the bank; no scorer is retrained for it). ``save(dir)`` writes one directory:

    SIFTER_DIR/bank/        the bank (safetensors + manifest), for every method that reads states
    SIFTER_DIR/scorer/      the gated linear scorer (safetensors + json), for the paper's method's family
    SIFTER_DIR/probe/       the logistic probe's arrays (probe.safetensors), for a stack that fuses it
    SIFTER_DIR/sifter.json  format, the method and what it needs and fitted, model fingerprint (none without
                            states), configuration and its evidence, the agents, scaffolds and repositories
                            seen, the shift guard's reference numbers (none without a bank)
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

from .._core.estimator import Estimator
from .._core.io import ArtefactKind, jsonable, member, read_artefact, replaced_folder, write_artefact
from .._core.manifests import SifterManifest, manifest_values
from .._core.validation import FingerprintMismatch, LatentSiftError, check_labelled
from ..bank.bank import Bank, Fold, as_fingerprint, by_instance, by_repo, inner_folds
from ..metrics.diagnostics import within_pool_auc
from .library import SubBank, fit_sub_banks, load_sub_banks, save_sub_banks
from ..sift.fuse import FUSION_WEIGHT
from ..sift.rank import grouped_channel_ranks, null_min_rank
from ..sift.retain import KEEP_FRAC, MIN_KEEP
from ..sift.scorer import LinearScorer, early_stopping_groups
from .shift import FALSE_ALARM, REFERENCE_KIND, Reference, scaffold_of
from ..sift.sift import N_EVIDENCE, LatentSift, Stage1Filter, resolve_states
from .methods import (AUTO, CRITERION, TIE_DECIMALS, DeployedStack, ProbeWeights, auto_candidates, check_states_given,
                      fit_fusion_method, fit_stack_method, fold_distance, get_method, inner_cv_evidence, recommend)
from ..trajectories.trajectory import CHANNELS, Trajectory

SIFTER_FORMAT = "latentsift-sifter"
SIFTER_VERSION = 1
SIFTER_JSON = "sifter.json"
PROBE_TENSORS = "probe.safetensors"
SIFTER_ARTEFACT = ArtefactKind(SIFTER_FORMAT, SIFTER_VERSION, SIFTER_JSON, noun="a sifter directory",
                               make="make one with 'latentsift fit'", redo="fit the sifter again",
                               schema=SifterManifest)


class Sifter(Estimator, LatentSift):
    """A deployable Stage-1 method with its provenance: fitted on labelled trajectories, saved, loaded.

    scikit-learn's estimator contract: the constructor stores the settings (``method``, ``scorer_epochs`` and
    ``LatentSift``'s filter settings), ``fit`` learns and returns self, ``get_params``/``set_params``,
    ``sklearn.base.clone`` gives an unfitted copy. Learned by ``fit`` (or read by ``load``): ``bank`` and
    ``scorer`` (named as ``LatentSift``'s, whose scoring uses them; None where the method has none), ``method_``
    (``methods.Method``), ``fitted_`` (a fusion weight, a stack's weights), ``config_`` (method, settings,
    choice and its evidence), ``seen_`` (agents, scaffolds, repositories, counts), ``reference_`` (the shift guard's
    ``shift.Reference``). ``filter_params()``: the filter settings alone, as a ``LatentSift`` takes them.
    """

    name = "latentsift-sifter"

    def __init__(self, *, method: str = LatentSift.name, scorer_epochs: int = 40, channels: Sequence[str] = CHANNELS,
                 distance: str = "two-sided", weighting: str = "linear", branches: str = "both",
                 fusion_weight: float = FUSION_WEIGHT, min_keep: int = MIN_KEEP, frac: float = KEEP_FRAC, seed: int = 0,
                 n_evidence: int = N_EVIDENCE):
        self.method = method
        self.scorer_epochs = scorer_epochs
        self.channels = channels
        self.distance = distance
        self.weighting = weighting
        self.branches = branches
        self.fusion_weight = fusion_weight
        self.min_keep = min_keep
        self.frac = frac
        self.seed = seed
        self.n_evidence = n_evidence

    def filter_params(self) -> dict:
        """The filter settings (``LatentSift``'s parameters, channels as a list: what a filter run records)."""
        return LatentSift.get_params(self)

    def _attach(self, bank: Bank | None, scorer: LinearScorer | None) -> None:
        """Take the fitted bank and scorer and the method's fitted parts (``method_``, ``fitted_``, ``probe_``):
        ``LatentSift``'s constructor checks them with the settings (the method's own settings win); a stack or a
        rule scores through its own filter (``delegate_``)."""
        m = self.method_
        kw = {k: v for k, v in self.get_params(deep=False).items() if k not in ("scorer_epochs", "method")}
        self.delegate_ = None
        if m.needs_scorer:  # the paper's method's family: LatentSift with the method's settings
            kw |= m.params | ({"fusion_weight": self.fitted_["fusion_weight"]} if m.family == "fusion" else {})
            LatentSift.__init__(self, bank, scorer, **kw)
            return
        Stage1Filter.__init__(self, min_keep=kw["min_keep"], frac=kw["frac"], seed=kw["seed"])
        self.bank, self.scorer = bank, scorer
        self.delegate_ = (DeployedStack(self.fitted_["weights"], bank=bank, probe=getattr(self, "probe_", None),
                                        seed=self.seed) if m.family == "stack" else m.entry.factory(seed=self.seed))

    def prepare_many(self, pools, states: Any = None, *, fingerprint: Any = None):
        if getattr(self, "delegate_", None) is None:
            return LatentSift.prepare_many(self, pools, states, fingerprint=fingerprint)
        return self.delegate_.prepare_many(pools, states, fingerprint=fingerprint)

    def _rank(self, prepared, idx):
        if getattr(self, "delegate_", None) is None:
            return LatentSift._rank(self, prepared, idx)
        return self.delegate_._rank(prepared, idx)

    # ------------------------------------------------------------------ fit
    def fit(self, trajs: Sequence[Trajectory], states=None, *, fingerprint: Any = None, per_agent: bool = False,
            log=lambda m: None, false_alarm: float | None = None, reference_kind: str | None = None) -> "Sifter":
        """The method's parts from every trajectory of ``trajs`` (all labelled); ``states``: dict or store (None
        for a method that needs none: a free rule).

        ``method`` (the constructor's): a deployable method (``deploy.methods``) or ``"auto"``: the
        recommendation, chosen by inner cross-validation by repository on ``trajs`` alone
        (``methods.recommend``; every candidate's number in ``config_["choice"]``).
        ``per_agent``: also a sub-bank and scorer per agent (and per scaffold where they differ) in
        ``library_`` (``latentsift.deploy.library``), for ``filter --bank-choice nearest`` (the paper's method
        and its settings only).
        ``false_alarm`` / ``reference_kind``: the shift guard's stated false-alarm rate and in-bank
        reference (``shift.Reference.from_bank``; defaults ``shift.FALSE_ALARM``, ``shift.REFERENCE_KIND``),
        for the all-agent bank and every sub-bank (a method without a bank has no shift guard).
        """
        trajs = list(trajs)
        check_labelled(trajs, "fit")
        ids = sorted(t.traj_id for t in trajs)
        seed = self.seed
        sts = fp = None
        group = inner_group(trajs)
        if states is not None:
            sts, fp = resolve_states(states, ids, fingerprint, owner="fit")
        if self.method == AUTO:
            cands = auto_candidates(trajs, states=sts is not None)
            log(f"[fit] --method auto: {len(cands)} candidates by {CRITERION}")
            evidence = inner_cv_evidence(trajs, sts, fp, cands, group=group, seed=seed, log=log,
                                         scorer_params={"max_epochs": self.scorer_epochs, "seed": seed})
            chosen, why = recommend(evidence, cands)
            choice = {"chosen": chosen, "auto": True, "criterion": CRITERION, "tie": f"equal at {TIE_DECIMALS} "
                      "decimals: the cheaper (a free rule first)", "candidates": evidence, "reason": why}
        else:
            chosen = get_method(self.method).name
            choice = {"chosen": chosen, "auto": False, "reason": "asked (--method)"}
        m = self.method_ = get_method(chosen)
        check_states_given(m, sts, "fit")
        if per_agent and m.family != "paper":
            raise LatentSiftError(f"fit --per-agent: the sub-banks are the paper's method's; the method {m.name!r} "
                                  "has none. Drop --per-agent or fit --method latentsift.")
        labels = {t.traj_id: int(t.label) for t in trajs}
        bank = scorer = None
        if m.needs_bank:
            bank = Bank.from_trajectories(trajs, sts, fp)
            log(f"[fit] bank: {bank.label_counts()}")
        if m.needs_scorer:
            log(f"[fit] training the scorer ({self.scorer_epochs} epochs)")
            scorer = LinearScorer(max_epochs=self.scorer_epochs, seed=seed).fit(
                [sts[i] for i in ids], [labels[i] for i in ids], fingerprint=fp, groups=early_stopping_groups(trajs))
        self.fitted_ = {}
        if m.family == "fusion":
            self.fitted_ = fit_fusion_method(trajs, sts, fp, scorer.get_params(), group=group, seed=seed)
        elif m.family == "stack":
            self.fitted_ = fit_stack_method(m, trajs, sts, fp, group=group, seed=seed)
            self.probe_ = self.fitted_.pop("probe", None)
        self._attach(bank, scorer)
        agents = sorted({t.agent for t in trajs})
        scaffolds = sorted({scaffold_of(t) for t in trajs})
        evidence = {} if bank is None else in_bank_evidence(bank, trajs, sts, fp, seed=seed)
        self.config_ = {"method": m.name, "method_info": m.describe(), "settings": LatentSift.get_params(self),
                        "scorer_epochs": self.scorer_epochs, "choice": choice, "evidence": evidence,
                        "fitted": self.fitted_}
        self.seen_ = {"agents": agents, "scaffolds": scaffolds, "repos": sorted({t.repo for t in trajs}),
                      "n_trajectories": len(trajs), "n_instances": len({t.instance_id for t in trajs}),
                      "label_counts": {"pos": sum(labels.values()), "neg": len(labels) - sum(labels.values())}}
        if bank is None:  # the leak guard's record without a bank: the instance of every trajectory seen
            self.seen_["instances"] = {t.traj_id: t.instance_id for t in trajs}
        ref_kw = {"kind": reference_kind or REFERENCE_KIND,
                  "false_alarm": FALSE_ALARM if false_alarm is None else false_alarm}
        self.reference_ = None if bank is None else Reference.from_bank(bank, agents=agents, scaffolds=scaffolds,
                                                                         **ref_kw)
        self.library_: list[SubBank] = []
        self.library_skipped_: list[dict] = []
        if per_agent:
            self.library_, self.library_skipped_ = fit_sub_banks(trajs, sts, fp, scorer_epochs=self.scorer_epochs,
                                                                 seed=seed, log=log, reference_kw=ref_kw)
        return self

    @property
    def seen_bank(self):
        """What the leak guard checks pools against: the bank, or without one the instances seen (``SeenRuns``)."""
        return self.bank if self.bank is not None else SeenRuns(self.seen_.get("instances", {}))

    # ------------------------------------------------------------------ io
    def manifest(self) -> dict:
        bank, scorer, probe = self.bank, self.scorer, getattr(self, "probe_", None)
        return jsonable({"format": SIFTER_FORMAT, "version": SIFTER_VERSION,
                         "fingerprint": None if bank is None else bank.fingerprint_.to_dict(), "config": self.config_,
                         "seen": self.seen_, "shift_reference": None if self.reference_ is None else
                         self.reference_.to_dict(),
                         "parts": {"bank": None if bank is None else "bank",
                                   "scorer": None if scorer is None else "scorer",
                                   "probe": None if probe is None else "probe"},
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
            if self.bank is not None:
                self.bank.save(tmp / "bank", source={"sifter": True} | ({"store_settings": recorded} if recorded
                                                                          else {}))
            if self.scorer is not None:
                self.scorer.save(tmp / "scorer", plot=False)
            if getattr(self, "probe_", None) is not None:
                from safetensors.numpy import save_file
                (tmp / "probe").mkdir()
                save_file(self.probe_.arrays(), str(tmp / "probe" / PROBE_TENSORS))
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
        if fingerprint is not None and man.get("fingerprint") is not None:
            check_sifter_fingerprint(man, fingerprint, path)
        parts = man.get("parts") if isinstance(man.get("parts"), dict) else {}
        bank = None if parts.get("bank") is None else Bank.load(member(path, parts.get("bank"), mpath))
        scorer = None if parts.get("scorer") is None else LinearScorer.load(member(path, parts.get("scorer"), mpath))
        probe = None
        if parts.get("probe") is not None:
            from safetensors.numpy import load_file
            probe = ProbeWeights.from_arrays(load_file(str(member(path, parts["probe"], mpath) / PROBE_TENSORS)))
        params = dict(man["config"]["settings"])
        params["channels"] = tuple(params["channels"])
        epochs = man["config"].get("scorer_epochs", 40)
        with manifest_values(mpath, "config.method", SIFTER_ARTEFACT.redo):  # the saved method: the file's fault
            method = get_method(man["config"]["method"]).name
        with manifest_values(mpath, "config.settings", SIFTER_ARTEFACT.redo):  # the saved settings: the file's fault
            s = cls(method=method, scorer_epochs=epochs, **params)
            s._restore(man, bank, scorer, probe)
        if settings:  # the caller's: its fault, never the file's
            s = cls(method=method, scorer_epochs=epochs, **(params | settings))
            s._restore(man, bank, scorer, probe)
        s.config_, s.seen_ = man["config"], man["seen"]
        s.reference_ = None if man.get("shift_reference") is None else Reference(**man["shift_reference"])
        s.library_ = load_sub_banks(man.get("library", []), path, mpath)
        s.library_skipped_ = man.get("library_skipped", [])
        s.path_ = str(path.resolve())
        return s

    def _restore(self, man: dict, bank, scorer, probe) -> None:
        self.method_ = get_method(self.method)
        self.fitted_ = dict(man["config"].get("fitted") or {})
        self.probe_ = probe
        self._attach(bank, scorer)


class SeenRuns:
    """The leak guard's view of a sifter without a bank (a free rule, a stack of length signals): the instance
    of every labelled trajectory it was fitted on (``leak.check_leaks`` reads ``instances_``)."""

    def __init__(self, instances: dict[str, str]):
        self.instances_ = dict(instances)


def inner_group(trajs: Sequence[Trajectory]):
    """The inner folds' group of a fit (the choice of ``--method auto``, a fusion weight, a stack's weights): the
    repository, as the project's folds, or the task when the runs hold one repository."""
    return by_repo if len({t.repo for t in trajs}) >= 2 else by_instance


def sifter_has_bank(path: str | Path) -> bool:
    """Whether the sifter at ``path`` has a bank (its method scores states against it), read from sifter.json."""
    man, _ = read_artefact(Path(path), SIFTER_ARTEFACT)
    return (man.get("parts") or {}).get("bank") is not None


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


def cross_fit_distance(folds: Sequence[Fold], states, fingerprint, *, seed: int = 0) -> dict[str, dict[str, float]]:
    """``fold_distance`` over inner ``folds`` (``bank.inner_folds``): cross-fitted q of every trajectory."""
    q: dict[str, dict[str, float]] = {}
    for f in folds:
        q |= fold_distance(f, states, fingerprint, seed=seed)
    return q


def distance_auc(q: dict[str, dict[str, float]], trajs: Sequence[Trajectory]) -> float:
    """Within-pool AUC of the paper's distance branch (s_dist, ``null_min_rank``) on cross-fitted ``q``."""
    by = {t.traj_id: t for t in trajs}
    ids = sorted(q)
    inst = np.array([by[t].instance_id for t in ids])
    y = np.array([int(by[t].label) for t in ids])
    ranks = np.stack([grouped_channel_ranks(np.array([q[t][c] for t in ids]), inst) for c in ("cot", "obs", "fn")])
    return within_pool_auc(inst, y, null_min_rank(ranks, inst)).auc


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
