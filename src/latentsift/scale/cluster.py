"""Connecting to a Ray cluster: ``--ray local | auto | HOST:PORT``.

``local`` starts a private single-node cluster on the loopback interface (no dashboard);
``auto`` joins the cluster that ``ray start`` set up on this machine; ``HOST:PORT`` joins the head at
that address (its GCS port, 6379 by default). An address that does not answer ends with a
``LatentSiftError`` after a short TCP probe, instead of Ray's long retry loop.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from .._core.validation import LatentSiftError
from .._core import words

INSTALL_HINT = 'pip install -e ".[ray]"'
PROBE_TIMEOUT_S = 5.0


def require_ray():
    """The ``ray`` module, or a LatentSiftError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise LatentSiftError(f"--ray needs the optional Ray extra: {INSTALL_HINT}") from None
    return ray


def _probe(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LatentSiftError(f"The 'ray' address must be 'local', 'auto' or HOST:PORT. Got {address!r} instead.")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        raise LatentSiftError(f"No Ray head answers at {address} ({e.strerror or e}); start one with "
                              f"'ray start --head --port={port}' or pass --ray local.") from None


#: Ray's addresses of a cluster this process starts on this machine, and of one already running here.
RAY_LOCAL = words.LOCAL  # a Ray address, not the local extraction or verifier backend
RAY_AUTO = "auto"


def connect(address: str | None = RAY_LOCAL, *, num_cpus: float | None = None):
    """Initialise Ray once per process (reused when already initialised); returns ``ray``.

    ``num_cpus`` only applies to ``local`` (default: this machine's CPU count).
    """
    ray = require_ray()
    address = address or RAY_LOCAL
    if address not in (RAY_LOCAL, RAY_AUTO):
        _probe(address)  # also when already connected: a wrong address is an error, not ignored
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address == RAY_LOCAL:
        # workers of a local cluster import this very latentsift (a source checkout included)
        pkg_root = str(Path(__file__).resolve().parents[2])
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([pkg_root, *paths])
        ray.init(address=RAY_LOCAL, num_cpus=num_cpus or os.cpu_count() or 1, _node_ip_address="127.0.0.1", **kw)
    elif address == RAY_AUTO:
        try:
            ray.init(address=RAY_AUTO, **kw)
        except ConnectionError as e:
            raise LatentSiftError(f"--ray auto found no running Ray cluster on this machine ({e}); start one "
                                  "with 'ray start --head' or pass --ray local.") from None
    else:
        try:
            ray.init(address=address, **kw)
        except (ConnectionError, RuntimeError) as e:
            raise LatentSiftError(f"Could not join the Ray cluster at {address}: {e}") from None
    return ray


def worker_cpus(ray, n_workers: int, requested: float | None) -> float:
    """CPUs each actor claims: ``requested``, or a fair fraction of the cluster's CPUs (at most 1) so
    that actors never claim every CPU and leave tasks waiting forever."""
    if requested is not None:
        return float(requested)
    total = float(ray.cluster_resources().get("CPU", 1.0))
    return max(0.01, min(1.0, total / max(1, n_workers) * 0.9))
