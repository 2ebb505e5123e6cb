"""``latentsift extract`` on files: check the options before anything loads, open the extraction backend
the options name (``latentsift.scale.backends``) and replay the trajectories into a state store
(``latentsift.states.extract.extract_pools``; resumable)."""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, Callable, ClassVar

from .._core.outputs import owned_output
from .._core.params import (COUNT, DEVICE, FLAG, OUT, POSITIVE, RAY_ADDRESS, ExistingPath, Interval, Matches, OneOf,
                            Registered, Rule, CommandOptions, option)
from .._core.registry import registry_names
from .._core.validation import LatentSiftError
from ..scale.backends import backend_from_options, check_model_options
from ..states.channel import RENDER, RENDER_PER_STEP, renderer_names
from ..states.extract import DEFAULT_CHUNK, DEFAULT_PACK_TOKENS, ExtractReport, extract_pools  # noqa: F401 (the CLI's help)
from ..states.model import AUTO_DTYPE, DEVICE_MAPS, DTYPES, device_map_with_device
from ..trajectories.trajectory import load_jsonl

__all__ = ["AUTO_DTYPE", "DTYPES", "ExtractOptions", "RENDER", "extract_to_store", "extraction_backends",
           "parse_layers", "renderer_names", "run_extract"]


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


def _layers_ok(text: str) -> bool:
    try:
        return text in ("all", "final") or bool(parse_layers(text))
    except LatentSiftError:
        return False


_OPTIONAL_POSITIVE = (POSITIVE, None)


@dataclass(frozen=True, kw_only=True)
class ExtractOptions(CommandOptions):
    """The options of ``latentsift extract``, each declared once with the values it allows (``_core.params``);
    built = validated, before anything loads. ``renderer``: a registered span renderer (None: ``render``;
    ``per_step`` is shorthand for ``render_per_step`` and excludes it); ``backend``: a registered extraction
    backend (default: the local one, or Ray's with ``ray``)."""

    command: ClassVar[str] = "extract"
    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(lambda s: s.per_step and s.renderer is not None,
             lambda s: f"--per-step is --renderer {RENDER_PER_STEP}; give one of them, not both (--renderer "
                       f"{s.renderer} and --per-step)."),
        Rule(lambda s: s.device_map is not None and s.device is not None,
             lambda s: device_map_with_device(s.device_map, s.device)))

    pools: Path = option("POOLS", ExistingPath("file"))
    out: Path = option("--out", OUT)
    model: Path | None = option("--model", ExistingPath("path"), None, default=None)
    dtype: str = option("--dtype", OneOf((AUTO_DTYPE, *DTYPES)), default=AUTO_DTYPE)
    device: str | None = option("--device", DEVICE, None, default=None)
    max_tokens: int | None = option("--max-tokens", *_OPTIONAL_POSITIVE, default=None)
    instances: int | None = option("--max-instances", *_OPTIONAL_POSITIVE, default=None)
    max_span_tokens: int | None = option("--max-span-tokens", *_OPTIONAL_POSITIVE, default=None)
    max_prompt_tokens: int | None = option("--max-prompt-tokens", *_OPTIONAL_POSITIVE, default=None)
    layers: str = option("--layers", Matches("all, final or comma-separated layer indices", _layers_ok, "first"),
                         default="all")
    chunk_tokens: int | None = option("--chunk-tokens", *_OPTIONAL_POSITIVE, default=None)
    shard_size: int = option("--shard-size", POSITIVE, default=32)
    pack_tokens: int | None = option("--pack-tokens", COUNT, None, default=None)
    threads: int | None = option("--threads", *_OPTIONAL_POSITIVE, default=None)
    per_step: bool = option("--per-step", FLAG, default=False)
    renderer: str | None = option("--renderer", Registered("renderer"), None, default=None)
    backend: str | None = option("--backend", Registered("extraction_backend"), None, default=None)
    patch_step_tokens: int | None = option("--patch-step-tokens", *_OPTIONAL_POSITIVE, default=None)
    ray_address: str | None = option("--ray", RAY_ADDRESS, None, default=None)
    workers: int = option("--workers", POSITIVE, default=2)
    gpus_per_worker: float = option("--gpus-per-worker", Interval(Real, 0, None), default=0)
    device_map: str | None = option("--device-map", OneOf(DEVICE_MAPS), None, default=None)


def run_extract(pools: str | Path, out: str | Path, *, log: Callable[[str], Any] = print,
                progress: Callable[[Any], None] | None = None, **options) -> ExtractReport:
    """``latentsift extract`` from Python: ``options`` are ``ExtractOptions``' fields (checked there)."""
    return extract_to_store(ExtractOptions(pools=Path(pools), out=Path(out), **options), log=log, progress=progress)


def extract_to_store(s: ExtractOptions, *, log: Callable[[str], Any] = print,
                     progress: Callable[[Any], None] | None = None) -> ExtractReport:
    """``latentsift extract`` with the settings ``s`` (checked when built): what only the model can tell checked
    (``check_model_options``), the backend opened, the trajectories of ``s.pools`` replayed into the store
    ``s.out`` (created or resumed). ``log``: one line per step; ``progress``: called with the extraction's
    progress."""
    with owned_output(s.out, [s.pools, s.model], kind="store"):  # a second writer is refused before the model loads
        s.check_paths()
        renderer = RENDER_PER_STEP if s.per_step else s.renderer or RENDER
        layer_sel = parse_layers(s.layers)
        check_model_options(s.model, layer_sel)
        if s.device_map is not None and s.ray_address is None:
            import torch

            if not torch.cuda.is_available():   # said, not silently the same as no map
                log(f"note: --device-map {s.device_map}: torch sees no GPU on this machine, so the whole policy is "
                    "placed on the CPU (and on the disk, what does not fit in memory).")
        trajs = load_jsonl(s.pools)
        if not trajs:  # said before the model loads; no empty store is made
            raise LatentSiftError(f"{s.pools} holds no trajectory: nothing to extract (write it with "
                                  "'latentsift import').")
        log(f"{len(trajs)} trajectories from {s.pools}; loading the model ...")
        opened = backend_from_options(s.model, dtype=s.dtype, device=s.device, threads=s.threads,
                                      ray_address=s.ray_address, workers=s.workers, gpus_per_worker=s.gpus_per_worker,
                                      device_map=s.device_map, backend=s.backend)
        log(opened.describe())
        return extract_pools(opened, trajs, s.out, max_span_tokens=s.max_span_tokens,
                             max_prompt_tokens=s.max_prompt_tokens, max_tokens=s.max_tokens, instances=s.instances,
                             layers=layer_sel, chunk_tokens=s.chunk_tokens, shard_size=s.shard_size, renderer=renderer,
                             patch_step_tokens=s.patch_step_tokens, pack_tokens=s.pack_tokens, progress=progress)
