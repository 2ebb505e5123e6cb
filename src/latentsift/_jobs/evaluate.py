"""``latentsift evaluate`` on files: the pools file and the score inputs (filters and EF verifiers) read,
every Stage-1 filter run through the cascade on the same draws (``latentsift.metrics.evaluate``) and the
report written (``latentsift.report.report``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from .._core.outputs import owned_output
from .._core.validation import LatentSiftError
from ..metrics.evaluate import EvaluateSettings, evaluate_run
from ..metrics.formats import load_pool_file, load_scores
from ..report.report import write_report

__all__ = ["run_evaluate"]


def run_evaluate(pools: str | Path, scores: Sequence[str | Path], out: str | Path, *, final_verifier: str | None = None,
                 reference: str | None = None, ks: Sequence[int] | None = None, draws: int = 200, seed: int = 0,
                 tie: str = "mean", missing: str = "skip-stage", bootstrap: int = 1000, small_pools: str = "error",
                 exact: bool = True, stop_when_single: bool = True, no_filter: bool = False,
                 headline: Sequence[str] | None = None, ablations: str | Path | None = None,
                 distributions: str | None = None, dist_instances: int | None = None, names: str | Path | None = None,
                 progress: Callable[[int, int], None] | None = None) -> dict:
    """``latentsift evaluate``: the report written to ``out``; returns the files written."""
    with owned_output(out, [pools, *scores, ablations, names], kind="report"):
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
        settings = EvaluateSettings(
            ks=ks or None, n_draws=draws, seed=seed, tie=tie, missing=missing, n_boot=bootstrap,
            small_pools=small_pools, exact=exact, stop_when_single=stop_when_single, reference=reference,
            headline=headline or None, ablations=abl, dist_instances=dist_instances,
            names=disp, meta={"pools": str(pools), "scores": [s.path for s in inputs], "final_verifier": final_verifier})
        summary = evaluate_run(pool_specs, filters, records, settings,
                               final_verifier=filters[final_verifier] if final_verifier else None,
                               distributions=dist, progress=progress)
        return write_report(summary, out)


def _read_json(path: str | Path, opt: str):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LatentSiftError(f"{opt}: no such file {str(path)!r}.") from None
    except json.JSONDecodeError as e:
        raise LatentSiftError(f"{opt}: {path} is not valid JSON ({e.msg}, line {e.lineno}).") from None
