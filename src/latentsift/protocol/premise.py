"""The premise test on one policy's pools: do the states of the policy that wrote the candidates beat length?

Rules (stated before any number; docs/studies/premise.md repeats them):

- **What is compared**: the paper's method (``latentsift``), its two branches (``branch:distance``,
  ``branch:learned``) and the logistic probe (``variant:probe``), and the recommendation of ``fit --method auto``
  chosen per fold on the bank alone (``recommended``), each against shortest-in-characters,
  fewest steps, ``stack:length`` (the length signals fused with weights fitted on the bank), the pure
  length references (the submitted code's characters, the tokens the policy generated), the docstring
  examples' pass share and random: paired within-pool AUC differences, bootstrap over instances
  (``decide.auc_comparisons``), and the length-removed AUC minus 1/2 (``decide.residualize_within_pool``).
- **Length in the rollout scaffold is partly an execution signal**: a candidate whose first code passed
  the docstring examples submits at once (one step, no observation), so fewest steps and
  shortest-in-characters carry the examples' outcome. The pure length references (registered rules
  ``shortest-patch`` and ``fewest-generated-tokens``, ``sift.rules.PURE_LENGTH``) and the examples' pass
  share (``most-examples-passed``, a named free reference of its own) let a reader tell execution from
  length; they are built in premise runs only and named missing where the candidates lack the record.
- **Folds** by task (``group_by="instance"``; a policy's pools hold one repository or none); the inner
  cross-validation of ``stack:length`` and the probe splits each bank by task as well.
- **Missing references**: a reference that cannot be fitted is named with its reason, never replaced;
  a claim that needs it is then undetermined.
- **Multiplicity**: the premise table's family is its m = scores x (references + 1) intervals; each is
  also given at the Bonferroni level 1 - 0.05 / m, and the verdict reads the Bonferroni intervals.
- **Own states beat length** when the Bonferroni interval of AUC(paper) - AUC(R) lies above 0 for every
  length reference R (shortest-in-characters, fewest steps, ``stack:length``); *do not* when one lies
  below 0; otherwise *undetermined* (also when ``stack:length`` is missing). The same rule over the pure
  length references gives ``beats_pure_length``, and over the examples' pass share ``beats_examples``.
- **Own against proxy**: the same candidates in two state stores (the policy's own states and a proxy
  encoder's replay), the same folds and settings; per filter the paired difference AUC(own) - AUC(proxy),
  bootstrap over instances, at 95% and at the Bonferroni level over the filters compared.
- Retention@K and Best@K through the cascade (K = 4, 8, 16 up to the pool size; without verifier
  results Stage 4 keeps every survivor and Best@K is the expected label of a uniform pick among them:
  ``final_verifier`` says which) and verifier calls at the target recalls 0.9 and 0.95 come from the
  run's cascade and operating points (``metrics.evaluate``, ``protocol.operating``).

``premise_section`` is the ``premise`` part of a run's summary.json (``crossval(..., premise=True)``);
``own_vs_proxy`` pairs two such runs; ``latentsift._jobs.premise.premise`` runs both and writes the report.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .._core.io import atomic_write_json
from .._core.validation import LatentSiftError
from ..deploy.library import settings_difference, store_difference
from ..metrics.diagnostics import CI_LEVEL, auc_difference_ci, interval_outcome
from ..sift.ablations import BRANCH_DISTANCE, BRANCH_LEARNED
from ..sift.rules import EXAMPLES_PASSED, FEWEST_STEPS, PURE_LENGTH, RANDOM, REFERENCE
from ..sift.variants import PROBE, RECOMMENDED
from ..states.store import SPAN_SETTINGS
from .decide import PAPER, REF_LENGTH_STACK, auc_comparisons, n_auc_intervals
from .operating import KeepRecords

#: The state scores of the premise fixed before the confirmation run (its claims read these: ``protocol.claims``).
PREREGISTERED_SCORES = (PAPER, BRANCH_DISTANCE, BRANCH_LEARNED, PROBE)
#: The premise table's scores: those, and the recommendation of ``fit --method auto`` nested per fold (issue 67).
PREMISE_SCORES = PREREGISTERED_SCORES + (RECOMMENDED,)
LENGTH_REFERENCES = (REFERENCE, FEWEST_STEPS, REF_LENGTH_STACK)
#: The verdicts of the premise: name -> the references its rule reads (``_verdict``).
VERDICTS = {"beats_length": LENGTH_REFERENCES, "beats_pure_length": PURE_LENGTH,
            "beats_examples": (EXAMPLES_PASSED,)}
PREMISE_REFERENCES = LENGTH_REFERENCES + PURE_LENGTH + (EXAMPLES_PASSED, RANDOM)
PREMISE_KS = (4, 8, 16)
PREMISE_RECALLS = (0.9, 0.95)
SCORES_FILE = Path("premise") / "scores.json"   # per-candidate scores of a run, for own-vs-proxy pairing
OPERATING_FILE = Path("premise") / "operating.json"   # per-pool keep records at PREMISE_RECALLS (``save_operating``)

RULES = {
    "compared": "the paper's method, its distance and learned branches, the logistic probe and the recommendation "
                "(fit --method auto, chosen per fold on the bank alone), each against "
                "shortest-in-characters, fewest steps, stack:length, the pure length references (shortest code in "
                "characters, fewest generated tokens), the docstring examples' pass share and random: paired "
                "within-pool AUC differences (bootstrap over instances) and the length-removed AUC minus 1/2",
    "beats_length": "own states beat length when the Bonferroni interval of AUC(paper) - AUC(R) lies above 0 for "
                    "every length reference R (shortest-in-characters, fewest steps, stack:length); they do not when "
                    "one lies below 0; otherwise (or with a length reference missing) undetermined",
    "beats_pure_length": "the same rule over the pure length references (shortest code in characters, fewest "
                         "generated tokens): in the rollout scaffold fewest steps and shortest-in-characters carry "
                         "the docstring examples' outcome (a one-step candidate is one whose first code passed them)",
    "beats_examples": "the same rule against the docstring examples' pass share (an execution signal, named on "
                      "its own)",
    "missing": "a reference that cannot be fitted is named with its reason, never replaced",
    "multiplicity": "m = scores x (references + 1) intervals; each also at the Bonferroni level 1 - 0.05/m",
}


def check_premise_stores(trajs: Sequence, own, proxy=None) -> None:
    """Refuse (before any run) own and proxy stores that cannot be what they are given as.

    ``own`` / ``proxy``: the opened stores (``deploy.library.StoreUnion``) of ``--states`` and
    ``--proxy-states``. The rule: where the candidates record the policy that wrote them (``meta.policy``,
    its model fingerprint's digest, as ``rollout`` writes it), they are one policy's, the own states carry
    that fingerprint (in any dtype: a replay in another dtype is the policy's) and the proxy's does not (the stores swapped, or the policy's states given as the
    proxy, are refused); without that record, the proxy is neither one of the own stores nor a store of
    the same model and value-changing settings (own - proxy would compare the states with themselves). Both
    stores cut the spans with the same settings (``store.SPAN_SETTINGS``): else own - proxy measures the spans.
    """
    policies = sorted({str(t.meta["policy"]) for t in trajs if t.meta.get("policy") is not None})
    if len(policies) > 1:
        raise LatentSiftError(f"premise: the candidates were written by {len(policies)} policies (meta.policy "
                              f"{', '.join(policies[:3])}); the premise test is on one policy's pools: pass one "
                              "policy's candidates.")
    own_digest = own.fingerprint.digest
    proxy_digest = None if proxy is None else proxy.fingerprint.digest
    if policies and not own.fingerprint.is_model_of(policies[0]):
        swapped = (" (the stores look swapped: the proxy holds it)"
                   if proxy is not None and proxy.fingerprint.is_model_of(policies[0]) else "")
        raise LatentSiftError(f"premise: --states {own.path} holds states of the model with fingerprint {own_digest}, "
                              f"not of the policy that wrote the candidates (meta.policy {policies[0]}){swapped}; "
                              "pass the policy's own states as --states (extract them with its model file).")
    if proxy is None:
        return
    folders = [{str(Path(s.path).resolve()) for s in union.stores} for union in (own, proxy)]
    same = sorted(folders[0] & folders[1])
    if same:
        raise LatentSiftError(f"premise: {same[0]} is given as --states and as --proxy-states; the proxy is the same "
                              "candidates encoded by another model (own - proxy of one store is 0).")
    if policies and proxy.fingerprint.is_model_of(policies[0]):
        raise LatentSiftError(f"premise: --proxy-states {proxy.path} holds the policy's own states (fingerprint "
                              f"{proxy_digest}, the candidates' meta.policy); the proxy is the same candidates "
                              "encoded by another model.")
    spans = settings_difference(own.settings, proxy.settings, SPAN_SETTINGS)
    if spans:
        raise LatentSiftError(f"premise: --states {own.path} and --proxy-states {proxy.path} cut the spans with other "
                              f"settings ({', '.join(spans)}): own - proxy would compare other spans, not other "
                              "encoders; extract the proxy with the own store's span settings.")
    if not policies and store_difference(own.stores[0], proxy.stores[0]) is None:
        raise LatentSiftError(f"premise: --proxy-states {proxy.path} holds states of the same model and settings as "
                              f"--states {own.path} (fingerprint {own_digest}); the proxy is the same candidates "
                              "encoded by another model.")


def premise_ks(pools_sizes: Sequence[int], ks: Sequence[int] = PREMISE_KS) -> tuple[int, ...]:
    """The Ks of the premise's retention (those no larger than the largest pool); refused when none is."""
    top = max(pools_sizes) if pools_sizes else 0
    use = tuple(k for k in ks if k <= top)
    if not use:
        raise LatentSiftError(f"premise: the pools hold at most {top} candidates; retention@K needs K in "
                              f"{list(ks)} no larger than the pools (pass smaller ks).")
    return use


def _verdict(row: Mapping | None, missing: Mapping[str, str], refs: Sequence[str] = LENGTH_REFERENCES) -> str:
    """'yes' / 'no' / 'undetermined' for one score by the ``beats_length`` rule over ``refs`` (Bonferroni
    intervals)."""
    if row is None:
        return "undetermined"
    outs = []
    for r in refs:
        d = row["vs"].get(r)
        if d is None:
            outs.append("missing")
            continue
        a = d.get("adjusted") or d
        outs.append(interval_outcome({"estimate": d.get("estimate"), "lo": a.get("lo"), "hi": a.get("hi")}))
    if "lower" in outs:
        return "no"
    return "yes" if all(o == "higher" for o in outs) else "undetermined"


def premise_section(table: Mapping[str, np.ndarray], scores: Mapping[str, np.ndarray], data: Mapping, *,
                    missing: Mapping[str, str] | None, n_boot: int, seed: int, level: float = CI_LEVEL) -> dict:
    """summary.json ``premise`` of a finished evaluation (``data``: its summary with ``retention`` and
    ``operating_points``; ``table``/``scores``: the candidate table and full-pool scores aligned with it)."""
    missing = dict(missing or {})
    names = [n for n in PREMISE_SCORES if n in scores]
    refs = [r for r in PREMISE_REFERENCES if r in scores or r == REFERENCE]
    m = n_auc_intervals(len(names), len(refs))
    adjusted = 1.0 - (1.0 - level) / max(m, 1)
    auc = auc_comparisons(table, {n: scores[n] for n in names + refs if n in scores}, n_boot=n_boot, seed=seed,
                          adjusted_level=adjusted, missing=missing, references=PREMISE_REFERENCES, names=names)
    shown = names + [r for r in refs if r in data["retention"]]
    ks = list(data["retention"].get(PAPER, {}))  # the run's Ks (``premise`` runs PREMISE_KS up to the pool size)
    op = data.get("operating_points") or {}
    calls = {f: {r: {"verifier_calls": row["verifier_calls"], "realized_recall": row["realized_recall"]["pooled"],
                     "n_folds_keep_all": row["n_folds_keep_all"]}
                 for r, row in op["filters"][f]["targets"].items() if float(r) in PREMISE_RECALLS}
             for f in shown if f in op.get("filters", {})}
    verdicts = {v: {n: _verdict(auc["scores"].get(n), auc["missing_references"], rs) for n in names}
                for v, rs in VERDICTS.items()}
    beats = verdicts["beats_length"]
    return {"rules": RULES, "scores": names, "references": refs, "verdicts": verdicts,
            "missing_scores": {n: missing.get(n, "not in this run") for n in PREMISE_SCORES if n not in scores},
            "multiplicity": {"n_auc_intervals": m, "bonferroni_level": adjusted},
            "auc": auc, "beats_length": beats, "own_states_beat_length": beats.get(PAPER, "undetermined"),
            "retention": {f: {str(k): data["retention"][f][k] for k in ks} for f in shown},
            "best_at_k": {f: {str(k): data["best_at_k"]["filters"][f][k] for k in ks} for f in shown}
            | {"oracle Pass@K": {str(k): data["best_at_k"]["oracle_pass"][k] for k in ks}},
            "final_verifier": (data["settings"].get("meta") or {}).get("stage4", "the run's EF verifier results"),
            "stage3": (data["settings"].get("meta") or {}).get("stage3"),
            "ks": [str(k) for k in ks], "verifier_calls": calls, "target_recalls": [f"{r:g}" for r in PREMISE_RECALLS]}


def save_scores(path: Path, table: Mapping[str, np.ndarray], scores: Mapping[str, np.ndarray]) -> None:
    """The premise filters' per-candidate scores (aligned with the candidate table) for the pairing."""
    keep = [n for n in PREMISE_SCORES + PREMISE_REFERENCES if n in scores]
    atomic_write_json(path, {"format": "latentsift-premise-scores", "version": 1,
                             "traj_id": table["traj_id"].tolist(), "instance_id": table["instance_id"].tolist(),
                             "label": [int(x) for x in table["label"]],
                             "scores": {n: [None if not np.isfinite(v) else float(v) for v in scores[n]]
                                        for n in keep}})


def save_operating(path: Path, records: KeepRecords, recalls: Sequence[float] = PREMISE_RECALLS) -> None:
    """Each filter's recall-targeted keep rule (the operating points) pool by pool at the target recalls
    ``recalls`` that the run computed: per pool in ``instance_id`` order (the outer folds' order; ``fold``,
    ``n_candidates`` and ``has_resolved`` alike for every filter), the candidates kept (``calls``) and whether a
    resolved one was kept (``hit``), with the folds that kept every candidate (``n_folds_keep_all``)."""
    rs = [r for r in recalls if r in records.targets]
    first = next(iter(records.per_filter.values()))["by_target"][rs[0]] if rs and records.per_filter else None
    atomic_write_json(path, {
        "format": "latentsift-premise-operating", "version": 1, "targets": [f"{r:g}" for r in rs],
        "instance_id": records.order, "fold": [k for k, ps in records.fold_pools for _ in ps],
        "n_candidates": [len(p.candidates) for _, ps in records.fold_pools for p in ps],
        "has_resolved": [] if first is None else [bool(x) for x in first["pos"]],
        "filters": {name: {f"{r:g}": {"calls": [float(c) for c in res["by_target"][r]["calls"]],
                                      "hit": [bool(h) for h in res["by_target"][r]["hit"]],
                                      "n_folds_keep_all": sum(f["status"] != "ok" for f in res["by_target"][r]["folds"])}
                           for r in rs}
                    for name, res in records.per_filter.items()}})


def _load_scores(run_dir: Path) -> dict:
    path = Path(run_dir) / SCORES_FILE
    if not path.is_file():
        raise LatentSiftError(f"premise: {path} is missing; run crossval with premise=True into {run_dir} first.")
    return json.loads(path.read_text())


def load_scores_pair(own_dir: str | Path, proxy_dir: str | Path | None) -> tuple[dict, dict | None]:
    """The saved per-candidate scores of the own run and of the proxy run (None without ``proxy_dir``), refused
    unless both hold the same labelled candidates in the same order."""
    own = _load_scores(Path(own_dir))
    proxy = None if proxy_dir is None else _load_scores(Path(proxy_dir))
    if proxy is not None and (own["traj_id"] != proxy["traj_id"] or own["label"] != proxy["label"]):
        raise LatentSiftError("premise: the own and proxy runs do not hold the same labelled candidates; own against "
                              "proxy compares two state stores of the SAME candidates.")
    return own, proxy


def own_vs_proxy(own_dir: str | Path, proxy_dir: str | Path, *, n_boot: int = 1000, seed: int = 0,
                 level: float = CI_LEVEL) -> dict:
    """Per premise filter, AUC(own) - AUC(proxy) on the same candidates, paired bootstrap over instances
    (the same resamples for both arms), at ``level`` and at the Bonferroni level over the filters."""
    own, proxy = load_scores_pair(own_dir, proxy_dir)
    table = {"instance_id": np.array(own["instance_id"]), "label": np.array(own["label"])}
    names = [n for n in PREMISE_SCORES if n in own["scores"] and n in proxy["scores"]]
    adjusted = 1.0 - (1.0 - level) / max(len(names), 1)
    out = {"rule": "AUC(own) - AUC(proxy) for the same filter on the same candidates, paired bootstrap over "
                   f"instances ({n_boot} resamples); the Bonferroni level is over the {len(names)} filters compared",
           "bonferroni_level": adjusted, "n_candidates": len(own["traj_id"]),
           "n_instances": len(set(own["instance_id"])), "filters": {},
           "not_compared": sorted(set(PREMISE_SCORES) - set(names))}
    for n in names:
        a = np.array([np.nan if v is None else v for v in own["scores"][n]], dtype=float)
        b = np.array([np.nan if v is None else v for v in proxy["scores"][n]], dtype=float)
        d = auc_difference_ci(table, a, b, n_boot=n_boot, seed=seed, level=level).as_dict()
        adj = auc_difference_ci(table, a, b, n_boot=n_boot, seed=seed, level=adjusted).as_dict()
        out["filters"][n] = d | {"outcome": interval_outcome(d),
                                 "adjusted": {"level": adjusted, "lo": adj["lo"], "hi": adj["hi"],
                                              "outcome": interval_outcome(adj)}}
    return out
