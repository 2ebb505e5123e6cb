"""``latentsift evaluate`` (cascade + metrics + report) and ``latentsift verify`` (EF verifier).

Parsing and progress only; the logic is in ``latentsift.metrics.evaluate``, ``latentsift.report.report`` and
``latentsift.cascade.verifier``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .._core.guard import check_output
from .._core.validation import LatentSiftError
from ..metrics.evaluate import EvaluateSettings, evaluate_run
from ..metrics.formats import load_pool_file, load_scores
from ..report.report import write_report
from .._jobs.verify import run_verify, verifier_backends
from ._options import Draws, Dtype, Model, Seed, Threads
from ._progress import StageProgress


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_cmd)
    app.command("verify")(verify_cmd)


def evaluate_cmd(
    pools: Path = typer.Option(..., "--pools", help="POOLS.jsonl: one pool per line (docs/evaluation.md)."),
    scores: List[Path] = typer.Option(..., "--scores", help="A score folder or file; repeat. Filters "
                                      "(scores.jsonl) and EF-verifier results (verdicts.jsonl)."),
    out: Path = typer.Option(..., "--out", help="Report folder (summary.json, report.md, PNG figures)."),
    final_verifier: Optional[str] = typer.Option(None, "--final-verifier", help="EF input used in Stage 4 by "
                                                 "non-EF filters (default: the only EF input)."),
    reference: Optional[str] = typer.Option(None, "--reference", help="Workflow that savings are measured "
                                            "against (default: the first EF input)."),
    k: Optional[List[int]] = typer.Option(None, "--k", help="K values (repeat; default 2..smallest pool)."),
    draws: Draws = 200,
    seed: Seed = 0,
    tie: str = typer.Option("mean", "--tie", help="Ties after Stage 4: mean (expected label) or random."),
    missing: str = typer.Option("skip-stage", "--missing", help="Missing Stage-2/3 values: skip-stage or keep."),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples over instances."),
    small_pools: str = typer.Option("error", "--small-pools", help="Pools smaller than K: error or drop."),
    exact: bool = typer.Option(True, "--exact/--no-exact", help="Enumerate all subsets when C(n,K) <= draws."),
    stop_when_single: bool = typer.Option(True, "--stop-when-single/--no-stop-when-single",
                                          help="Later stages are not reached once one candidate is left."),
    no_filter: bool = typer.Option(False, "--no-filter", help="Also evaluate Stage 1 without a filter ('none')."),
    headline: Optional[List[str]] = typer.Option(None, "--headline", help="Filters in the main table and figures."),
    ablations: Optional[Path] = typer.Option(None, "--ablations", help="JSON: table -> {title, filters, layout, labels}."),
    distributions: Optional[str] = typer.Option(None, "--distributions", help="Score input whose components "
                                                "and score are plotted (default: the first with components)."),
    dist_instances: Optional[int] = typer.Option(None, "--dist-instances", help="Instances sampled for the "
                                                 "distribution figure (default: all)."),
    names: Optional[Path] = typer.Option(None, "--names", help="JSON: filter -> display name."),
) -> None:
    """Run the four-stage cascade for every Stage-1 filter and write the evaluation report."""
    check_output(out, [pools, *scores, ablations, names], kind="report")
    pool_specs, records = load_pool_file(pools)
    inputs = [load_scores(p, known_ids=records.keys()) for p in scores]
    seen: dict[str, str] = {}
    for s in inputs:
        if s.name in seen:
            raise LatentSiftError(f"Two score inputs are named {s.name!r} ({seen[s.name]} and {s.path}); "
                                  "set a distinct 'name' in their manifest.json.")
        seen[s.name] = s.path
    filters: dict = {s.name: s.scores for s in inputs}
    if no_filter:
        if "none" in filters:
            raise LatentSiftError("A score input is already named 'none'; rename it to use --no-filter.")
        filters["none"] = None
    efs = [s.name for s in inputs if s.kind == "ef"]
    if final_verifier is None:
        if len(efs) > 1:
            raise LatentSiftError(f"Several EF inputs {efs}: choose the Stage-4 verifier with --final-verifier.")
        final_verifier = efs[0] if efs else None
    elif final_verifier not in efs:
        raise LatentSiftError(f"--final-verifier {final_verifier!r} is not an EF-verifier input (EF inputs: {efs}).")
    abl = _read_json(ablations, "--ablations") if ablations else None
    disp = _read_json(names, "--names") if names else None
    dist = None
    cands = [s for s in inputs if s.kind == "filter" and s.components]
    if distributions is not None:
        match = [s for s in inputs if s.name == distributions and s.kind == "filter"]
        if not match:
            raise LatentSiftError(f"--distributions {distributions!r} is not a filter input.")
        cands = match
    if cands:
        dist = {**cands[0].components, f"final score ({cands[0].name})": cands[0].scores}
    with StageProgress(transient=True) as bar:
        settings = EvaluateSettings(
            ks=k or None, n_draws=draws, seed=seed, tie=tie, missing=missing, n_boot=bootstrap,
            small_pools=small_pools, exact=exact, stop_when_single=stop_when_single, reference=reference,
            headline=headline or None, ablations=abl, dist_instances=dist_instances,
            names=disp, meta={"pools": str(pools), "scores": [s.path for s in inputs],
                              "final_verifier": final_verifier})
        summary = evaluate_run(pool_specs, filters, records, settings,
                               final_verifier=filters[final_verifier] if final_verifier else None,
                               distributions=dist, progress=lambda done, total: bar.update("cascade", done, total))
    written = write_report(summary, out)
    typer.echo(f"wrote {len(written)} files to {out}: " + ", ".join(sorted(written)))


def _read_json(path: Path, opt: str):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LatentSiftError(f"{opt}: no such file {str(path)!r}.") from None
    except json.JSONDecodeError as e:
        raise LatentSiftError(f"{opt}: {path} is not valid JSON ({e.msg}, line {e.lineno}).") from None


def verify_cmd(
    trajectories: Path = typer.Option(..., "--trajectories", help="Canonical trajectories (.jsonl or .jsonl.gz)."),
    out: Path = typer.Option(..., "--out", help="Output folder (manifest.json + verdicts.jsonl)."),
    name: str = typer.Option("ef", "--name", help="Name of this verifier in the evaluation."),
    backend: str = typer.Option("local", "--backend", help="local (a local model), openai (an "
                                "OpenAI-compatible endpoint) or another registered verifier backend: "
                                + ", ".join(verifier_backends()) + "."),
    model: Model = None,
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Endpoint root, e.g. http://127.0.0.1:8000/v1."),
    api_model: Optional[str] = typer.Option(None, "--api-model", help="Model name sent to the endpoint."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Environment variable holding the API key."),
    max_prompt_tokens: int = typer.Option(1024, "--max-prompt-tokens", help="Prompt budget; longer logs are condensed."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Disk cache folder (default: OUT/cache)."),
    ids: Optional[Path] = typer.Option(None, "--ids", help="Text file: only these traj_ids (one per line)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per remote call."),
    retries: int = typer.Option(3, "--retries", help="Retries per remote call."),
    concurrency: int = typer.Option(4, "--concurrency", help="Parallel remote calls."),
    dtype: Dtype = "auto",
    threads: Threads = None,
) -> None:
    """Score trajectories with the execution-free verifier (P(YES) from the first answer token).

    --model, --dtype and --threads apply to the local backend.
    """
    with StageProgress(transient=True) as bar:
        results = run_verify(trajectories, out, name=name, backend=backend, ids=ids, cache=cache,
                             max_prompt_tokens=max_prompt_tokens,
                             progress=lambda done, total: bar.update("verify", done, total),
                             log=lambda m: typer.echo(m, err=True), model=model, dtype=dtype, threads=threads,
                             base_url=base_url, api_model=api_model, api_key_env=api_key_env, timeout=timeout,
                             retries=retries, concurrency=concurrency)
    n_fail = sum(1 for r in results.values() if r.score is None)
    typer.echo(f"scored {len(results) - n_fail} of {len(results)} candidates ({n_fail} failures) -> {out}")
