"""The protocol's tables: the ablation groups, the candidate table, paired retention differences
and retention per agent (all computed from the evaluation's ledger)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..metrics.diagnostics import paired_bootstrap
from ..sift.variants import DEFAULT, RECOMMENDED
from ..sift.rules import PAPER, filters as registered, find_filter, rule_keys, rules
from ..trajectories.trajectory import Trajectory


def ablation_tables(filters: Sequence[str]) -> dict[str, dict]:
    """The paper's ablation tables (full method first in each), restricted to the filters present."""
    abl = registered("ablation")  # the registered ablations, each in the table of its group

    def group(g: str) -> list[str]:
        return [e.key for e in abl if e.group == g]

    def named(g: str) -> dict[str, str]:
        return {e.key: e.label for e in abl if e.group == g and e.label != e.name}

    tables = {
        "channels": {"title": "Channel subsets (distance branch; learned branch fused)",
                     "filters": [PAPER, *group("channels")],
                     "labels": {PAPER: "cot+obs+fn (paper)"} | named("channels")},
        "distance": {"title": "Distance construction", "filters": [PAPER, *group("distance")],
                     "labels": {PAPER: "two-sided d_neg - d_pos (paper)"} | named("distance")},
        "naive": {"title": "Step weighting, branches and naive rules",
                  "filters": [PAPER, *group("naive"), *rule_keys()],
                  "labels": {PAPER: "LatentSift (paper)"} | named("naive")},
    }
    plain = {e.key for e in rules() if not e.tokenizer}  # the rules computed from the trajectories alone
    beyond = sorted(f for f in filters if getattr(find_filter(f), "kind", None) in ("variant", "sweep"))
    variants = [PAPER, RECOMMENDED, DEFAULT] + beyond + [k for k in rule_keys() if k in plain]
    tables["variants"] = {"title": "Beyond the paper: variants (default chosen by cross-validation inside the "
                                   "bank folds only)", "filters": variants,
                          "labels": {PAPER: "LatentSift (paper reference)",
                                     RECOMMENDED: "recommended (fit --method auto per fold)",
                                     DEFAULT: "default (inner-CV choice per fold)"}}
    have = set(filters)
    return {k: v | {"filters": [f for f in v["filters"] if f in have]} for k, v in tables.items()}


def candidate_table(trajs: Sequence[Trajectory]) -> dict[str, np.ndarray]:
    """One row per candidate, by traj_id: instance, agent, label, characters and steps (the diagnostics' input)."""
    ts = sorted(trajs, key=lambda t: t.traj_id)
    return {"instance_id": np.array([t.instance_id for t in ts]), "traj_id": np.array([t.traj_id for t in ts]),
            "agent": np.array([t.agent for t in ts]), "label": np.array([int(t.label) for t in ts]),
            "n_chars": np.array([t.n_chars for t in ts]), "n_steps": np.array([t.n_steps for t in ts])}


def retention_differences(ledger: Sequence[dict], reference: str, ks: Sequence[int], *, n_boot: int = 1000,
                          seed: int = 0) -> dict:
    """Oracle retention of every filter minus the reference's, paired bootstrap over instances.

    Retention is the pooled ratio of the evaluation (sum of P(draw solvable and retained set
    solvable) over sum of P(draw solvable)); both arms see the same resampled instances.
    """
    out: dict[str, dict] = {}
    for k in ks:
        rows = [r for r in ledger if r["k"] == k]
        insts = sorted({r["instance_id"] for r in rows})
        pos = {i: j for j, i in enumerate(insts)}
        by: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for r in rows:
            rs, ps = by.setdefault(r["filter"], (np.zeros(len(insts)), np.zeros(len(insts))))
            rs[pos[r["instance_id"]]] = r["retained_solvable"]
            ps[pos[r["instance_id"]]] = r["pass"]
        if reference not in by:
            continue
        ref_rs, ref_ps = by[reference]
        for f, (rs, ps) in by.items():
            def metric(W, rs=rs, ps=ps):
                with np.errstate(invalid="ignore", divide="ignore"):  # a resample with no solvable draw: NaN
                    return (W @ rs) / (W @ ps), (W @ ref_rs) / (W @ ref_ps)
            d = paired_bootstrap(metric, insts, n_boot=n_boot, seed=seed)
            out.setdefault(f, {})[str(k)] = {"estimate": d.estimate, "lo": d.lo, "hi": d.hi, "a": d.a, "b": d.b,
                                             "n_valid": d.n_valid, "n_instances": d.n_instances}
    return out


def per_agent_retention(ledger: Sequence[dict], trajs: Sequence[Trajectory], ks: Sequence[int]) -> dict:
    """Retention per filter and K, split by the agent whose candidates carry the resolution.

    An instance counts for agent A when every resolved candidate of its pool is A's (pools where both
    agents resolved it are 'both'); this shows whether a filter serves one agent at the other's cost.
    """
    solvers: dict[str, set] = {}
    for t in trajs:
        if t.label == 1:
            solvers.setdefault(t.instance_id, set()).add(t.agent)
    group = {i: (next(iter(a)) if len(a) == 1 else "both") for i, a in solvers.items()}
    out: dict[str, dict] = {}
    for r in ledger:
        g = group.get(r["instance_id"])
        if g is None or r["k"] not in ks:
            continue
        cell = out.setdefault(r["filter"], {}).setdefault(g, {}).setdefault(str(r["k"]), [0.0, 0.0, 0])
        cell[0] += r["retained_solvable"]
        cell[1] += r["pass"]
        cell[2] += 1
    return {f: {g: {k: {"retention": (v[0] / v[1]) if v[1] else None, "n_instances": v[2]} for k, v in kk.items()}
                for g, kk in gg.items()} for f, gg in out.items()}
