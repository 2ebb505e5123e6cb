"""The paper's run end to end on the shared SWE-bench Lite pools (``latentsift reproduce``; the benchmarks
build on its settings, selection and run folders).

import -> select -> replay states with the embedded model -> the evaluation protocol
(``latentsift.protocol``: repository-disjoint k-fold, banks and scorer from the other folds'
repositories, Stage-1 filters; then the EF verifier on every candidate, which this module runs for
the protocol; four-stage cascade, evaluation, report).

Every stage writes into the run folder and is reused by a rerun with the same settings:

    OUT/manifest.json          settings, written first
    OUT/pools.jsonl            the imported, selected candidates (canonical JSONL)
    OUT/states/                the state store (resumable; see ``store.StateStore``)
    OUT/folds/fold-<k>/        bank/ and scorer/ of fold k (reused when their settings match)
    OUT/verifier/              EF-verifier results and its on-disk call cache
    OUT/report/                summary.json, report.md, figures (written last: presence = finished)
    OUT/stage1/                latentsift.json (per-candidate scores and evidence), retained.json
    OUT/report/index.html      the explorer (latentsift.report.explore), written after the report

Data rules (dataset README): the runs ``acr-val-only`` and ``acr-val-sbfl`` told the agent the result
of the hidden tests, so their trajectories give the label away; they are left out of every selection
experiment unless ``include_leaky=True``. Stage 3 (generated tests) does not exist in this data.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .._core.outputs import owned_output
from .._core.threads import blas_fixed
from .._core import words
from .._core.io import atomic_write_json
from .._core.validation import LatentSiftError, check_positive_int
from ..cascade.verifier import EFVerifier, LocalVerifierBackend, save_results
from ..states.extract import extract_pools
from ..states.model import gemma_model_path, load_policy
from ..states.store import StateStore
from ..trajectories.importers import import_paths
from ..trajectories.trajectory import Trajectory, load_jsonl, save_jsonl
from .crossval import CrossvalSettings
from .folds import check_folds
from .run import Run, evaluate_protocol, open_run
from .settings import ProtocolSettings, digest, hash_key
from .stage1 import stage1_filters

#: The six runs of the shared SWE-bench Lite pools the default run reads (AutoCodeRover, SWE-agent).
CLEAN_RUNS = ("acr-run-1", "acr-run-2", "acr-run-3", "cost_2_1", "cost_2_2", "cost_2_3")
#: The two AutoCodeRover runs told the hidden tests' result: left out unless ``--include-leaky``.
LEAKY_RUNS = ("acr-val-only", "acr-val-sbfl")
#: Which instances a run selects: the default rule (``ReproduceSettings``) or all of them.
INSTANCES_DEFAULT = words.DEFAULT  # the instance-selection rule, not the default filter
INSTANCES = (INSTANCES_DEFAULT, "all")
#: The dataset's folders of trajectories: R2E-Gym's JSONL files and SWE-agent's archives.
DATA_DIRS = (words.R2EGYM, words.SWEAGENT)  # the shared dataset's folders, not the importers' names
SWEEP = ("gemma", "patch", "span")  # representations with states of their own (ReproduceSettings.sweep)


@dataclass(kw_only=True)
class ReproduceSettings(ProtocolSettings):
    """Settings of one reproduce run (all recorded in the manifest).

    Budget of the default run (20 minutes from a cold cache on a 2-core AVX2 CPU in float32; measured
    20.9 under the full AVX2 emulation and about 40 on a real AVX2-only CPU, over budget,
    docs/timings.md; until 2026-11 the defaults were n_unresolved=30 and
    max_span_tokens=32, docs/studies/history-speed.md):
    ``instances="default"``: every instance with at least one resolved candidate among the selected
    runs (the only instances where retention is defined and where Best@K can differ between
    filters) plus ``n_unresolved`` instances resolved by no candidate, chosen by a hash of the
    instance id (never by any score); ``max_span_tokens`` keeps the head of every cot/obs/fn span
    and ``max_prompt_tokens`` the head of the task prompt and other excluded context;
    ``verifier_max_tokens`` is the EF verifier's prompt budget (longer logs are condensed).
    ``full=True`` means every instance, whole spans (up to the model context) and an 8k verifier budget.
    The protocol's fields (folds, K values, draws, bootstrap, scorer epochs, variants, curves, agent
    transfer, the shift guard's rate) and their defaults are ``protocol.ProtocolSettings``'.
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
    instances: str = INSTANCES_DEFAULT  # which instances: "default" (rule above) | "all"; not a count
    n_unresolved: int = 10
    max_instances: int | None = None    # cap on the selected instances (hash order), for quick runs
    max_span_tokens: int | None = 16
    max_prompt_tokens: int | None = 128
    verifier_max_tokens: int = 512
    model: str | None = None
    dtype: str = "auto"                 # "auto": bfloat16 where the hardware runs it natively, else float32
    sweep: tuple[str, ...] = ()         # names of SWEEP, or ("all",)
    sweep_span_tokens: int = 128
    sweep_patch_tokens: int = 1024
    full: bool = False

    owner = "reproduce"
    # the manifest's key order (that of the settings before the protocol's fields moved to ProtocolSettings)
    key_order = ("data", "out", "runs", "include_leaky", "instances", "n_unresolved", "max_instances",
                 "max_span_tokens", "max_prompt_tokens", "verifier_max_tokens", "model", "dtype", "n_folds", "ks",
                 "n_draws", "n_boot", "seed", "scorer_epochs", "variants", "curve_fractions", "sweep",
                 "sweep_span_tokens", "sweep_patch_tokens", "full", "group_by", "agent_transfer", "guard_false_alarm", "target_recalls",
                 "gen_test_key", "testgen_tokens")

    def __post_init__(self):
        super().__post_init__()
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
        for name in ("sweep_span_tokens", "sweep_patch_tokens"):
            check_positive_int(getattr(self, name), name, "reproduce")
        if self.max_instances is not None:
            check_positive_int(self.max_instances, "max_instances", "reproduce (--max-instances)")
        if self.instances not in INSTANCES:
            raise LatentSiftError(f"The 'instances' parameter of reproduce must be one of ['all', 'default']. "
                                  f"Got {self.instances!r} instead.")

    def inputs(self) -> tuple[Path, Path]:
        return Path(self.out) / "pools.jsonl", Path(self.out) / "states"


def check_data_dir(data: str | Path) -> Path:
    """The shared dataset folder ``data``, refused with one clear error when it is missing or incomplete."""
    d = Path(data)
    if not (d / "candidates.csv").is_file() or not all((d / sub).is_dir() for sub in DATA_DIRS):
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
                      key=lambda i: hash_key(s.seed, i))[: s.n_unresolved]
    chosen = set(solvable) | set(unsolved)
    if s.max_instances is not None:
        chosen = set(sorted(chosen, key=lambda i: hash_key(s.seed, i))[: s.max_instances])
    left |= {"instances": INSTANCES_DEFAULT, "n_solvable": len(solvable), "n_unresolved_sampled": len(unsolved),
             "n_instances_left_out": len(by) - len(chosen)}
    return [t for t in kept if t.instance_id in chosen], left


class ReproduceRun(Run):
    """A reproduce run folder: the protocol's ``Run`` plus the shared-data stages (import, states, verifier)."""

    def __init__(self, settings: ReproduceSettings, log: Callable[[str], None] = print,
                 progress: Callable[[str, int, int, str], None] | None = None):
        super().__init__(settings, log=log, progress=progress)
        self._described: set[str] = set()

    def manifest(self) -> dict:
        return {"command": "latentsift reproduce", "settings": self.settings.to_dict(), "format": 1}

    # -- 1. import
    def import_pools(self) -> tuple[list[Trajectory], dict]:
        s = self.settings
        t0 = time.perf_counter()
        data = check_data_dir(s.data)
        path = self.out / "pools.jsonl"
        meta_path = self.out / "pools.meta.json"
        key = digest({k: s.to_dict()[k] for k in ("data", "runs", "instances", "n_unresolved", "max_instances",
                                                  "seed")})
        if path.is_file() and meta_path.is_file() and json.loads(meta_path.read_text()).get("key") == key:
            meta = json.loads(meta_path.read_text())
            trajs = load_jsonl(path)
        else:
            res = import_paths([data / sub for sub in DATA_DIRS], labels=data / "candidates.csv")
            trajs, left = select_trajectories(res.trajectories, s)
            save_jsonl(trajs, path)
            meta = {"key": key, "import_summary": res.summary.to_dict(), "selection": left,
                    "n_trajectories": len(trajs)}
            atomic_write_json(meta_path, meta)
            meta = json.loads(meta_path.read_text())  # the same object (key order) as a cached rerun reads
        self.timed("import", t0)
        return trajs, meta

    # -- 2. states
    def extract(self, trajs: Sequence[Trajectory], *, name: str = "extract", model: str | None = None,
                out: Path | None = None, **render):
        """Replay the trajectories into a state store (default: the run's model into OUT/states).

        ``render`` overrides the run's ``max_span_tokens`` / ``max_prompt_tokens`` or sets
        ``patch_step_tokens`` (the sweep's representations); the store is resumable and cached.
        """
        s = self.settings
        t0 = time.perf_counter()
        policy = load_policy(model or s.model, dtype=s.dtype)
        if policy.path not in self._described:
            self._described.add(policy.path)
            self.log(f"[{name}] model: {policy.describe()}")
        out = out or self.out / "states"
        kw = {"max_span_tokens": s.max_span_tokens, "max_prompt_tokens": s.max_prompt_tokens} | render

        def progress(p) -> None:
            rate = f"{p.tokens / p.elapsed:,.0f} tok/s" if p.elapsed > 0 else ""
            self.progress(name, p.done, p.total, rate)

        rep = extract_pools(policy, trajs, out, progress=progress, **kw)
        self.log(f"[{name}] {rep.n_extracted} extracted, {rep.n_skipped} reused from the cache, "
                 f"{rep.n_tokens:,} tokens ({rep.tokens_per_s:,.0f} tok/s), {rep.n_windowed} sliding-window")
        self.timed(name, t0)
        return policy, StateStore(out).open()

    # -- 3. EF verifier on every evaluated candidate (cached by prompt hash)
    def verify(self, policy, trajs: Sequence[Trajectory]) -> dict:
        s = self.settings
        t0 = time.perf_counter()
        ef = EFVerifier(LocalVerifierBackend(policy=policy), max_prompt_tokens=s.verifier_max_tokens,
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
                 f"{s.verifier_max_tokens}-token budget in {cut} prompts")
        self.timed("verify", t0)
        return results

    # -- the sweep's representations (states of their own)
    def sweep_specs(self) -> dict[str, dict]:
        """The selected sweep representations: name -> extraction settings (``ReproduceSettings.sweep``)."""
        s = self.settings
        specs = {"gemma": lambda: ("gemma-3-270m", {"model": str(gemma_model_path())}),
                 "span": lambda: (f"span-{s.sweep_span_tokens}", {"max_span_tokens": s.sweep_span_tokens}),
                 "patch": lambda: (f"patch-{s.sweep_patch_tokens}", {"patch_step_tokens": s.sweep_patch_tokens})}
        return dict(specs[n]() for n in s.sweep)

    def sweep(self, trajs: Sequence[Trajectory], folds) -> tuple[dict, dict, dict]:
        """Stage-1 filters of every sweep representation: (draw scorers, full-pool scores, report info)."""
        draw_scorers, full_scores, sweep_info = {}, {}, {}
        for name, spec in self.sweep_specs().items():
            _, sweep_store = self.extract(trajs, name=f"extract:{name}", out=self.out / "sweep" / name / "states",
                                          **spec)
            sweep_states = sweep_store.load([t.traj_id for t in trajs])
            ds, fs, info = stage1_filters(self, trajs, folds, sweep_states, sweep_store.fingerprint, None, sweep=name)
            draw_scorers |= ds
            full_scores |= fs
            sweep_info[name] = {"settings": spec, "fingerprint": sweep_store.fingerprint.to_dict(),
                                "default_choice": [{"fold": f["fold"], **f.get("variants", {})}
                                                   for f in info["folds"]]}
            del sweep_states
        return draw_scorers, full_scores, sweep_info


def open_run_dir(run_dir: str | Path, log: Callable[[str], None] = lambda m: None):
    """(Run, trajectories, opened state store) of a ``reproduce`` or ``crossval`` run folder (``protocol.open_run``)."""
    return open_run(run_dir, {"latentsift reproduce": ReproduceSettings, "latentsift crossval": CrossvalSettings},
                    log=log)


def prepare_run(settings: ReproduceSettings, log: Callable[[str], None] = print):
    """(run, trajectories, policy, opened state store): the import and the states of a reproduce run, cached."""
    run = ReproduceRun(settings, log=log)
    run.out.mkdir(parents=True, exist_ok=True)
    trajs, _ = run.import_pools()
    policy, store = run.extract(trajs)
    return run, trajs, policy, store


@blas_fixed
def reproduce(settings: ReproduceSettings, *, log: Callable[[str], None] = print,
              progress: Callable[[str, int, int, str], None] | None = None,
              held: Callable[[], None] = lambda: None) -> Path:
    """Run the whole job; returns the report folder. Reruns reuse every cached stage. ``held()``: called once
    the output is held, before any input is read (the command's path checks)."""
    with owned_output(settings.out, [settings.data, settings.model], kind="run"):  # a second writer is refused
        held()
        check_data_dir(settings.data)  # before anything is written
        run = ReproduceRun(settings, log=log, progress=progress)
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
        # before the extraction: a fold whose bank lacks a class would fail deep in Bank.fit
        check_folds(trajs, run.folds(trajs), run.group, "reproduce",
                    fix="Use fewer --folds or more instances (a larger --max-instances, or none).")
        policy, store = run.extract(trajs)
        meta = {"reproduce": settings.to_dict(), "selection": import_meta.get("selection"),
                "stage3": "absent in this data (no generated tests): Stage 3 is skipped and never charged",
                "stage2": "regression = PASS_TO_PASS passed count (ACR candidates only); rule 'skip-stage'",
                "leaky_runs": "acr-val-only and acr-val-sbfl are left out (their trajectories contain the "
                              "test outcome)" if not settings.include_leaky else "INCLUDED on request"}
        # one code path with 'latentsift crossval': folds, Stage 1, cascade, diagnostics and report
        return evaluate_protocol(run, trajs, store, tokenizer=policy.tokenizer,
                                 verifier=lambda: run.verify(policy, trajs), extra_stage1=(lambda folds: run.sweep(trajs, folds)) if settings.sweep else None,
                                 meta=meta, t_all=t_all)
