"""The confirmation run's claims (a)-(d), computed from a premise run exactly as its rules say.

The rules are docs/studies/confirmation.md, "The confirmation run: its rules, written before any data"; this module is
their code. Read from the premise run's saved records (``protocol.premise``: the per-candidate scores of the
own and proxy runs, the own run's per-pool operating record and the filters it names missing):

- (a) the learned branch beats each length reference of the claims (``CLAIM_REFERENCES``: shortest in
  characters, fewest generated tokens, ``stack:length``): paired within-pool AUC differences, bootstrap over
  tasks; *confirmed* when all three intervals lie above 0, *not confirmed* when one lies below 0, otherwise
  *undetermined*, and undetermined when a reference or the score is missing (named with its reason, never
  replaced; a reference below 0 decides "not confirmed" whatever is missing: the claim is "beats each").
- (b) the same for the paper's method.
- (c) AUC(own) - AUC(proxy) of the paper's method on the same candidates: confirmed above 0, not confirmed
  below 0, undetermined otherwise (and without a proxy run, named).
- (d) at each target recall R of ``CALL_TARGETS``, each state score of ``PREREGISTERED_SCORES`` against the
  cheapest length rule (``cheapest_length_rule``): the paired per-pool difference score calls - rule calls
  of the recall-targeted keep rule (the operating points, nested calibration), percentile bootstrap over
  pools; confirmed when the score's pooled realized recall reaches R and the interval lies below 0, not
  confirmed when it does not reach R or the interval lies above 0, otherwise undetermined (also when a length
  rule of the choice is missing: the cheapest rule could then be another).
- The family: every interval of the four claims, m = ``family_size()`` (15), each read at the Bonferroni
  level 1 - 0.05 / m whatever level the run's own tables print. The earlier finding is confirmed when (a) is.

``load_claim_inputs`` reads the run folders; ``premise_claims`` computes; ``run_claims`` is both.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from .._core.validation import LatentSiftError
from ..metrics.bootstrap import bootstrap_indices, mean_ci
from ..metrics.diagnostics import auc_difference_ci, interval_outcome
from ..sift.ablations import BRANCH_LEARNED
from ..sift.rules import PURE_LENGTH, REFERENCE, SHORTEST_TOKENS
from .decide import PAPER, REF_LENGTH_STACK
from .premise import OPERATING_FILE, PREMISE_RECALLS, PREREGISTERED_SCORES, load_scores_pair

ALPHA = 0.05
SHORTEST_CODE, FEWEST_GENERATED = PURE_LENGTH
#: The length references of (a) and (b), in the rules' order.
CLAIM_REFERENCES = (REFERENCE, FEWEST_GENERATED, REF_LENGTH_STACK)
#: The claims on AUC differences: name -> the score that must beat every reference of ``CLAIM_REFERENCES``.
AUC_CLAIMS = {"a": BRANCH_LEARNED, "b": PAPER}
PROXY_CLAIM = ("c", PAPER)
#: (d): its state scores, target recalls and the length rules its cheapest rule is chosen among (ties: the first).
CALL_SCORES = PREREGISTERED_SCORES
CALL_TARGETS = PREMISE_RECALLS
CALL_LENGTH_RULES = (REFERENCE, SHORTEST_TOKENS, SHORTEST_CODE, FEWEST_GENERATED, REF_LENGTH_STACK)
KEEP_ALL = "keep-all"
CONFIRMED, NOT_CONFIRMED, UNDETERMINED = "confirmed", "not confirmed", "undetermined"

CLAIMS = {
    "a": "the learned branch beats shortest-in-characters, fewest generated tokens and stack:length",
    "b": "the paper's method beats shortest-in-characters, fewest generated tokens and stack:length",
    "c": "own minus proxy (the same candidates in the proxy encoder's states) lies above 0 for the paper's method",
    "d": "at target recalls 0.9 and 0.95, each state score needs fewer verifier calls per pool than the cheapest "
         "length rule at equal realized recall",
}


def family_size() -> int:
    """m: the intervals of the claims' family ((a), (b): one per reference; (c): one; (d): scores x targets)."""
    return len(AUC_CLAIMS) * len(CLAIM_REFERENCES) + 1 + len(CALL_SCORES) * len(CALL_TARGETS)


def family_level(alpha: float = ALPHA) -> float:
    """The Bonferroni level every interval of the family is read at: 1 - alpha / m."""
    return 1.0 - alpha / family_size()


@dataclass(frozen=True)
class ClaimInputs:
    """A premise run's records for the claims: the candidate ``table`` (instance_id, label), per-candidate
    ``own`` and ``proxy`` scores (name -> array aligned with the table; ``proxy`` None without a proxy run),
    the own run's per-pool ``operating`` record (``premise.save_operating``) and ``missing``: filter -> why the
    run lacks it."""

    table: Mapping[str, np.ndarray]
    own: Mapping[str, np.ndarray]
    proxy: Mapping[str, np.ndarray] | None
    operating: Mapping
    missing: Mapping[str, str]


def _arrays(scores: Mapping) -> dict[str, np.ndarray]:
    return {n: np.array([np.nan if v is None else v for v in vals], dtype=float) for n, vals in scores.items()}


def load_claim_inputs(own_dir: str | Path, proxy_dir: str | Path | None = None) -> ClaimInputs:
    """The records of the own run folder (and the proxy run's; refused unless they hold the same labelled
    candidates) that the claims read; a run without them is refused in one line."""
    own_dir = Path(own_dir)
    own, proxy = load_scores_pair(own_dir, proxy_dir)
    path = own_dir / OPERATING_FILE
    if not path.is_file():
        raise LatentSiftError(f"premise: {path} is missing; the claims need a premise run of this version "
                              f"(rerun crossval with premise=True into {own_dir}).")
    operating = json.loads(path.read_text())
    if sorted(operating["instance_id"]) != sorted(set(own["instance_id"])):
        raise LatentSiftError(f"premise: {path} holds other pools than {own_dir / 'premise'}'s scores; rerun the "
                              "premise into a new folder.")
    summary = own_dir / "report" / "summary.json"
    pre = (json.loads(summary.read_text()).get("premise") or {}) if summary.is_file() else {}
    missing = dict(pre.get("missing_scores") or {}) | dict((pre.get("auc") or {}).get("missing_references") or {})
    table = {"instance_id": np.array(own["instance_id"]), "label": np.array(own["label"])}
    return ClaimInputs(table, _arrays(own["scores"]), None if proxy is None else _arrays(proxy["scores"]),
                       operating, missing)


def _why(name: str, missing: Mapping[str, str], where: str = "this run") -> str:
    return missing.get(name, f"not in {where}")


def _interval(d) -> dict:
    out = d.as_dict()
    return {k: out[k] for k in ("estimate", "lo", "hi", "a", "b", "level")} | {"side": interval_outcome(out)}


def auc_claim(inputs: ClaimInputs, score: str, *, level: float, n_boot: int, seed: int) -> dict:
    """(a) / (b): ``score`` against each of ``CLAIM_REFERENCES`` (module docstring)."""
    intervals, missing = {}, {}
    if score not in inputs.own:
        missing[score] = _why(score, inputs.missing)
    for r in CLAIM_REFERENCES:
        if r not in inputs.own:
            missing[r] = _why(r, inputs.missing)
        elif score in inputs.own:
            intervals[r] = _interval(auc_difference_ci(inputs.table, inputs.own[score], inputs.own[r],
                                                       n_boot=n_boot, seed=seed, level=level))
    sides = [d["side"] for d in intervals.values()]
    outcome = (NOT_CONFIRMED if "lower" in sides else
               CONFIRMED if not missing and sides.count("higher") == len(CLAIM_REFERENCES) else UNDETERMINED)
    return {"score": score, "references": list(CLAIM_REFERENCES), "intervals": intervals, "missing": missing,
            "outcome": outcome}


def proxy_claim(inputs: ClaimInputs, score: str, *, level: float, n_boot: int, seed: int) -> dict:
    """(c): AUC(own) - AUC(proxy) of ``score`` on the same candidates."""
    missing = {}
    if inputs.proxy is None:
        missing["proxy"] = "no proxy run: premise --proxy-states not given"
    elif score not in inputs.proxy:
        missing["proxy"] = f"{score} not in the proxy run"
    if score not in inputs.own:
        missing[score] = _why(score, inputs.missing)
    if missing:
        return {"score": score, "interval": None, "missing": missing, "outcome": UNDETERMINED}
    d = _interval(auc_difference_ci(inputs.table, inputs.own[score], inputs.proxy[score], n_boot=n_boot, seed=seed,
                                    level=level))
    outcome = {"higher": CONFIRMED, "lower": NOT_CONFIRMED}.get(d["side"], UNDETERMINED)
    return {"score": score, "interval": d, "missing": {}, "outcome": outcome}


def pooled_recall(hit: np.ndarray, has_resolved: np.ndarray) -> float | None:
    """The realized recall pooled over the folds: the share of pools with a resolved candidate that kept one."""
    return float(hit[has_resolved].mean()) if has_resolved.any() else None


def _rule(record: Mapping, r: str) -> tuple[np.ndarray, np.ndarray]:
    return np.array(record[r]["calls"], dtype=float), np.array(record[r]["hit"], dtype=bool)


def cheapest_length_rule(operating: Mapping, r: str, target: float, missing: Mapping[str, str]) -> dict:
    """At target ``r`` (``target`` its value): among ``CALL_LENGTH_RULES`` those whose pooled realized recall
    reaches the target, the one with the fewest mean calls per pool (ties: the first in that order); none:
    ``KEEP_ALL`` (every candidate, recall 1). ``calls``: its calls per pool (for the paired difference)."""
    pos = np.array(operating["has_resolved"], dtype=bool)
    rows, gone = {}, {}
    for name in CALL_LENGTH_RULES:
        rec = operating["filters"].get(name)
        if rec is None or r not in rec:
            gone[name] = _why(name, missing, "this run's operating points")
            continue
        calls, hit = _rule(rec, r)
        rec_r = pooled_recall(hit, pos)
        rows[name] = {"verifier_calls": float(calls.mean()), "realized_recall": rec_r,
                      "reaches": rec_r is not None and rec_r >= target, "calls": calls}
    reach = [n for n, row in rows.items() if row["reaches"]]
    if reach:
        best = min(reach, key=lambda n: rows[n]["verifier_calls"])   # min keeps the first of equal ones
        calls, recall = rows[best]["calls"], rows[best]["realized_recall"]
    else:
        best, calls, recall = KEEP_ALL, np.array(operating["n_candidates"], dtype=float), 1.0
    return {"rule": best, "verifier_calls": float(calls.mean()), "realized_recall": recall, "calls": calls,
            "rules": {n: {k: v for k, v in row.items() if k != "calls"} for n, row in rows.items()},
            "missing": gone}


@dataclass(frozen=True)
class RecallMatchedCalls:
    """A rule's calls read off its recall-against-calls curve at a target recall (``recall_matched_calls``):
    ``calls`` per pool (or one mean), the mixing ``weight`` w of the upper point, and the indices ``lo``, ``hi``
    (into the curve as given) of the two operating points mixed (``lo == hi``, w = 0: a point at the target)."""

    calls: np.ndarray
    weight: float
    lo: int
    hi: int

    @property
    def mean_calls(self) -> float:
        return float(np.mean(self.calls))


def recall_matched_calls(recalls, calls, target: float) -> RecallMatchedCalls:
    """The calls of a keep rule at exactly the realized recall ``target``, read off its recall-against-calls
    curve by mixing the two neighbouring operating points (a rule that overshoots its target is not
    charged for the overshoot).

    ``recalls``: (n_points,) the pooled realized recall of each operating point of the rule (its thresholds,
    calibrated out of fold); ``calls``: (n_points,) their mean calls per pool, or (n_points, n_pools) their
    calls pool by pool (for a paired difference). The curve should hold keeping no candidate (recall 0, 0
    calls) and keeping every one (recall 1), so that every target in [0, 1] is bracketed.

    The points that another point dominates (at least its recall with fewer mean calls, or more recall with
    as few) are dropped first, so the curve is the rule's cheapest at each recall: that favours the rule.
    Of the rest, ``lo`` is the one of highest recall below ``target`` and ``hi`` the one of lowest recall
    above it; keeping ``hi``'s candidates with probability w = (target - r_lo) / (r_hi - r_lo) and ``lo``'s
    otherwise realizes the target in expectation, at ``(1 - w) calls_lo + w calls_hi`` (linear interpolation
    of calls between the two points; pool by pool for a (n_points, n_pools) ``calls``). A point whose
    recall equals the target is read as it is (w = 0), and so is ``hi`` when no undominated point lies below
    the target (w = 1; not with the curve's recall-0 point). A target outside the curve's recalls is refused."""
    r = np.asarray(recalls, dtype=float)
    c = np.asarray(calls, dtype=float)
    if r.ndim != 1 or not len(r) or c.shape[:1] != r.shape or c.ndim > 2:
        raise ValueError(f"The 'calls' parameter of recall_matched_calls must have one row per point of 'recalls' "
                         f"({r.shape[0] if r.ndim == 1 else r.shape}). Got shape {c.shape} instead.")
    if not np.all(np.isfinite(r)) or not np.all(np.isfinite(c)):
        raise ValueError("The 'recalls' and 'calls' parameters of recall_matched_calls must be finite.")
    if not r.min() <= target <= r.max():
        raise ValueError(f"The 'target' parameter of recall_matched_calls must lie within the curve's recalls "
                         f"[{r.min():.4g}, {r.max():.4g}]. Got {target!r} instead.")
    mean = c if c.ndim == 1 else c.mean(axis=1)
    front = [i for i in range(len(r)) if not np.any(((r >= r[i]) & (mean < mean[i])) | ((r > r[i]) & (mean <= mean[i])))]
    at = [i for i in front if r[i] == target]
    if at:
        i = min(at, key=lambda j: (mean[j], j))
        return RecallMatchedCalls(c[i].copy(), 0.0, i, i)
    hi = min((i for i in front if r[i] > target), key=lambda j: (r[j], mean[j], j))
    below = [i for i in front if r[i] < target]
    if not below:   # a point above the target with fewer calls than every point below it: read it as it is
        return RecallMatchedCalls(c[hi].copy(), 1.0, hi, hi)
    lo = max(below, key=lambda j: (r[j], -mean[j], -j))
    w = float((target - r[lo]) / (r[hi] - r[lo]))
    return RecallMatchedCalls((1 - w) * c[lo] + w * c[hi], w, lo, hi)


def calls_claim(inputs: ClaimInputs, *, level: float, n_boot: int, seed: int) -> dict:
    """(d): per target of ``CALL_TARGETS`` the cheapest length rule and each state score's calls against it."""
    op = inputs.operating
    pos = np.array(op["has_resolved"], dtype=bool)
    boot = bootstrap_indices(len(pos), n_boot, np.random.default_rng(seed))
    out = {}
    for target in CALL_TARGETS:
        r = f"{target:g}"
        if r not in op["targets"]:
            out[r] = {"cheapest": None, "scores": {s: {"outcome": UNDETERMINED, "missing": {
                r: "this target is not in the run's operating points"}} for s in CALL_SCORES}}
            continue
        ref = cheapest_length_rule(op, r, target, inputs.missing)
        rows = {}
        for s in CALL_SCORES:
            rec = op["filters"].get(s)
            if rec is None:
                rows[s] = {"outcome": UNDETERMINED, "missing": {s: _why(s, inputs.missing)}}
                continue
            calls, hit = _rule(rec, r)
            recall = pooled_recall(hit, pos)
            reaches = recall is not None and recall >= target
            d = mean_ci(calls - ref["calls"], boot, level)
            side = interval_outcome(d)
            outcome = (NOT_CONFIRMED if not reaches else UNDETERMINED if ref["missing"] else
                       CONFIRMED if side == "lower" else NOT_CONFIRMED if side == "higher" else UNDETERMINED)
            rows[s] = {"verifier_calls": float(calls.mean()), "realized_recall": recall, "reaches": reaches,
                       "n_folds_keep_all": rec[r]["n_folds_keep_all"], "difference": d | {"level": level, "side": side},
                       "missing": dict(ref["missing"]), "outcome": outcome}
        out[r] = {"cheapest": {k: v for k, v in ref.items() if k != "calls"}, "scores": rows}
    return {"scores": list(CALL_SCORES), "length_rules": list(CALL_LENGTH_RULES), "targets": out}


def premise_claims(inputs: ClaimInputs, *, n_boot: int = 1000, seed: int = 0, alpha: float = ALPHA) -> dict:
    """The claims (a)-(d) of ``inputs`` with their intervals at the family's Bonferroni level, their outcomes,
    and the earlier finding's (confirmed when (a) is)."""
    m, level = family_size(), family_level(alpha)
    kw = {"level": level, "n_boot": n_boot, "seed": seed}
    out = {"rules": "docs/studies/confirmation.md, 'The confirmation run: its rules, written before any data'",
           "claims": dict(CLAIMS),
           "family": {"m": m, "alpha": alpha, "level": level, "n_boot": n_boot, "seed": seed,
                      "intervals": "percentile bootstrap over tasks (AUC differences, the same resamples for both "
                                   "arms) and over pools (calls differences)"}}
    out |= {name: auc_claim(inputs, score, **kw) for name, score in AUC_CLAIMS.items()}
    out[PROXY_CLAIM[0]] = proxy_claim(inputs, PROXY_CLAIM[1], **kw)
    out["d"] = calls_claim(inputs, **kw)
    out["outcomes"] = {c: out[c]["outcome"] for c in (*AUC_CLAIMS, PROXY_CLAIM[0])} | {
        "d": {r: {s: row["outcome"] for s, row in t["scores"].items()} for r, t in out["d"]["targets"].items()}}
    out["earlier_finding"] = out["a"]["outcome"]
    return out


def run_claims(own_dir: str | Path, proxy_dir: str | Path | None = None, *, n_boot: int = 1000, seed: int = 0,
               alpha: float = ALPHA) -> dict:
    """``premise_claims`` of the run folders ``own_dir`` and ``proxy_dir`` (``latentsift premise``'s own/ and
    proxy/; without a proxy, (c) is undetermined and says why)."""
    return premise_claims(load_claim_inputs(own_dir, proxy_dir), n_boot=n_boot, seed=seed, alpha=alpha)

