"""``latentsift extract`` on files: check the options before anything loads, open the extraction backend
the options name (``latentsift.scale.backends``) and replay the trajectories into a state store
(``latentsift.states.extract.extract_pools``; resumable)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .._core.outputs import owned_output
from .._core.registry import registry_find, registry_names
from .._core.validation import LatentSiftError
from ..scale.backends import check_backend_options, open_backend
from ..states.channel import RENDER, RENDER_PER_STEP, renderer_names
from ..states.extract import ExtractReport, extract_pools
from ..states.model import AUTO_DTYPE, DTYPES
from ..trajectories.trajectory import load_jsonl

__all__ = ["AUTO_DTYPE", "DTYPES", "RENDER", "extraction_backends", "parse_layers", "renderer_names", "run_extract"]


def parse_layers(value: str):
    """``--layers``: "all", "final" or comma-separated layer indices."""
    if value in ("all", "final"):
        return value
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise LatentSiftError(f"--layers must be 'all', 'final' or comma-separated layer indices. "
                              f"Got {value!r} instead.") from None


def extraction_backends() -> tuple[str, ...]:
    """Every registered extraction backend (``latentsift extract --backend``)."""
    return registry_names("extraction_backend")


def _check_names(backend: str | None, renderer: str, per_step: bool) -> str:
    """``--backend`` and ``--renderer`` among the registered names (before anything loads); the renderer
    ``--per-step`` (shorthand for ``--renderer render_per_step``) and ``--renderer`` name together."""
    if backend is not None and registry_find("extraction_backend", backend) is None:
        raise LatentSiftError(f"--backend must be a registered extraction backend: {', '.join(extraction_backends())}. "
                              f"Got {backend!r} instead.")
    if registry_find("renderer", renderer) is None:
        raise LatentSiftError(f"--renderer must be a registered renderer: {', '.join(renderer_names())}. "
                              f"Got {renderer!r} instead.")
    if per_step and renderer not in (RENDER, RENDER_PER_STEP):
        raise LatentSiftError(f"--per-step is --renderer {RENDER_PER_STEP}; it cannot go with --renderer {renderer}.")
    return RENDER_PER_STEP if per_step else renderer


def _check_positive(**options) -> None:
    """Option values checked before anything loads (the model load takes a while), named as options."""
    for name, value in options.items():
        if value is not None and value < 1:
            raise LatentSiftError(f"--{name.replace('_', '-')} must be a positive number. Got {value} instead.")


def run_extract(pools: str | Path, out: str | Path, *, model=None, dtype: str = AUTO_DTYPE, device: str | None = None,
                max_tokens: int | None = None, instances: int | None = None, max_span_tokens: int | None = None,
                max_prompt_tokens: int | None = None, layers: str = "all", chunk_tokens: int = 2048,
                shard_size: int = 32, threads: int | None = None, per_step: bool = False,
                renderer: str = RENDER, patch_step_tokens: int | None = None, pack_tokens: int | None = None,
                ray: str | None = None, workers: int = 2, gpus_per_worker: float = 0, device_map: str | None = None,
                backend: str | None = None, log: Callable[[str], Any] = print,
                progress: Callable[[Any], None] | None = None) -> ExtractReport:
    """``latentsift extract``: every option checked, the backend opened, the trajectories of ``pools``
    replayed into the store ``out`` (created or resumed). ``backend``: a registered extraction backend
    (default: the local one, or Ray's with ``ray``); ``renderer``: a registered span renderer. ``log``: one
    line per step; ``progress``: called with the extraction's progress."""
    with owned_output(out, [pools, model], kind="store"):  # a second writer is refused before the model loads
        _check_positive(max_tokens=max_tokens, instances=instances, max_span_tokens=max_span_tokens,
                        max_prompt_tokens=max_prompt_tokens, chunk_tokens=chunk_tokens, shard_size=shard_size,
                        threads=threads, patch_step_tokens=patch_step_tokens, workers=workers)
        if pack_tokens is not None and pack_tokens < 0:
            raise LatentSiftError(f"--pack-tokens must be 0 (one trajectory per forward) or a positive number. "
                                  f"Got {pack_tokens} instead.")
        renderer = _check_names(backend, renderer, per_step)
        layer_sel = parse_layers(layers)
        check_backend_options(model, dtype, device, layer_sel, device_map=device_map)
        trajs = load_jsonl(pools)
        if not trajs:  # said before the model loads; no empty store is made
            raise LatentSiftError(f"{pools} holds no trajectory: nothing to extract (write it with "
                                  "'latentsift import').")
        log(f"{len(trajs)} trajectories from {pools}; loading the model ...")
        opened = open_backend(model, dtype=dtype, device=device, threads=threads, ray=ray, workers=workers,
                               gpus_per_worker=gpus_per_worker, device_map=device_map, backend=backend)
        log(opened.describe())
        return extract_pools(opened, trajs, out, max_span_tokens=max_span_tokens, max_prompt_tokens=max_prompt_tokens,
                             max_tokens=max_tokens, instances=instances, layers=layer_sel, chunk_tokens=chunk_tokens,
                             shard_size=shard_size, renderer=renderer,
                             patch_step_tokens=patch_step_tokens, pack_tokens=pack_tokens, progress=progress)
