"""``latentsift evaluate`` on files: the pools file and the score inputs (filters and EF verifiers) read,
every Stage-1 filter run through the cascade on the same draws (``latentsift.metrics.evaluate``) and the
report written (``latentsift.report.report``)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Sequence

from .._core.outputs import owned_output
from .._core.params import (BOOTSTRAP, FLAG, OUT, POSITIVE, SEED, CommandOptions, Each, ExistingPath, Kind,
                            OneOf, option)
from .._core.validation import LatentSiftError
from ..cascade.cascade import MISSING_RULES, TIE_RULES
from ..metrics.evaluate import SMALL_POOL_RULES, EvaluateSettings, evaluate_run
from ..metrics.formats import load_pool_file, load_scores
from ..report.report import write_report

__all__ = ["EvaluateOptions", "run_evaluate"]


@dataclass(frozen=True, kw_only=True)
class EvaluateOptions(CommandOptions):
    """The options of ``latentsift evaluate``, each declared once with the values it allows (``_core.params``);
    built = validated, before any file is read. ``k``: the pool sizes K (None: 2 to the smallest pool)."""

    command: ClassVar[str] = "evaluate"

    pools: Path = option("POOLS", ExistingPath("file"))
    scores: Sequence[Path] = option("--scores", Each(Kind(Path, "a score folder or file")))  # named when read
    out: Path = option("--out", OUT)
    final_verifier: str | None = option("--final-verifier", Kind(str, "the name of an EF-verifier input"), None,
                                        default=None)
    reference: str | None = option("--reference", Kind(str, "the name of an EF-verifier input"), None, default=None)
    k: Sequence[int] | None = option("--k", Each(POSITIVE), None, default=None)
    draws: int = option("--draws", POSITIVE, default=200)
    seed: int = option("--seed", SEED, default=0)
    tie: str = option("--tie", OneOf(TIE_RULES), default="mean")
    missing: str = option("--missing", OneOf(MISSING_RULES), default="skip-stage")
    bootstrap: int = option("--bootstrap", BOOTSTRAP, default=1000)
    small_pools: str = option("--small-pools", OneOf(SMALL_POOL_RULES), default="error")
    exact: bool = option("--exact", FLAG, default=True)
    stop_when_single: bool = option("--stop-when-single", FLAG, default=True)
    no_filter: bool = option("--no-filter", FLAG, default=False)
    headline: Sequence[str] | None = option("--headline", Each(Kind(str, "a filter's name")), None, default=None)
    ablations: Path | None = option("--ablations", ExistingPath("file"), None, default=None)
    distributions: str | None = option("--distributions", Kind(str, "the name of a filter input"), None, default=None)
    dist_instances: int | None = option("--dist-instances", POSITIVE, None, default=None)
    names: Path | None = option("--names", ExistingPath("file"), None, default=None)


def run_evaluate(o: EvaluateOptions, *, progress: Callable[[int, int], None] | None = None) -> dict:
    """``latentsift evaluate`` with the options ``o`` (checked when built): the report written to ``o.out``;
    returns the files written."""
    pools, scores, out, final_verifier = o.pools, o.scores, o.out, o.final_verifier
    with owned_output(out, [pools, *scores, o.ablations, o.names], kind="report"):
        o.check_paths()
        pool_specs, records = load_pool_file(pools)
        inputs = [load_scores(p, known_ids=records.keys()) for p in scores]
        seen: dict[str, str] = {}
        for s in inputs:
            if s.name in seen:
                raise LatentSiftError(f"Two score inputs are named {s.name!r} ({seen[s.name]} and {s.path}); "
                                      "set a distinct 'name' in their manifest.json.")
            seen[s.name] = s.path
        filters: dict = {s.name: s.scores for s in inputs}
        if o.no_filter:
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
        abl = _read_json(o.ablations, "--ablations") if o.ablations else None
        disp = _read_json(o.names, "--names") if o.names else None
        dist = None
        cands = [s for s in inputs if s.kind == "filter" and s.components]
        if o.distributions is not None:
            match = [s for s in inputs if s.name == o.distributions and s.kind == "filter"]
            if not match:
                raise LatentSiftError(f"--distributions {o.distributions!r} is not a filter input.")
            cands = match
        if cands:
            dist = {**cands[0].components, f"final score ({cands[0].name})": cands[0].scores}
        settings = EvaluateSettings(
            ks=o.k or None, n_draws=o.draws, seed=o.seed, tie=o.tie, missing=o.missing, n_boot=o.bootstrap,
            small_pools=o.small_pools, exact=o.exact, stop_when_single=o.stop_when_single, reference=o.reference,
            headline=o.headline or None, ablations=abl, dist_instances=o.dist_instances,
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
