"""The main job end to end on the shared SWE-bench Lite pools (``latentsift reproduce``).

import -> replay states with the embedded model -> repository-disjoint k-fold (banks and scorer from
the other folds' repositories) -> Stage-1 filters -> four-stage cascade -> evaluation -> report.

Every stage writes into the run folder and is reused by a rerun with the same settings:

    OUT/manifest.json          settings, written first
    OUT/pools.jsonl            the imported, selected candidates (canonical JSONL)
    OUT/states/                the state store (resumable; see ``store.StateStore``)
    OUT/folds/fold-<k>/        bank/ and scorer/ of fold k (reused when their settings match)
    OUT/verifier/              EF-verifier results and its on-disk call cache
    OUT/report/                summary.json, report.md, figures (written last: presence = finished)
    OUT/stage1/                latentsift.json (per-candidate scores and evidence), retained.json (issue 18)
    OUT/report/index.html      the explorer (latentsift.explore), written after the report

Data rules (dataset README): the runs ``acr-val-only`` and ``acr-val-sbfl`` told the agent the result
of the hidden tests, so their trajectories give the label away; they are left out of every selection
experiment unless ``include_leaky=True``. Stage 3 (generated tests) does not exist in this data.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ._io import atomic_write_json
from ._validation import LatentSiftError, check_choice, check_positive_int
from .trajectory import Trajectory, group_pools, load_jsonl, save_jsonl

CLEAN_RUNS = ("acr-run-1", "acr-run-2", "acr-run-3", "cost_2_1", "cost_2_2", "cost_2_3")
LEAKY_RUNS = ("acr-val-only", "acr-val-sbfl")
SWEEP = ("gemma", "patch", "span")  # representations with states of their own (ReproduceSettings.sweep)
_STATES = ["q_cot", "q_obs", "q_fn", "probe"]
# Candidates of the inner-CV default choice: signals of a stacked fusion (weights learned on the bank).
# 'stack:length' uses no state: it is there so that the choice can say when states add nothing.
STACK_CONFIGS: dict[str, list[str]] = {
    "probe": ["probe"],
    "stack:states": _STATES,
    "stack:length": ["neg_chars", "neg_steps"],
    "stack:states+length": _STATES + ["neg_chars", "neg_steps"],
    "stack:states+length+patch": _STATES + ["neg_chars", "neg_steps", "patch_lines", "no_patch"],
}


@dataclass
class ReproduceSettings:
    """Settings of one reproduce run (all recorded in the manifest).

    Budget of the default run (at most 20 minutes from a cold cache on a 2-core AVX2 CPU in float32,
    measured 19.0 under emulation; README "Timings"; until 2026-11 the defaults were n_unresolved=30
    and max_span_tokens=32, about 40 minutes there):
    ``instances="default"``: every instance with at least one resolved candidate among the selected
    runs (the only instances where retention is defined and where Best@K can differ between
    filters) plus ``n_unresolved`` instances resolved by no candidate, chosen by a hash of the
    instance id (never by any score); ``max_span_tokens`` keeps the head of every cot/obs/fn span
    and ``max_prompt_tokens`` the head of the task prompt and other excluded context;
    ``verifier_max_tokens`` is the EF verifier's prompt budget (longer logs are condensed).
    ``full=True`` means every instance, whole spans (up to the model context) and an 8k verifier budget.
    ``curve_fractions``: bank fractions of the training-set size curves (learned branch).
    ``sweep`` adds representations that need states of their own (``SWEEP``, or ``("all",)``): the
    Gemma-3-270M proxy encoder (``gemma``), ``sweep_span_tokens`` per span (``span``: longer
    context; the sliding-window rule handles what exceeds the model context) and the patch-writing
    step kept up to ``sweep_patch_tokens`` per span (``patch``; the other spans keep
    ``max_span_tokens``); each is extracted into OUT/sweep/<name>/states and evaluated
    with the paper's method and the inner-CV default.
    """

    data: str
    out: str
    runs: tuple[str, ...] = CLEAN_RUNS
    include_leaky: bool = False
    instances: str = "default"          # "default" | "all"
    n_unresolved: int = 10
    max_instances: int | None = None    # cap on the selected instances (hash order), for quick runs
    max_span_tokens: int | None = 16
    max_prompt_tokens: int | None = 128
    verifier_max_tokens: int = 512
    model: str | None = None
    dtype: str = "auto"                 # "auto": bfloat16 where the hardware runs it natively, else float32
    n_folds: int = 4
    ks: tuple[int, ...] = (4, 5, 6)
    n_draws: int = 200
    n_boot: int = 1000
    seed: int = 0
    scorer_epochs: int = 40
    variants: bool = True
    curve_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    sweep: tuple[str, ...] = ()         # names of SWEEP, or ("all",)
    sweep_span_tokens: int = 128
    sweep_patch_tokens: int = 1024
    full: bool = False
    group_by: str = "repo"              # folds by "repo" (paper), "agent" or "instance" (protocol.GROUP_BY)
    agent_transfer: bool = True         # the report's agent-transfer table (banks/scorers from one agent)
    guard_false_alarm: float = 0.05     # shift.FALSE_ALARM: the shift guard's stated false-alarm rate

    def __post_init__(self):
        if self.full:
            self.instances = "all"
            self.max_span_tokens = None
            self.max_prompt_tokens = None
            self.verifier_max_tokens = 8192 - 16
        self.sweep = tuple(SWEEP) if tuple(self.sweep) == ("all",) else tuple(self.sweep)
        bad = sorted(set(self.sweep) - set(SWEEP))
        if bad:
            raise LatentSiftError(f"The 'sweep' parameter of reproduce must name representations among "
                                  f"{list(SWEEP)} or 'all'. Got {bad} instead.")
        if self.include_leaky:
            self.runs = tuple(self.runs) + tuple(r for r in LEAKY_RUNS if r not in self.runs)
        from .protocol import GROUP_BY
        check_choice(self.group_by, "group_by", "ReproduceSettings", GROUP_BY)
        for name in ("n_folds", "sweep_span_tokens", "sweep_patch_tokens"):
            check_positive_int(getattr(self, name), name, "ReproduceSettings")
        if self.max_instances is not None:
            check_positive_int(self.max_instances, "max_instances", "ReproduceSettings (--max-instances)")
        if self.instances not in ("default", "all"):
            raise LatentSiftError(f"The 'instances' parameter of reproduce must be one of ['all', 'default']. "
                                  f"Got {self.instances!r} instead.")

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("runs", "ks", "curve_fractions", "sweep"):
            d[k] = list(getattr(self, k))
        return d


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _hash_key(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")


def check_data_dir(data: str | Path) -> Path:
    d = Path(data)
    if not (d / "candidates.csv").is_file() or not (d / "r2egym").is_dir() or not (d / "sweagent").is_dir():
        raise LatentSiftError(
            f"The dataset folder {str(d)!r} is missing or incomplete. 'latentsift reproduce' needs the "
            "SWE-bench Lite candidate pools (candidates.csv, r2egym/*.jsonl.gz, sweagent/*.tar.gz): put the "
            "shared folder beside this checkout so that ../shared/datasets/swebench-lite-pools exists, "
            "or pass --data DIR.")
    return d


def select_trajectories(trajs: Sequence[Trajectory], s: ReproduceSettings) -> tuple[list[Trajectory], dict]:
    """The runs and instances of the experiment, and a record of what was left out and why."""
    runs = set(s.runs)
    unknown = sorted(runs - {t.run for t in trajs})
    if unknown:
        raise LatentSiftError(f"The 'runs' parameter of reproduce names runs absent from the data: {unknown}.")
    kept = [t for t in trajs if t.run in runs]
    left = {"runs_left_out": sorted({t.run for t in trajs} - runs)}
    if any(t.meta.get("leaks_label") for t in kept):
        left["warning"] = "label-leaking runs included on request (include_leaky=True)"
    if s.instances == "all":
        return kept, left | {"instances": "all"}
    by: dict[str, list[Trajectory]] = {}
    for t in kept:
        by.setdefault(t.instance_id, []).append(t)
    solvable = sorted(i for i, c in by.items() if any(t.label == 1 for t in c))
    unsolved = sorted((i for i, c in by.items() if not any(t.label == 1 for t in c)),
                      key=lambda i: _hash_key(s.seed, i))[: s.n_unresolved]
    chosen = set(solvable) | set(unsolved)
    if s.max_instances is not None:
        chosen = set(sorted(chosen, key=lambda i: _hash_key(s.seed, i))[: s.max_instances])
    left |= {"instances": "default", "n_solvable": len(solvable), "n_unresolved_sampled": len(unsolved),
             "n_instances_left_out": len(by) - len(chosen)}
    return [t for t in kept if t.instance_id in chosen], left


# ---------------------------------------------------------------------------------------- stages
class Run:
    """One reproduce run folder and its cached stages."""

    def __init__(self, settings: ReproduceSettings, log: Callable[[str], None] = print,
                 progress: Callable[[str, int, int, str], None] | None = None):
        self.s = settings
        self.out = Path(settings.out)
        self.log = log
        self.progress = progress or (lambda stage, done, total, info: None)
        self.timings: dict[str, float] = {}
        self._curve_scores: dict[str, dict[str, float]] = {}
        self.curve_sizes: dict[str, dict[str, int]] = {}
        self._described: set[str] = set()

    # -- helpers
    def _timed(self, name: str, t0: float) -> None:
        self.timings[name] = round(time.perf_counter() - t0, 2)
        self.log(f"[{name}] {self.timings[name]:.1f} s")

    def manifest(self) -> dict:
        return {"command": "latentsift reproduce", "settings": self.s.to_dict(), "format": 1}

    # -- 1. import
    def import_pools(self) -> tuple[list[Trajectory], dict]:
        from .importers import import_paths
        t0 = time.perf_counter()
        data = check_data_dir(self.s.data)
        path = self.out / "pools.jsonl"
        meta_path = self.out / "pools.meta.json"
        key = _digest({k: self.s.to_dict()[k] for k in ("data", "runs", "instances", "n_unresolved",
                                                           "max_instances", "seed")})
        if path.is_file() and meta_path.is_file() and json.loads(meta_path.read_text()).get("key") == key:
            meta = json.loads(meta_path.read_text())
            trajs = load_jsonl(path)
        else:
            res = import_paths([data / "r2egym", data / "sweagent"], labels=data / "candidates.csv")
            trajs, left = select_trajectories(res.trajectories, self.s)
            save_jsonl(trajs, path)
            meta = {"key": key, "import_summary": res.summary.to_dict(), "selection": left,
                    "n_trajectories": len(trajs)}
            atomic_write_json(meta_path, meta)
            meta = json.loads(meta_path.read_text())  # the same object (key order) as a cached rerun reads
        self._timed("import", t0)
        return trajs, meta

    # -- 2. states
    def extract(self, trajs: Sequence[Trajectory], *, name: str = "extract", model: str | None = None,
                out: Path | None = None, **render):
        """Replay the trajectories into a state store (default: the run's model into OUT/states).

        ``render`` overrides the run's ``max_span_tokens`` / ``max_prompt_tokens`` or sets
        ``patch_step_tokens`` (the sweep's representations); the store is resumable and cached.
        """
        from .model import load_policy
        from .extract import extract_pools
        from .store import StateStore
        t0 = time.perf_counter()
        policy = load_policy(model or self.s.model, dtype=self.s.dtype)
        if policy.path not in self._described:
            self._described.add(policy.path)
            self.log(f"[{name}] model: {policy.describe()}")
        out = out or self.out / "states"
        kw = {"max_span_tokens": self.s.max_span_tokens, "max_prompt_tokens": self.s.max_prompt_tokens} | render

        def progress(p) -> None:
            rate = f"{p.tokens / p.elapsed:,.0f} tok/s" if p.elapsed > 0 else ""
            self.progress(name, p.done, p.total, rate)

        rep = extract_pools(policy, trajs, out, progress=progress, **kw)
        self.log(f"[{name}] {rep.n_extracted} extracted, {rep.n_skipped} reused from the cache, "
                 f"{rep.n_tokens:,} tokens ({rep.tokens_per_s:,.0f} tok/s), {rep.n_windowed} sliding-window")
        self._timed(name, t0)
        return policy, StateStore(out).open()

    # -- 3. folds: banks and scorers from the other folds' groups (repositories by default)
    def group(self, traj: Trajectory) -> str:
        """The fold group of a trajectory (``settings.group_by``: repo, agent or instance)."""
        from .protocol import group_of
        return group_of(traj, getattr(self.s, "group_by", "repo"))

    def folds(self, trajs: Sequence[Trajectory]) -> list[tuple[list[str], list[str]]]:
        """(bank groups, eval groups) per fold: disjoint groups, balanced by trajectory count."""
        from .bank import split_by_repo
        from .protocol import group_noun
        groups = {t.traj_id: self.group(t) for t in trajs}
        n = len(set(groups.values()))
        if not 2 <= self.s.n_folds <= n:
            kind = getattr(self.s, "group_by", "repo")
            raise LatentSiftError(f"{self.s.n_folds} disjoint folds need at least {max(self.s.n_folds, 2)} "
                                  f"{group_noun(kind, 2)}, but the selected trajectories come from {n} "
                                  f"{group_noun(kind, n)}: use --folds between 2 and {n} or select more instances.")
        return split_by_repo(groups, n_folds=self.s.n_folds, seed=self.s.seed)

    def fit_fold(self, k: int, bank_trajs: Sequence[Trajectory], states: dict, fingerprint, bank_params: dict,
                 name: str = "paper"):
        """Bank + scorer of fold k for one representation setting, cached under OUT/folds/fold-k/<name>."""
        from .bank import Bank
        from .scorer import LinearScorer
        fold_dir = self.out / "folds" / f"fold-{k}" / name
        ids = sorted(t.traj_id for t in bank_trajs)
        key = _digest({"ids": ids, "bank": bank_params, "epochs": self.s.scorer_epochs, "seed": self.s.seed,
                       "fp": fingerprint.digest})
        key_path = fold_dir / "key.json"
        if key_path.is_file() and json.loads(key_path.read_text()).get("key") == key:
            return Bank.load(fold_dir / "bank"), LinearScorer.load(fold_dir / "scorer")
        labels = {t.traj_id: int(t.label) for t in bank_trajs}
        bank = Bank(**bank_params).fit({i: states[i] for i in ids}, labels,
                                       {t.traj_id: t.instance_id for t in bank_trajs},
                                       {t.traj_id: t.repo for t in bank_trajs}, fingerprint)
        scorer = LinearScorer(max_epochs=self.s.scorer_epochs, seed=self.s.seed).fit(
            [states[i] for i in ids], [labels[i] for i in ids], fingerprint=fingerprint)
        bank.save(fold_dir / "bank")
        scorer.save(fold_dir / "scorer")
        atomic_write_json(key_path, {"key": key})
        # continue from the saved files, exactly as a cached rerun does (same arrays, same results)
        return Bank.load(fold_dir / "bank"), LinearScorer.load(fold_dir / "scorer")

    # -- 4. EF verifier on every evaluated candidate (cached by prompt hash)
    def verify(self, policy, trajs: Sequence[Trajectory]) -> dict:
        from .verifier import EFVerifier, LocalBackend, save_results
        t0 = time.perf_counter()
        ef = EFVerifier(LocalBackend(policy=policy), max_prompt_tokens=self.s.verifier_max_tokens,
                        cache_dir=self.out / "verifier" / "cache")
        results = ef.score(trajs, progress=lambda i, n: self.progress("EF verifier", i, n, ""))
        save_results(results, self.out / "verifier", name="ef", manifest=ef.manifest())
        failed = [t for t, r in results.items() if r.score is None]
        if failed and len(failed) == len(results):
            raise LatentSiftError(f"The EF verifier scored none of the {len(results)} candidates: "
                                  f"{results[failed[0]].error}. Raise --verifier-max-tokens.")
        if failed:
            self.log(f"[verify] {len(failed)} candidates have no verifier score (reported per candidate)")
        cut = sum(1 for r in results.values() if (r.condensed or {}).get("patch"))
        self.log(f"[verify] {len(results) - len(failed)} scored; the final patch was cut to fit the "
                 f"{self.s.verifier_max_tokens}-token budget in {cut} prompts")
        self._timed("verify", t0)
        return results

    # -- 5. Stage-1 filters, prepared per fold, scored within each draw
    def stage1_filters(self, trajs, folds, states, fingerprint, tokenizer, *,
                       sweep: str | None = None) -> tuple[dict, dict, dict]:
        """name -> draw scorer for every filter; per-candidate full-pool scores; fold bookkeeping.

        ``sweep``: a representation of the sweep (states of its own): only the paper's method and the
        inner-CV default are built, named ``sweep:<name>`` and ``sweep:<name>:default``.
        """
        from .sift import LatentSift, make_baseline
        t0 = time.perf_counter()
        pools = group_pools(trajs)
        by_repo: dict[str, list] = {}  # fold group -> pools (repositories by default)
        for p in pools:
            by_repo.setdefault(self.group(p.candidates[0]), []).append(p)
        per_instance: dict[str, dict[str, tuple]] = {}   # filter -> instance -> (filter obj, prepared)
        fold_info = []

        def put(name, filt, prep):
            per_instance.setdefault(name, {}).update({i: (filt, p) for i, p in prep.items()})

        for k, (bank_repos, eval_repos) in enumerate(folds):
            bank_set, eval_set = set(bank_repos), set(eval_repos)
            bank_trajs = [t for t in trajs if self.group(t) in bank_set]
            eval_pools = [p for r in sorted(eval_set) for p in by_repo.get(r, [])]
            if not eval_pools:
                continue
            info = {"fold": k, "bank_repos": bank_repos, "eval_repos": eval_repos,
                    "n_bank_trajectories": len(bank_trajs),
                    "n_bank_positive": sum(t.label == 1 for t in bank_trajs),
                    "n_eval_instances": len(eval_pools)}
            bank, scorer = self.fit_fold(k, bank_trajs, states, fingerprint, {},
                                         "paper" if sweep is None else f"sweep-{sweep}")
            for name, params in self.latentsift_variants(ablations=sweep is None).items():
                filt = LatentSift(bank, scorer, seed=self.s.seed, **params)
                put(name, filt, filt.prepare_many(eval_pools, states, fingerprint=fingerprint))
            for name in ("random", "shortest_tokens", "shortest_chars", "fewest_steps") if sweep is None else ():
                kw = {"tokenizer": tokenizer} if name == "shortest_tokens" else {}
                filt = make_baseline(name.replace("_", "-"), seed=self.s.seed, **kw)
                put(name, filt, filt.prepare_many(eval_pools, states, fingerprint=fingerprint))
            if self.s.variants or sweep is not None:
                info["variants"] = self.variant_filters(k, bank_trajs, eval_pools, states, fingerprint, scorer,
                                                        per_instance, put, curves=sweep is None)
            fold_info.append(info)
        if sweep is not None:
            per_instance = {f"sweep:{sweep}" + ("" if n == "latentsift" else f":{n}"): per_instance[n]
                            for n in ("latentsift", "default") if n in per_instance}
        draw_scorers = {name: _DrawScorer(table) for name, table in per_instance.items()}
        full = {name: {t: v for i, (f, p) in table.items() for t, v in f.rank_subset(p, p.traj_ids).items()}
                for name, table in per_instance.items()}
        if sweep is not None:
            self._timed(f"stage1:{sweep}", t0)
            return draw_scorers, full, {"folds": fold_info}
        full |= self._curve_scores  # training-set size curves: per-candidate scores, diagnostics only
        channels = {}
        for i, (f, p) in per_instance["latentsift"].items():
            for j, c in enumerate(p.channels):
                channels.setdefault(f"q_{c}", {}).update(dict(zip(p.traj_ids, p.q[:, j].tolist())))
            if p.q_lin is not None:
                channels.setdefault("q_lin", {}).update(dict(zip(p.traj_ids, p.q_lin.tolist())))
        self._timed("stage1", t0)
        return draw_scorers, full | {"_components": channels}, {"folds": fold_info}

    def sweep_specs(self) -> dict[str, dict]:
        """The selected sweep representations: name -> extraction settings (``ReproduceSettings.sweep``)."""
        from .model import gemma_model_path
        specs = {"gemma": lambda: ("gemma-3-270m", {"model": str(gemma_model_path())}),
                 "span": lambda: (f"span-{self.s.sweep_span_tokens}", {"max_span_tokens": self.s.sweep_span_tokens}),
                 "patch": lambda: (f"patch-{self.s.sweep_patch_tokens}",
                                   {"patch_step_tokens": self.s.sweep_patch_tokens})}
        return dict(specs[n]() for n in self.s.sweep)

    def agent_transfer(self, trajs, folds, states, fingerprint) -> tuple[dict, dict]:
        """The paper's method with banks and scorer from one agent's trajectories only, per fold.

        Same folds as the main table; the bank side keeps only agent A's trajectories of the bank
        groups, the evaluation pools stay mixed. Named ``transfer:<agent>``; an agent whose bank has
        one class only in some fold has no row (the reason is recorded). Cost: one bank and one
        scorer per agent and fold; ablations, variants and baselines are not refitted (the
        baselines need no training, so their rows of the main table apply unchanged).
        """
        from .sift import LatentSift
        t0 = time.perf_counter()
        agents = sorted({t.agent for t in trajs})
        info: dict[str, Any] = {"agents": agents, "reference": "latentsift", "filters": {}, "unavailable": {},
                                "rule": "banks and scorer trained on one agent's trajectories of the bank folds; "
                                        "evaluated on the mixed pools of the held-out folds (paper's method only)"}
        if len(agents) < 2:
            info["note"] = "one agent only: the transfer table is the main table"
            return {}, info
        pools = group_pools(trajs)
        scorers: dict[str, _DrawScorer] = {}
        for a in agents:
            table: dict[str, tuple] = {}
            reason = None
            for k, (bank_groups, eval_groups) in enumerate(folds):
                bank_set, eval_set = set(bank_groups), set(eval_groups)
                eval_pools = [p for p in pools if self.group(p.candidates[0]) in eval_set]
                if not eval_pools:
                    continue
                bank_trajs = [t for t in trajs if self.group(t) in bank_set and t.agent == a]
                n_pos = sum(t.label == 1 for t in bank_trajs)
                if n_pos == 0 or n_pos == len(bank_trajs):
                    reason = (f"fold {k}: {a}'s bank trajectories ({len(bank_trajs)}) have {n_pos} resolved; "
                              "a bank needs both classes")
                    break
                slug = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in a)
                bank, scorer = self.fit_fold(k, bank_trajs, states, fingerprint, {}, f"agent-{slug}")
                filt = LatentSift(bank, scorer, seed=self.s.seed)
                table.update({i: (filt, p) for i, p in
                              filt.prepare_many(eval_pools, states, fingerprint=fingerprint).items()})
            if reason is not None:
                info["unavailable"][a] = reason
                self.log(f"[agent transfer] no row for {a}: {reason}")
                continue
            info["filters"][a] = f"transfer:{a}"
            scorers[f"transfer:{a}"] = _DrawScorer(table)
        self._timed("agent_transfer", t0)
        return scorers, info

    def latentsift_variants(self, ablations: bool = True) -> dict[str, dict]:
        """The paper's method and its ablations (all on the paper's banks and scorer)."""
        v = {"latentsift": {}}
        if not ablations:
            return v
        for sub in (("cot",), ("obs",), ("fn",), ("cot", "obs"), ("cot", "fn"), ("obs", "fn")):
            v["channels:" + "+".join(sub)] = {"channels": sub}
        v["distance:pos"] = {"distance": "pos"}
        v["distance:neg"] = {"distance": "neg"}
        v["weighting:uniform"] = {"weighting": "uniform"}
        v["branch:distance"] = {"branches": "distance"}
        v["branch:learned"] = {"branches": "learned"}
        return v

    def variant_filters(self, k, bank_trajs, eval_pools, states, fingerprint, scorer, per_instance, put, *,
                        curves: bool = True) -> dict:
        """Beyond-paper variants of one outer fold (``latentsift.variants``); returns what was chosen."""
        from .bank import Bank
        from .sift import LatentSift, Prepared
        from .variants import LogisticProbe, center_by_group, merge_prepared, split_pools_by_group
        bank_ids = sorted(t.traj_id for t in bank_trajs)
        labels = {t.traj_id: int(t.label) for t in bank_trajs}
        agent = {t.traj_id: t.agent for t in trajs_of(bank_trajs, eval_pools)}
        eval_ids = sorted(c.traj_id for p in eval_pools for c in p.candidates)
        # representation variants of the distance branch, fused with the paper's learned branch
        reps = {"layer:middle": ({"layer": (states[bank_ids[0]].n_layers // 2) - 1}, states),
                "norm:l2": ({"normalize": "l2"}, states), "norm:whiten": ({"normalize": "whiten"}, states)}
        centered = center_by_group(states, agent, bank_ids, layers=[-1])
        reps["center:scaffold"] = ({}, centered)
        for name, (params, sts) in reps.items():
            bank_v = Bank(**params).fit({i: sts[i] for i in bank_ids}, labels,
                                        {t.traj_id: t.instance_id for t in bank_trajs},
                                        {t.traj_id: t.repo for t in bank_trajs}, fingerprint)
            # the distance branch on this representation; the learned branch keeps the paper's q_lin
            dist = LatentSift(bank_v, None, branches="distance", seed=self.s.seed)
            raw = per_instance["latentsift"]
            prep = {i: Prepared(i, p.traj_ids, p.channels, p.q, raw[i][1].q_lin, None, p.evidence)
                    for i, p in dist.prepare_many(eval_pools, sts, fingerprint=fingerprint).items()}
            put(f"variant:{name}", LatentSift(bank_v, scorer, seed=self.s.seed), prep)
        # scaffold-conditioned banks: retrieve only among bank trajectories of the candidate's scaffold
        base = LatentSift(Bank().fit({i: states[i] for i in bank_ids}, labels,
                                     {t.traj_id: t.instance_id for t in bank_trajs},
                                     {t.traj_id: t.repo for t in bank_trajs}, fingerprint), scorer, seed=self.s.seed)
        parts: dict[str, list] = {}
        for g, sub in split_pools_by_group(eval_pools, lambda c: c.agent).items():
            g_ids = [i for i in bank_ids if agent[i] == g]
            if len({labels[i] for i in g_ids}) < 2:  # no bank of both classes for this scaffold: shared bank
                filt_g = base
            else:
                g_trajs = [t for t in bank_trajs if t.traj_id in set(g_ids)]
                filt_g = LatentSift(Bank().fit({i: states[i] for i in g_ids}, {i: labels[i] for i in g_ids},
                                               {t.traj_id: t.instance_id for t in g_trajs},
                                               {t.traj_id: t.repo for t in g_trajs}, fingerprint),
                                    scorer, seed=self.s.seed)
            for i, p in filt_g.prepare_many(sub, states, fingerprint=fingerprint).items():
                parts.setdefault(i, []).append(p)
        put("variant:scaffold-bank", base, {i: merge_prepared(ps) for i, ps in parts.items()})
        try:
            # the learned branch: regularised logistic probe vs the paper's gated head
            probe = LogisticProbe(seed=self.s.seed).fit([states[i] for i in bank_ids], [labels[i] for i in bank_ids])
            probe_eval = dict(zip(eval_ids, probe.decision_function([states[i] for i in eval_ids])))
            if curves:
                self.learning_curves(k, bank_trajs, eval_ids, states, fingerprint, probe_eval, per_instance)
            return self._stacked_variants(bank_trajs, eval_pools, states, fingerprint, labels, probe_eval,
                                          per_instance, put)
        except LatentSiftError as e:  # e.g. a bank with too few resolved trajectories (tiny runs)
            for n in [*STACK_CONFIGS, "default"]:
                tbl = per_instance["latentsift"]
                put(n if n == "default" else f"variant:{n}", tbl[eval_pools[0].instance_id][0],
                    {p.instance_id: tbl[p.instance_id][1] for p in eval_pools})
            self.log(f"[variants] fold {k}: inner cross-validation impossible ({e}); the stacked variants "
                     "and the default fall back to the paper's method in this fold")
            return {"chosen_default": "latentsift (fallback)", "reason": str(e)}

    def learning_curves(self, k, bank_trajs, eval_ids, states, fingerprint, probe_eval, per_instance) -> None:
        """Training-set size curves of the learned branch (gated head and logistic probe) in fold k.

        Bank instances are taken in a fixed hash order (seeded; nested subsets), so fraction f uses
        the first f of them; the full bank reuses the fold's paper scorer and probe. Scores of the
        fold's evaluation candidates go to ``self._curve_scores['curve:<learner>@<f>']`` (per
        candidate; the report computes their within-pool AUC), bank sizes to ``self.curve_sizes``.
        """
        from .scorer import LinearScorer
        from .variants import LogisticProbe, bank_subsample
        labels = {t.traj_id: int(t.label) for t in bank_trajs}
        eval_set = set(eval_ids)
        q_lin = {t: float(v) for _, p in per_instance["latentsift"].values() if p.q_lin is not None
                 for t, v in zip(p.traj_ids, p.q_lin) if t in eval_set}
        for f in self.s.curve_fractions:
            tag = f"{round(100 * f)}%"
            if f >= 1.0:
                got = {"gated": q_lin, "probe": probe_eval}
                n = len(bank_trajs)
            else:
                sub = bank_subsample(bank_trajs, f, seed=self.s.seed)
                ids = sorted(t.traj_id for t in sub)
                n = len(ids)
                try:
                    probe = LogisticProbe(seed=self.s.seed).fit([states[i] for i in ids], [labels[i] for i in ids])
                except LatentSiftError as e:
                    self.log(f"[curves] fold {k}: {tag} of the bank skipped ({e})")
                    continue
                gated = LinearScorer(max_epochs=self.s.scorer_epochs, seed=self.s.seed).fit(
                    [states[i] for i in ids], [labels[i] for i in ids], fingerprint=fingerprint)
                ev = [states[i] for i in eval_ids]
                got = {"gated": dict(zip(eval_ids, gated.decision_function(ev).tolist())),
                       "probe": dict(zip(eval_ids, probe.decision_function(ev).tolist()))}
            for learner, sc in got.items():
                self._curve_scores.setdefault(f"curve:{learner}@{tag}", {}).update(
                    {t: float(v) for t, v in sc.items()})
            self.curve_sizes.setdefault(tag, {})[str(k)] = n

    def _stacked_variants(self, bank_trajs, eval_pools, states, fingerprint, labels, probe_eval, per_instance,
                          put) -> dict:
        """Stacked fusions with weights fitted on cross-fitted bank signals, and the inner-CV choice."""
        from .bank import Bank, split_by_repo
        from .diagnostics import within_pool_auc
        from .rank import grouped_normalized_ranks, min_channel_rank
        from .sift import LatentSift
        from .variants import LogisticProbe, StackedFilter, fit_stack, pool_rank_features, trajectory_signals
        # cross-fitted bank signals (inner repository folds) for the stacked fusion and the choice
        inner = split_by_repo({t.traj_id: t.repo for t in bank_trajs}, n_folds=2, seed=self.s.seed)
        bank_raw: dict[str, dict[str, float]] = {}
        inner_fold_of: dict[str, int] = {}
        for j, (ib_repos, ie_repos) in enumerate(inner):
            ib = [t for t in bank_trajs if t.repo in set(ib_repos)]
            ie_pools = group_pools(t for t in bank_trajs if t.repo in set(ie_repos))
            ib_ids = sorted(t.traj_id for t in ib)
            ib_bank = Bank().fit({i: states[i] for i in ib_ids}, {i: labels[i] for i in ib_ids},
                                 {t.traj_id: t.instance_id for t in ib}, {t.traj_id: t.repo for t in ib}, fingerprint)
            dist = LatentSift(ib_bank, None, branches="distance", seed=self.s.seed)
            ie_ids = sorted(c.traj_id for p in ie_pools for c in p.candidates)
            for p in dist.prepare_many(ie_pools, states, fingerprint=fingerprint).values():
                for r, t in enumerate(p.traj_ids):
                    bank_raw[t] = {f"q_{c}": float(p.q[r, jj]) for jj, c in enumerate(p.channels)}
            ip = LogisticProbe(seed=self.s.seed).fit([states[i] for i in ib_ids], [labels[i] for i in ib_ids])
            for t, v in zip(ie_ids, ip.decision_function([states[i] for i in ie_ids])):
                bank_raw[t]["probe"] = float(v)
                inner_fold_of[t] = j
        traj_by_id = {t.traj_id: t for t in bank_trajs}
        for t, d in bank_raw.items():
            d |= trajectory_signals(traj_by_id[t])
        eval_raw: dict[str, dict[str, float]] = {}
        lat = per_instance["latentsift"]
        eval_traj = {c.traj_id: c for p in eval_pools for c in p.candidates}
        for p in eval_pools:
            prep = lat[p.instance_id][1]
            for r, t in enumerate(prep.traj_ids):
                eval_raw[t] = {f"q_{c}": float(prep.q[r, jj]) for jj, c in enumerate(prep.channels)}
                eval_raw[t] |= {"probe": float(probe_eval[t])} | trajectory_signals(eval_traj[t])
        ids_b = sorted(bank_raw)
        inst_b = np.array([traj_by_id[t].instance_id for t in ids_b])
        y_b = np.array([labels[t] for t in ids_b])
        fold_b = np.array([inner_fold_of[t] for t in ids_b])
        choice_evidence = {}
        chosen_weights = {}
        for name, sig in STACK_CONFIGS.items():
            raw_b = {s_: np.array([bank_raw[t][s_] for t in ids_b]) for s_ in sig}
            # cross-fitted within-pool AUC on the bank: weights from one inner fold, scored on the other
            pred = np.full(len(ids_b), np.nan)
            for j in range(len(inner)):
                tr, te = fold_b != j, fold_b == j
                try:
                    w = fit_stack({s_: v[tr] for s_, v in raw_b.items()}, inst_b[tr], y_b[tr])
                except LatentSiftError:
                    w = {s_: 1.0 for s_ in sig}
                pred[te] = pool_rank_features({s_: v[te] for s_, v in raw_b.items()}, inst_b[te]) @ \
                    np.array([w[s_] for s_ in sorted(raw_b)])
            choice_evidence[name] = within_pool_auc(inst_b, y_b, pred).auc
            chosen_weights[name] = fit_stack(raw_b, inst_b, y_b)
            flat = {s_: {t: eval_raw[t][s_] for t in eval_raw} for s_ in sig}
            filt = StackedFilter(flat, chosen_weights[name], seed=self.s.seed)
            put(f"variant:{name}", filt, filt.prepare_many(eval_pools))
        # the paper's distance branch, judged the same way on the bank (cross-fitted)
        q_rank = np.stack([grouped_normalized_ranks(np.array([bank_raw[t][f"q_{c}"] for t in ids_b]), inst_b)
                           for c in ("cot", "obs", "fn")])
        choice_evidence["paper-distance"] = within_pool_auc(inst_b, y_b, min_channel_rank(q_rank)).auc
        best = max(STACK_CONFIGS, key=lambda n: (np.nan_to_num(choice_evidence[n], nan=-1.0), n))
        for i, (f, p) in per_instance[f"variant:{best}"].items():
            if i in {pp.instance_id for pp in eval_pools}:
                per_instance.setdefault("default", {})[i] = (f, p)
        return {"chosen_default": best, "inner_cv_within_pool_auc": choice_evidence,
                "stack_weights": chosen_weights}


def trajs_of(bank_trajs, eval_pools):
    return list(bank_trajs) + [c for p in eval_pools for c in p.candidates]


class _DrawScorer:
    """``score_draw(instance_id, traj_ids)``: a filter's scores ranked within the draw (SPEC 6)."""

    def __init__(self, table: dict[str, tuple]):
        self.table = table

    def __call__(self, instance_id: str, traj_ids: Sequence[str]) -> dict[str, float]:
        if instance_id not in self.table:
            raise LatentSiftError(f"No Stage-1 scores were prepared for instance {instance_id!r}.")
        filt, prep = self.table[instance_id]
        return filt.rank_subset(prep, traj_ids)


# ------------------------------------------------------------------------------------- ablations
def ablation_tables(filters: Sequence[str]) -> dict[str, dict]:
    """The paper's ablation tables (full method first in each), restricted to the filters present."""
    ch = ["latentsift", "channels:cot", "channels:obs", "channels:fn", "channels:cot+obs", "channels:cot+fn",
          "channels:obs+fn"]
    tables = {
        "channels": {"title": "Channel subsets (distance branch; learned branch fused)", "filters": ch,
                     "labels": {"latentsift": "cot+obs+fn (paper)"}},
        "distance": {"title": "Distance construction", "filters": ["latentsift", "distance:pos", "distance:neg"],
                     "labels": {"latentsift": "two-sided d_neg - d_pos (paper)", "distance:pos": "-d_pos only",
                                "distance:neg": "d_neg only"}},
        "naive": {"title": "Step weighting, branches and naive rules",
                  "filters": ["latentsift", "weighting:uniform", "branch:distance", "branch:learned",
                              "shortest_tokens", "shortest_chars", "fewest_steps", "random"],
                  "labels": {"latentsift": "LatentSift (paper)", "weighting:uniform": "uniform step mean",
                             "branch:distance": "distance branch only", "branch:learned": "learned branch only"}},
    }
    variants = ["latentsift", "default"] + sorted(f for f in filters if f.startswith(("variant:", "sweep:"))) + [
        "shortest_chars", "fewest_steps", "random"]
    tables["variants"] = {"title": "Beyond the paper: variants (default chosen by cross-validation inside the "
                                   "bank folds only)", "filters": variants,
                          "labels": {"latentsift": "LatentSift (paper reference)",
                                     "default": "default (inner-CV choice per fold)"}}
    have = set(filters)
    return {k: v | {"filters": [f for f in v["filters"] if f in have]} for k, v in tables.items()}


def candidate_table(trajs: Sequence[Trajectory]) -> dict[str, np.ndarray]:
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
    from .diagnostics import paired_bootstrap
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


def reproduce(settings: ReproduceSettings, *, log: Callable[[str], None] = print,
              progress: Callable[[str, int, int, str], None] | None = None) -> Path:
    """Run the whole job; returns the report folder. Reruns reuse every cached stage."""
    from .protocol import evaluate_protocol

    check_data_dir(settings.data)  # before anything is written
    run = Run(settings, log=log, progress=progress)
    out = run.out
    out.mkdir(parents=True, exist_ok=True)
    report_dir = out / "report"
    if (report_dir / "summary.json").exists():
        (report_dir / "summary.json").unlink()  # presence of summary.json = this run finished
    atomic_write_json(out / "manifest.json", run.manifest())
    t_all = time.perf_counter()

    trajs, import_meta = run.import_pools()
    if not trajs:
        raise LatentSiftError("No trajectories were selected: check --data and the run names.")
    from .protocol import check_folds
    # before the extraction: a fold whose bank lacks a class would fail deep in Bank.fit
    check_folds(trajs, run.folds(trajs), run.group, "reproduce",
                fix="Use fewer --folds or more instances (a larger --max-instances, or none).")
    policy, store = run.extract(trajs)

    def sweep(folds) -> tuple[dict, dict, dict]:
        draw_scorers, full_scores, sweep_info = {}, {}, {}
        for name, spec in run.sweep_specs().items():
            _, sweep_store = run.extract(trajs, name=f"extract:{name}", out=out / "sweep" / name / "states", **spec)
            sweep_states = sweep_store.load([t.traj_id for t in trajs])
            ds, fs, info = run.stage1_filters(trajs, folds, sweep_states, sweep_store.fingerprint, None, sweep=name)
            draw_scorers |= ds
            full_scores |= fs
            sweep_info[name] = {"settings": spec, "fingerprint": sweep_store.fingerprint.to_dict(),
                                "default_choice": [{"fold": f["fold"], **f.get("variants", {})}
                                                   for f in info["folds"]]}
            del sweep_states
        return draw_scorers, full_scores, sweep_info

    meta = {"reproduce": settings.to_dict(), "selection": import_meta.get("selection"),
            "stage3": "absent in this data (no generated tests): Stage 3 is skipped and never charged",
            "stage2": "regression = PASS_TO_PASS passed count (ACR candidates only); rule 'skip-stage'",
            "leaky_runs": "acr-val-only and acr-val-sbfl are left out (their trajectories contain the "
                          "test outcome)" if not settings.include_leaky else "INCLUDED on request"}
    # one code path with 'latentsift crossval': folds, Stage 1, cascade, diagnostics and report
    return evaluate_protocol(run, trajs, store, tokenizer=policy.tokenizer, verifier=lambda: run.verify(policy, trajs),
                             extra_stage1=sweep if settings.sweep else None, meta=meta, t_all=t_all)
