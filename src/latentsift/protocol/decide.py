"""The comparisons that decide (summary.json ``decision``), each paired over instances with its interval.

Decision rules (stated before any number; docs/studies/default-run.md repeats them):

- **Beats a reference** (within-pool AUC): filter F beats reference R when the paired bootstrap
  interval of AUC(F) - AUC(R) lies above 0; R beats F when it lies below 0; otherwise the
  comparison is *undetermined*. The references are defined once, here: the length rule
  the reference rule (``REF_LENGTH_RULE``, the registry's ``REFERENCE``), the learned length stack ``stack:length``
  (``REF_LENGTH_STACK``: shortest chars and fewest steps fused with weights fitted on the bank) and
  ``random`` (``REF_RANDOM``).
- **Signal beyond length**: a score carries within-pool signal beyond length when the interval of
  its *length-removed* AUC minus 1/2 lies above 0. Length is removed by a within-pool (fixed-
  effects) regression: in every pool the score and log(n_chars) are centred on their pool means,
  one slope beta is fitted over all pools by least squares, and the residual s - beta log(n_chars)
  is scored (``residualize_within_pool``). Within a pool the residual orders candidates as the part
  of the score that length does not predict linearly; a pure length rule has residual 0 (AUC 1/2).
  The slope is fitted once on all pools, not per bootstrap resample.
- **Tokens**: filter F saves more than the reference rule when the paired interval of
  saving(F) - saving(reference rule) lies above 0 (savings against the run's reference workflow,
  the EF verifier on every candidate); both arms use the same resampled instances.
- **Chosen after the folds were seen**: the stacked fusions (``STACK_CONFIGS``, registered ``post_hoc``) and
  the inner-CV default (which chooses among them) were added after the evaluation folds had been seen; their
  rows say ``post_hoc: true``. The paper's method (``PAPER``) was fixed before.
- **Multiplicity**: every AUC comparison is also given at the Bonferroni level 1 - 0.05 / m, m the
  number of AUC intervals of this section (``multiplicity``); a claim that survives only at 95%
  is one of m looks.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..metrics.diagnostics import CI_LEVEL, interval_outcome, paired_bootstrap
from ..metrics.score_table import diagnostics_table
from ..cascade.verifier import EF
from ..sift.variants import STACK_LENGTH, sweep_filter
from ..sift.rules import PAPER, RANDOM, REFERENCE, find_filter, rule_keys

REF_LENGTH_RULE = REFERENCE
REF_LENGTH_STACK = STACK_LENGTH
REF_RANDOM = RANDOM
REFERENCES = (REF_LENGTH_RULE, REF_LENGTH_STACK, REF_RANDOM)
LENGTH_REMOVED = "_length_removed"   # the all-ties score a length-removed AUC is compared with (AUC 1/2)
METHOD = ("within-pool fixed-effects regression of the score on log(n_chars): both centred on their pool "
          "means, one least-squares slope over all pools, the residual s - beta*log(n_chars) scored; "
          "slope fitted once on all pools")


def is_post_hoc(name: str) -> bool:
    """Chosen after the folds were seen: a stacked fusion, or an inner-CV default (it chooses among them), on the
    paper's representation or one of the sweep's (registered ``post_hoc``)."""
    e = find_filter(name)
    if e is not None and e.kind == "sweep":
        e = find_filter(sweep_filter(name))
    return e is not None and e.post_hoc


def outcome(d: Mapping | None) -> str:
    """'higher' / 'lower' / 'undetermined' from a paired difference's interval (None: 'unavailable')."""
    return interval_outcome(d)


def within_pool_slope(code: np.ndarray, y: np.ndarray, x: np.ndarray) -> float:
    """Least-squares slope of y on x after centring both on their pool means (NaN y left out)."""
    ok = np.isfinite(y)
    n = np.bincount(code[ok], minlength=code.max() + 1).astype(np.float64)
    safe = np.where(n > 0, n, 1.0)
    my = np.bincount(code[ok], weights=y[ok], minlength=n.size) / safe
    mx = np.bincount(code[ok], weights=x[ok], minlength=n.size) / safe
    yd, xd = (y - my[code])[ok], (x - mx[code])[ok]
    den = float(xd @ xd)
    return float(yd @ xd / den) if den > 0 else 0.0


def residualize_within_pool(instance, score, covariate) -> tuple[np.ndarray, float]:
    """(score - beta * covariate, beta): ``within_pool_slope``'s residual; NaN scores stay NaN."""
    code = np.unique(np.asarray(instance), return_inverse=True)[1]
    y, x = np.asarray(score, dtype=np.float64), np.asarray(covariate, dtype=np.float64)
    beta = within_pool_slope(code, y, x)
    return y - beta * x, beta


def state_scores(names: Sequence[str]) -> list[str]:
    """The scores that use hidden states: every name but the baselines, the length stack and the verifier."""
    return [n for n in names if n not in rule_keys() and n not in (REF_LENGTH_STACK, EF)]


def _pick(diag: dict, name: str) -> dict:
    return diag["scores"][name]["vs_reference"]


def missing_references(scores: Mapping, missing: Mapping[str, str] | None = None,
                       references: Sequence[str] = REFERENCES) -> dict[str, str]:
    """reference -> why it is absent from ``scores`` (the reference rule is computed from the table: never absent).
    An absent reference is reported as missing, never replaced by another score."""
    missing = missing or {}
    return {r: missing.get(r, "not in this run") for r in references if r not in scores and r != REF_LENGTH_RULE}


def auc_comparisons(table: Mapping[str, np.ndarray], scores: Mapping[str, np.ndarray], *,
                    n_boot: int, seed: int, adjusted_level: float | None = None,
                    missing: Mapping[str, str] | None = None, references: Sequence[str] = REFERENCES,
                    names: Sequence[str] | None = None) -> dict:
    """Every state score against each reference (paired AUC differences) and its length-removed AUC.

    ``table``: the candidate table (``tables.candidate_table``); ``scores``: name -> (n,) scores
    aligned with it (higher = better), holding the references present in the run. With
    ``adjusted_level`` each difference is also given at that level (``adjusted``). ``references``:
    the references compared with (``REFERENCES`` by default); one absent from ``scores`` is listed
    in ``missing_references`` with its reason (``missing``: name -> reason). ``names``: the state
    scores compared (default: every state score of ``scores``).
    """
    names = state_scores(list(scores)) if names is None else [n for n in names if n in scores]
    refs = [r for r in references if r in scores or r == REF_LENGTH_RULE]
    levels = [CI_LEVEL] + ([adjusted_level] if adjusted_level else [])
    out: dict = {"scores": {}, "references": refs, "length_removed_method": METHOD, "length_slopes": {},
                 "missing_references": missing_references(scores, missing, references)}
    by_level = {}
    resid = {}
    log_len = np.log(np.maximum(np.asarray(table["n_chars"], dtype=np.float64), 1.0))
    for n in names:
        resid[n], out["length_slopes"][n] = residualize_within_pool(table["instance_id"], scores[n], log_len)
    resid[LENGTH_REMOVED] = np.zeros(len(log_len))
    for lv in levels:
        diags = {r: diagnostics_table(table, {n: scores[n] for n in names + [r] if n in scores},
                                      reference=r, n_boot=n_boot, seed=seed, level=lv) for r in refs}
        res = diagnostics_table(table, resid, reference=LENGTH_REMOVED, n_boot=n_boot, seed=seed, level=lv)
        by_level[lv] = (diags, res)
    diags, res = by_level[CI_LEVEL]
    for n in names:
        row = {"auc": diags[refs[0]]["scores"][n]["auc"], "post_hoc": is_post_hoc(n), "vs": {}}
        for r in refs:
            d = _pick(diags[r], n)
            if adjusted_level:
                a = _pick(by_level[adjusted_level][0][r], n)
                d = d | {"adjusted": {"level": adjusted_level, "lo": a["lo"], "hi": a["hi"]}}
            row["vs"][r] = d | {"outcome": outcome(d)}
        lr = _pick(res, n)
        lr = lr | {"outcome": outcome(lr)}
        row["length_removed"] = {"auc": res["scores"][n]["auc"], "minus_half": lr, "outcome": lr["outcome"]}
        if adjusted_level:
            a = _pick(by_level[adjusted_level][1], n)
            row["length_removed"]["minus_half"] = lr | {"adjusted": {"level": adjusted_level, "lo": a["lo"],
                                                                     "hi": a["hi"]}}
        out["scores"][n] = row
    out["reference_aucs"] = {r: diags[r]["scores"][r]["auc"] for r in refs}
    out["n_instances"] = diags[refs[0]]["table"]["n_instances"]
    out["n_mixed_instances"] = diags[refs[0]]["table"]["n_mixed_instances"]
    out["n_pairs"] = diags[refs[0]]["table"]["n_pairs"]
    return out


def n_auc_intervals(n_scores: int, n_refs: int) -> int:
    """The AUC intervals of ``auc_comparisons``: one per (score, reference) and one length-removed each."""
    return n_scores * (n_refs + 1)


def token_savings_difference(ledger: Sequence[dict], filters: Sequence[str], reference_workflow: str, *,
                             against: str = REF_LENGTH_RULE, n_boot: int = 1000, seed: int = 0) -> dict:
    """Per K: saving(F) - saving(``against``), paired over instances (tokens = EF + test generation).

    saving(F) = 1 - sum_i tokens_F(i) / sum_i tokens_ref(i) over the (resampled) instances, the
    reference workflow's tokens in the denominator of both arms.
    """
    out: dict = {}
    for k in sorted({r["k"] for r in ledger}):
        rows = [r for r in ledger if r["k"] == k]
        insts = sorted({r["instance_id"] for r in rows})
        pos = {i: j for j, i in enumerate(insts)}
        tok: dict[str, np.ndarray] = {}
        for r in rows:
            tok.setdefault(r["filter"], np.zeros(len(insts)))[pos[r["instance_id"]]] = \
                r["ef_tokens"] + r["testgen_tokens"]
        if reference_workflow not in tok or against not in tok:
            continue
        ref, base = tok[reference_workflow], tok[against]
        for f in filters:
            if f not in tok or f in (against, reference_workflow):
                continue

            def metric(w, t=tok[f]):
                with np.errstate(invalid="ignore", divide="ignore"):
                    den = w @ ref
                    return 1.0 - (w @ t) / den, 1.0 - (w @ base) / den
            d = paired_bootstrap(metric, insts, n_boot=n_boot, seed=seed)
            out.setdefault(f, {})[str(k)] = d.as_dict() | {"outcome": outcome(d.as_dict())}
    return out


def ledger_difference(ledger: Sequence[dict], key: str, reference: str, *, n_boot: int = 1000,
                      seed: int = 0) -> dict:
    """Per filter and K: mean over instances of ledger ``key`` (e.g. ``best``) minus the reference's, paired."""
    out: dict = {}
    for k in sorted({r["k"] for r in ledger}):
        rows = [r for r in ledger if r["k"] == k]
        insts = sorted({r["instance_id"] for r in rows})
        pos = {i: j for j, i in enumerate(insts)}
        val: dict[str, np.ndarray] = {}
        for r in rows:
            val.setdefault(r["filter"], np.full(len(insts), np.nan))[pos[r["instance_id"]]] = r[key]
        if reference not in val:
            continue
        for f, v in val.items():
            def metric(w, v=v, b=val[reference]):
                tot = w.sum(axis=1)
                return (w @ v) / tot, (w @ b) / tot
            d = paired_bootstrap(metric, insts, n_boot=n_boot, seed=seed).as_dict()
            out.setdefault(f, {})[str(k)] = d | {"outcome": outcome(d)}
    return out


def winner(auc: Mapping) -> str | None:
    """The state score with the highest AUC among those higher than every reference present (None: no such
    score). A missing reference (``missing_references``) is not compared with; the verdict names it."""
    ok = [(row["auc"]["auc"], n) for n, row in auc["scores"].items()
          if row["vs"] and all(v["outcome"] == "higher" for v in row["vs"].values())]
    return max(ok)[1] if ok else None


def decision_section(table: Mapping[str, np.ndarray], scores: Mapping[str, np.ndarray], ledger: Sequence[dict], *,
                     reference_workflow: str | None, n_boot: int, seed: int, level: float = CI_LEVEL,
                     missing: Mapping[str, str] | None = None) -> dict:
    """summary.json ``decision``: the AUC comparisons (with Bonferroni-adjusted intervals), the paired token
    savings against the reference rule, the winner by the rule, and how many intervals were looked at.
    ``missing``: filter -> why it is absent (a missing reference is named with it, never replaced)."""
    names = state_scores(list(scores))
    n_refs = len([r for r in REFERENCES if r in scores or r == REF_LENGTH_RULE])
    m = n_auc_intervals(len(names), n_refs)
    adjusted = 1.0 - (1.0 - level) / max(m, 1)
    auc = auc_comparisons(table, scores, n_boot=n_boot, seed=seed, adjusted_level=adjusted, missing=missing)
    tokens = ({} if reference_workflow is None else
              token_savings_difference(ledger, names, reference_workflow, n_boot=n_boot, seed=seed))
    absent = {"missing": "a reference that could not be fitted is reported as missing with its reason, never "
                         "replaced by another score; the winner is then decided among the references present and "
                         "is not said to beat the missing one"} \
        if auc["missing_references"] else {}
    return {
        "rules": {
            "beats": "F beats reference R when the paired 95% bootstrap interval (instances resampled) of "
                     "AUC(F) - AUC(R) lies above 0; lower when below 0; else undetermined",
            "winner": "the state score with the highest within-pool AUC among those that beat every reference; "
                      "none when no score does",
            "beyond_length": "a score carries signal beyond length when the interval of its length-removed AUC "
                             "minus 1/2 lies above 0 (" + METHOD + ")",
            "tokens": f"F saves more than {REFERENCE} when the paired interval of saving(F) - "
                      f"saving({REFERENCE}) lies above 0 (savings against the reference workflow)",
            "post_hoc": "rows with post_hoc = true (the stacked fusions and the inner-CV default that chooses "
                        "among them) were added after the evaluation folds had been seen",
        } | absent,
        "references": {"length_rule": REF_LENGTH_RULE, "length_stack": REF_LENGTH_STACK, RANDOM: REF_RANDOM},
        "paper": PAPER,
        "multiplicity": {"n_auc_intervals": m, "bonferroni_level": adjusted,
                         "note": f"{m} AUC intervals at 95% in this section; each is also given at the Bonferroni "
                                 f"level {adjusted:.4f} ('adjusted'), under which the family's error is <= 5%"},
        "auc": auc,
        "winner": winner(auc),
        f"token_savings_vs_{REFERENCE}": tokens,
        "reference_workflow": reference_workflow,
    }
