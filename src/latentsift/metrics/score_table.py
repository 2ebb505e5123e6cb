"""Every diagnostic of every Stage-1 score as one JSON-serialisable table (the ``selection`` section
of summary.json): AUCs, rank correlations with length and agent, and the paired difference to a
reference, all on one set of bootstrap resamples. The measures and their conventions (missing scores,
weighting, the paired bootstrap) are in ``diagnostics``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .._core.validation import LatentSiftError, check_choice, param_error
from ..sift.rules import REFERENCE, column_scores
from .bootstrap import CI_LEVEL, N_BOOT, bootstrap_weights
from .diagnostics import (AUC, WEIGHTINGS, Spearman, _auc, _build_pairs, _check_counts, _check_ids, _check_labels,
                          _check_level, _check_n_boot, _check_score, _check_seed, _fill_missing, _grouped_ranks,
                          _instance_sums, _json_num, _paired_difference, _Pairs, _pair_wins, _pearson, _per_agent,
                          _rankdata, _weighted_auc, _within_spearman)

TABLE_COLUMNS = ("instance_id", "traj_id", "agent", "label", "n_chars", "n_steps")

__all__ = ["TABLE_COLUMNS", "diagnostics_table"]


def _check_table(candidates: Mapping[str, Any], owner: str) -> dict[str, np.ndarray]:
    if not isinstance(candidates, Mapping):
        raise param_error("candidates", owner, "a mapping column -> array", type(candidates).__name__)
    missing = [c for c in TABLE_COLUMNS if c not in candidates]
    if missing:
        raise LatentSiftError(f"The 'candidates' parameter of {owner} lacks the columns {missing} "
                              f"(needs {list(TABLE_COLUMNS)}).")
    inst = _check_ids(candidates["instance_id"], "instance_id", owner)
    n = inst.shape[0]
    traj = _check_ids(candidates["traj_id"], "traj_id", owner, n)
    uniq, counts = np.unique(traj, return_counts=True)
    if (counts > 1).any():
        raise param_error("traj_id", owner, "distinct candidate ids", f"the duplicated id {uniq[counts > 1][0]!r}")
    return {"instance_id": inst, "traj_id": traj, "agent": _check_ids(candidates["agent"], "agent", owner, n),
            "label": _check_labels(candidates["label"], "label", owner, n),
            "n_chars": _check_counts(candidates["n_chars"], "n_chars", owner, n),
            "n_steps": _check_counts(candidates["n_steps"], "n_steps", owner, n)}


def _auc_dict(a: AUC) -> dict:
    return {"auc": _json_num(a.auc), "n_pairs": a.n_pairs, "n_instances": a.n_instances}


def _sp_dict(s: Spearman) -> dict:
    return {"rho": _json_num(s.rho), "n": s.n, "n_instances": s.n_instances}


def diagnostics_table(candidates: Mapping[str, Any], scores: Mapping[str, Any], *,
                      reference: str = REFERENCE, weighting: str = "pairs", n_boot: int = N_BOOT,
                      seed: int = 0, level: float = CI_LEVEL) -> dict:
    """All diagnostics for every score, as a JSON-serialisable dict (NaN written as ``None``).

    ``candidates``: columns ``instance_id, traj_id, agent, label, n_chars, n_steps`` (1-D, one entry per
    candidate; ``traj_id`` distinct). ``scores``: name -> (n,) array aligned with ``candidates``
    (higher = better, NaN = missing = lowest). ``reference`` names a score in ``scores`` or a
    built-in (a rule filter that is a column of the table, ``rules.column_scores``: the default
    ``rules.REFERENCE`` = -n_chars); a built-in reference
    not in ``scores`` is added to the output as a score of its own. All scores share one set of
    bootstrap resamples (``seed``), so every difference is paired with every other.

    Output: ``{"settings": {...}, "table": {...counts, agent coding}, "scores": {name: {...}}}`` where
    each score has ``n_missing``, ``auc`` (``weighting`` AUC with ``ci``, the bootstrap interval of
    the AUC itself), ``auc_instances_weighted`` (or ``auc_pairs_weighted``: the other weighting),
    ``same_agent_auc``, ``per_agent_auc`` (agent -> AUC over pairs with both candidates of that agent),
    ``spearman`` (covariate -> ``{"pooled": ..., "within": ...}`` for ``n_chars``, ``n_steps`` and
    ``agent``; agent is ``None`` unless there are exactly two agents, coded as in
    ``table.agent_coding``) and ``vs_reference`` (a :class:`PairedDifference` dict: AUC of this score
    minus the reference's). A score may also be given as a mapping traj_id -> score covering exactly
    the table's ``traj_id`` values (aligned by id, never by position).
    """
    owner = "diagnostics_table"
    check_choice(weighting, "weighting", owner, WEIGHTINGS)
    n_boot, seed, level = _check_n_boot(n_boot, owner), _check_seed(seed, owner), _check_level(level, owner)
    t = _check_table(candidates, owner)
    sc = _score_columns(scores, t, reference, owner)
    shared = _Shared.of(t, sc, weighting=weighting, n_boot=n_boot, seed=seed, level=level)
    out_scores = {name: shared.score(s, shared.boot_auc[name], shared.boot_auc[reference]) for name, s in sc.items()}
    pairs, agents = shared.pairs, shared.agents
    pairs_by_inst = np.bincount(pairs.inst, minlength=pairs.n_inst)
    return {
        "settings": {"reference": reference, "weighting": weighting, "n_boot": n_boot, "seed": seed,
                     "level": level, "missing_rule": "NaN score = missing = lowest; two missing tie",
                     "ties": "tied pair counts 1/2"},
        "table": {"n_candidates": shared.n, "n_instances": pairs.n_inst,
                  "n_mixed_instances": int((pairs_by_inst > 0).sum()), "n_pairs": int(pairs.pos.size),
                  "n_resolved": int(t["label"].sum()), "agents": agents,
                  "agent_coding": {a: i for i, a in enumerate(agents)} if len(agents) == 2 else None},
        "scores": out_scores,
    }


def _score_columns(scores: Mapping[str, Any], t: dict[str, np.ndarray], reference: str,
                   owner: str) -> dict[str, np.ndarray]:
    """name -> (n,) float scores aligned with the table (a mapping aligned by traj_id), the reference
    included (a built-in column rule added as a score of its own)."""
    n = t["instance_id"].shape[0]
    if not isinstance(scores, Mapping) or not scores:
        raise param_error("scores", owner, "a non-empty mapping name -> score array", scores)
    sc = {}
    for name, s in scores.items():
        if not isinstance(name, str) or not name:
            raise param_error("scores", owner, "a mapping with non-empty string names", name)
        if isinstance(s, Mapping):                         # keyed by candidate id
            if set(s) != set(t["traj_id"].tolist()):
                diff = sorted(set(map(str, s)) ^ set(t["traj_id"].tolist()))[:3]
                raise LatentSiftError(f"The 'scores[{name!r}]' parameter of {owner} must have one score per "
                                      f"traj_id of the table. Got differing ids, e.g. {diff}.")
            s = [s[k] for k in t["traj_id"].tolist()]
        sc[name] = _check_score(s, f"scores[{name!r}]", owner, n)
    if reference not in sc:
        builtin = column_scores()  # the registry's rules that are a column: name -> (column, sign)
        if reference not in builtin:
            raise param_error("reference", owner, f"a name in 'scores' or one of {sorted(builtin)}", reference)
        col, sign = builtin[reference]
        sc[reference] = sign * t[col].astype(np.float64)
    return sc


@dataclass
class _Shared:
    """What every score's diagnostics share, computed once: the (resolved, unresolved) pairs, the
    agents, the covariates' values and ranks, and each score's AUC on the shared bootstrap resamples
    (row 0: the sample itself)."""

    pairs: _Pairs
    agent: np.ndarray
    agents: list[str]
    same_agent: np.ndarray
    inst_code: np.ndarray
    covs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    boot_auc: dict[str, np.ndarray]
    n: int
    weighting: str
    n_boot: int
    level: float

    @classmethod
    def of(cls, t: dict[str, np.ndarray], sc: dict[str, np.ndarray], *, weighting: str, n_boot: int, seed: int,
           level: float) -> "_Shared":
        pairs = _build_pairs(t["instance_id"], t["label"])
        agent = t["agent"]
        agents = sorted(set(agent.tolist()))
        same_agent = agent[pairs.pos] == agent[pairs.neg]
        agent_cov = (agent == agents[1]).astype(np.float64) if len(agents) == 2 else None
        inst_code = np.unique(t["instance_id"], return_inverse=True)[1]
        # covariate -> (values, pooled ranks, within-instance normalised ranks), computed once for all scores
        covs = {c: t[c].astype(np.float64) for c in ("n_chars", "n_steps")}
        if agent_cov is not None:
            covs["agent"] = agent_cov
        covs = {c: (v, _rankdata(v), _grouped_ranks(v, inst_code))
                for c, v in covs.items()}
        boot = np.vstack([np.ones((1, pairs.n_inst)),
                          bootstrap_weights(pairs.n_inst, n_boot, np.random.default_rng(seed))])
        sums = {name: _instance_sums(_pair_wins(s, pairs.pos, pairs.neg), pairs.inst, pairs.n_inst)
                for name, s in sc.items()}
        boot_auc = {name: _weighted_auc(*sums[name], boot, weighting) for name in sc}
        return cls(pairs, agent, agents, same_agent, inst_code, covs, boot_auc, t["instance_id"].shape[0],
                   weighting, n_boot, level)

    def interval(self, values: np.ndarray) -> list:
        lo_q, hi_q = 50 * (1 - self.level), 50 * (1 + self.level)
        ok = values[np.isfinite(values)]
        return [_json_num(v) for v in (np.percentile(ok, [lo_q, hi_q]) if ok.size else (np.nan, np.nan))]

    def score(self, s: np.ndarray, boot_auc: np.ndarray, ref_boot_auc: np.ndarray) -> dict:
        """One score's entry of the table."""
        pairs, weighting = self.pairs, self.weighting
        wins = _pair_wins(s, pairs.pos, pairs.neg)
        auc = _auc(wins, pairs.inst, pairs.n_inst, weighting)
        other = "instances" if weighting == "pairs" else "pairs"
        vs_ref = _paired_difference(boot_auc, ref_boot_auc, self.level, self.n_boot, pairs.n_inst)
        score_ranks = _rankdata(_fill_missing(s))
        score_within = _grouped_ranks(s, self.inst_code)

        def sp(cov: str) -> dict:
            pooled = Spearman(_pearson(score_ranks, self.covs[cov][1]), self.n, None)
            within = _within_spearman(s, self.covs[cov][0], self.inst_code, score_ranks=score_within,
                                      cov_ranks=self.covs[cov][2])
            return {"pooled": _sp_dict(pooled), "within": _sp_dict(within)}
        same = self.same_agent
        return {
            "n_missing": int(np.isnan(s).sum()),
            "auc": {**_auc_dict(auc), "ci": self.interval(boot_auc[1:])},
            f"auc_{other}_weighted": _auc_dict(_auc(wins, pairs.inst, pairs.n_inst, other)),
            "same_agent_auc": _auc_dict(_auc(wins[same], pairs.inst[same], pairs.n_inst, weighting)),
            "per_agent_auc": {a: _auc_dict(v) for a, v in _per_agent(pairs, wins, self.agent, weighting).items()},
            "spearman": {"n_chars": sp("n_chars"), "n_steps": sp("n_steps"),
                         "agent": sp("agent") if "agent" in self.covs else None},
            "vs_reference": vs_ref.as_dict(),
        }
