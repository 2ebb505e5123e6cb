"""Choosing the extraction backend from command-line options: this process, or Ray workers.

The driver (``latentsift.states.extract.extract_pools``) takes any ``ExtractionBackend``; this module
maps ``--model``, ``--dtype``, ``--device``, ``--threads``, ``--ray``, ``--workers`` and
``--gpus-per-worker`` onto one, after checking them (before anything loads). It sits above both
``latentsift.states.extract`` (the driver and ``LocalExtractionBackend``) and ``latentsift.scale.extract``
(``RayBackend``, which imports Ray only when it starts).
"""
from __future__ import annotations

import os
from typing import Sequence

from .._core.registry import registry_lookup
from ..states.extract import ExtractionBackend, LocalExtractionBackend, resolve_layers
from ..states.model import AUTO_DTYPE, check_device, check_device_map, check_dtype, n_layers_of
from ..states.model_files import check_model_path
from .extract import RayBackend


def check_backend_options(model: str | os.PathLike | None, dtype: str, device: str | None,
                          layers: str | Sequence[int] = "all", device_map: str | None = None) -> None:
    """The model options, checked before anything loads (the model load takes a while): their values, then
    what only the model can tell (``check_model_options``)."""
    check_dtype(dtype)
    check_device(device, here=False)   # Ray workers may hold the GPUs; the policy's load checks its own
    check_device_map(device_map, device)
    check_model_options(model, layers)


def check_model_options(model: str | os.PathLike | None, layers: str | Sequence[int] = "all") -> None:
    """What only the model can tell, before it loads: ``model`` holds a model (``check_model_path``) and a list
    of ``layers`` is within its layer count, read from its config. (``latentsift extract`` checks the values of
    its options as ``ExtractOptions``, then this.)"""
    if model is not None:
        check_model_path(model)
    if not isinstance(layers, str):
        resolve_layers(layers, n_layers_of(model))


def open_backend(model: str | os.PathLike | None = None, *, dtype: str = AUTO_DTYPE, device: str | None = None,
                 threads: int | None = None, ray_address: str | None = None, workers: int = 2,
                 gpus_per_worker: float = 0, backend: str | None = None,
                 device_map: str | None = None) -> ExtractionBackend:
    """The backend the command-line options name: :class:`LocalExtractionBackend` with the policy loaded here
    (``threads``: torch threads of this process), or, when ``ray_address`` gives an address (local, auto or
    HOST:PORT), the Ray backend with ``workers`` actors (``threads`` each, default 1); ``backend``: another
    registered extraction backend by name (``latentsift._core.registry``, kind "extraction_backend").
    ``device_map`` (``--device-map``): each policy (here, or each Ray worker's over its GPUs) split by
    accelerate. The options are checked first (``check_backend_options``)."""
    check_backend_options(model, dtype, device, device_map=device_map)
    return backend_from_options(model, dtype=dtype, device=device, threads=threads, ray_address=ray_address,
                                workers=workers, gpus_per_worker=gpus_per_worker, backend=backend, device_map=device_map)


def backend_from_options(model: str | os.PathLike | None, *, dtype: str, device: str | None, threads: int | None,
                         ray_address: str | None, workers: int, gpus_per_worker: float, backend: str | None,
                         device_map: str | None) -> ExtractionBackend:
    """``open_backend`` with options already checked (``latentsift extract``: ``ExtractOptions`` and
    ``check_model_options``)."""
    name = backend or (RayBackend if ray_address is not None else LocalExtractionBackend).name
    return registry_lookup("extraction_backend", name).from_options(
        model=model, dtype=dtype, device=device, threads=threads, ray_address=ray_address, workers=workers,
        gpus_per_worker=gpus_per_worker, device_map=device_map)
