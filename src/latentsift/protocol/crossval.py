"""``latentsift crossval``: the evaluation protocol on any canonical labelled pools with stored states.

Disjoint folds (by repository, agent or instance; banks and scorers from the other folds) -> the
paper's method, its ablations, the variants and the inner-CV default, the baselines -> agent
transfer -> the cascade on seeded draws -> diagnostics, paired bootstrap differences, per-agent
retention -> report. ``reproduce`` runs the same ``evaluate_protocol`` on the shared pools: the
same settings on the same pools and states give the same Stage-1 numbers.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .._core.threads import blas_fixed
from .._core.io import atomic_write_json
from .._core.validation import LatentSiftError, check_choice, check_labelled, check_states_present
from ..deploy.library import load_runs
from ..states.extract import select_instances
from ..states.store import StateStore
from ..trajectories.trajectory import Trajectory, load_jsonl, save_jsonl
from ..cascade.verifier import load_results
from ..metrics.formats import check_gen_test_key
from .folds import check_folds, check_group_by, leaking_pools
from .run import Run, evaluate_protocol
from .settings import ProtocolSettings

#: ``crossval --on-leak``: a pool straddling fold groups is an error, or is left out (``skip``).
ON_LEAK_CROSSVAL = ("error", "skip")


@dataclass(kw_only=True)
class CrossvalSettings(ProtocolSettings):
    """Settings of ``crossval`` (all recorded in the manifest and in summary.json).

    The protocol fields are ``ProtocolSettings``'; ``pools`` is a canonical JSONL of labelled
    candidates, ``states`` their state store, ``verifier`` optional EF verifier results
    (``latentsift`` verifier output folder or verdicts.jsonl) for the cascade's Stage 4 and the
    token columns; ``first_instances``: only the first N instances by id (the rule of
    ``extract --max-instances N``); ``on_leak``: pools that straddle fold groups are refused ("error")
    or left out and named ("skip"); ``sources``: with several pools files / stores, their paths
    (``pools`` is then their union); ``premise``: also the premise section (``protocol.premise``: the
    paper's method, its branches and the probe against the length rules, ``stack:length`` and random,
    with its own Bonferroni family) and the per-candidate scores that pair two runs (own vs proxy).
    """

    pools: str
    states: str
    out: str
    verifier: str | None = None
    first_instances: int | None = None
    on_leak: str = "error"
    sources: dict | None = None
    premise: bool = False

    owner = "crossval"
    key_order = ("pools", "states", "out", "group_by", "n_folds", "ks", "n_draws", "n_boot", "seed", "scorer_epochs",
                 "variants", "curve_fractions", "agent_transfer", "verifier", "first_instances", "on_leak", "sources",
                 "guard_false_alarm", "target_recalls", "premise", "gen_test_key", "testgen_tokens")

    def __post_init__(self):
        super().__post_init__()
        if self.on_leak == "allow":
            raise LatentSiftError("crossval: --on-leak allow would score pools against banks holding their own "
                                  "instance (leakage, not an evaluation); pass --on-leak error or skip.")
        check_choice(self.on_leak, "on_leak", "crossval", ON_LEAK_CROSSVAL)

    def inputs(self) -> tuple[Path, Path]:
        return Path(self.pools), Path(self.states)

    def select(self, trajs: Sequence[Trajectory]) -> list[Trajectory]:
        return select_instances(trajs, self.first_instances)


def check_ks(trajs: Sequence[Trajectory], ks: Sequence[int]) -> None:
    """Refuse, before any work, a K that no pool reaches (pools smaller than a K that some pool reaches
    are left out of that K's averages, as the report says)."""
    largest = max(Counter(t.instance_id for t in trajs).values(), default=0)
    if max(ks) > largest:
        raise LatentSiftError(f"crossval: --k {max(ks)} is larger than every pool (the largest holds {largest} "
                              f"candidates); pass --k values up to {largest}.")


@blas_fixed
def crossval(pools_path: str | Path | Sequence, states_dir: str | Path | Sequence, out: str | Path, *,
             verifier: str | Path | None = None, log: Callable[[str], None] = print,
             progress: Callable[[str, int, int, str], None] | None = None, **settings) -> Path:
    """``latentsift crossval``: the reproduce protocol on any labelled pools with stored states.

    ``settings``: the other ``CrossvalSettings`` fields (``group_by``, ``n_folds``, ``ks``,
    ``first_instances``, ...; defaults there). Every input is checked before anything is written:
    labels, states, fold classes and verifier results. Returns the report folder.
    """
    several = not isinstance(pools_path, (str, Path)) or not isinstance(states_dir, (str, Path))
    if several:  # several runs and stores (same model and settings): read as one (latentsift.deploy.library)
        pools_paths = [pools_path] if isinstance(pools_path, (str, Path)) else list(pools_path)
        states_dirs = [states_dir] if isinstance(states_dir, (str, Path)) else list(states_dir)
        pools_path = Path(out) / "pools.jsonl"  # the combined pools, written below (the explorer reads them)
        settings.setdefault("sources", {"pools": [str(p) for p in pools_paths], "states": [str(d) for d in states_dirs]})
        states_dir = states_dirs[0]
    s = CrossvalSettings(pools=str(pools_path), states=str(states_dir), out=str(out),
                         verifier=None if verifier is None else str(verifier), **settings)
    t_all = time.perf_counter()
    if several:
        trajs, store = load_runs(pools_paths, states_dirs, "crossval", instances=s.first_instances)
    else:
        trajs = s.select(load_jsonl(pools_path))
        check_labelled(trajs, "crossval")
        check_ks(trajs, s.ks)
        if not Path(states_dir).is_dir():
            raise LatentSiftError(f"crossval: no state store at {str(states_dir)!r}; run 'latentsift extract "
                                  f"{pools_path} --out {states_dir}' first.")
        store = StateStore(states_dir).open()
        check_states_present(store, trajs, "crossval")
    leak = {"on_leak": s.on_leak, "pools": []}
    if s.on_leak == "skip":  # leave out (named) the pools whose instance a fold's bank would hold
        leak["pools"] = leaking_pools(trajs, s.group_by)
        bad = {x["instance_id"] for x in leak["pools"]}
        trajs = [t for t in trajs if t.instance_id not in bad]
        for x in leak["pools"]:
            log(f"[leak] {x['instance_id']}: candidates of several {s.group_by}s {x['groups']}; {x['action']}")
        if not trajs:
            raise LatentSiftError(f"crossval: every pool straddles {s.group_by}s; nothing is left to evaluate. "
                                  "Use --group-by repo.")
    check_ks(trajs, s.ks)
    check_gen_test_key(trajs, s.gen_test_key, "crossval")
    check_group_by(trajs, s.group_by, "crossval")
    run = Run(s, log=log, progress=progress)
    folds = run.folds(trajs)
    check_folds(trajs, folds, run.group, "crossval")
    ef = None
    if verifier is not None:
        _, ef, _ = load_results(verifier)
        missing = [t.traj_id for t in trajs if t.traj_id not in ef]
        if missing:
            raise LatentSiftError(f"crossval: the verifier results {str(verifier)!r} have no result for "
                                  f"{len(missing)} candidates, e.g. {missing[0]!r}.")
        ef = {t.traj_id: ef[t.traj_id] for t in trajs}
    run.out.mkdir(parents=True, exist_ok=True)
    if several:
        save_jsonl(trajs, pools_path)
    if (run.out / "report" / "summary.json").exists():
        (run.out / "report" / "summary.json").unlink()  # presence of summary.json = this run finished
    atomic_write_json(run.out / "manifest.json", {"command": "latentsift crossval", "settings": s.to_dict(),
                                                  "format": 1})
    meta = {"crossval": s.to_dict(), "group_by": s.group_by,
            "stage3": "not evaluated (no generated tests): Stage 3 is skipped and never charged",
            "stage2": "regression = tests.p2p_passed where the pools record it; rule 'skip-stage'",
            "leak": leak}
    return evaluate_protocol(run, trajs, store, tokenizer=None, verifier=ef, meta=meta, t_all=t_all)
