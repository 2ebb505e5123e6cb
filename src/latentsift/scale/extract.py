"""The Ray extraction backend: Ray actors replay trajectories, the driver commits their shards.

``RayBackend`` is an ``ExtractionBackend`` for the one driver, ``latentsift.states.extract.extract_pools``.
Each worker is a Ray actor that loads the policy once. The driver (the only writer of the store's
index, holding its lock) renders nothing itself: the backend asks the workers to count tokens, sorts
the trajectories still missing from the store longest first, cuts them into shard-sized batches and
hands the next batch to whichever worker finishes first (``ray.wait``), so the load is balanced by
token count. A worker writes its shard to ``shards/<tmp name>.tmp`` in the store (a filesystem shared
by all nodes) and returns its checksum and index rows; the driver checks the file, renames it to the
next shard name and rewrites the index atomically (``StateStore.commit``). The store is therefore
the same format as a single-process one (docs/states.md), and each trajectory's states are the same
bit for bit (same model, dtype and device kind).

Failures: a worker that dies loses its in-flight batch, which goes back to the queue for the
surviving workers; when none survives the run stops with a LatentSiftError and a rerun resumes
(committed trajectories are skipped; orphan temporary files are removed when the store is opened).
Ray is imported only when the backend starts (``connect``): the library works without it.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

from .._core.io import atomic_write_bytes
from .._core.registry import registry_add
from .._core.validation import LatentSiftError, check_positive_int
from ..states.channel import render
from ..states.extract import ExtractionBackend, Extracted, extract_many, extract_settings, render_settings
from ..states.model import Fingerprint, load_policy
from ..states.store import SHARDS, encode_shard
from .cluster import RAY_LOCAL, connect, require_ray, worker_cpus

ACTOR_PREFIX = "latentsift-extract-"
OWNER = "RayBackend"


class ExtractWorker:
    """Ray actor body: one policy per worker process, loaded once."""

    def __init__(self, model: str | None, dtype: str, device: str | None, threads: int | None,
                 settings_kw: dict[str, Any], device_map: str | None = None):
        self.error = None
        try:
            import torch

            if threads:
                torch.set_num_threads(threads)
            self.policy = load_policy(model, dtype=dtype, device=device, device_map=device_map)
            self.settings = extract_settings(self.policy, **settings_kw)
        except Exception as e:  # reported by info(): the driver ends with a clear error
            self.error = f"{type(e).__name__}: {e}"

    def info(self) -> dict:
        if self.error:
            return {"error": self.error, "host": os.uname().nodename}
        return {"fingerprint": self.policy.fingerprint.to_dict(), "settings": self.settings,
                "host": os.uname().nodename, "pid": os.getpid()}

    def pid(self) -> int:
        return os.getpid()

    def count_tokens(self, trajs: list) -> list[int]:
        rkw = render_settings(self.settings)
        return [render(t, self.policy.tokenizer, **rkw).n_tokens for t in trajs]

    def run(self, store_path: str, tmp_name: str, trajs: list) -> dict:
        """Replay ``trajs``, write their shard to ``shards/tmp_name``; returns what the driver commits."""
        t0 = time.perf_counter()
        states, truncated, windowed = [], 0, 0
        for st, tr, wi in extract_many(self.policy, trajs, self.settings):
            states.append(st)
            truncated += int(tr)
            windowed += int(wi)
        shard = encode_shard(states, [t.instance_id for t in trajs],
                             Fingerprint.from_dict(self.policy.fingerprint.to_dict()), self.settings,
                             where=store_path)
        atomic_write_bytes(Path(store_path) / SHARDS / tmp_name, shard.data)
        return {"shard": shard.without_data(), "tmp_name": tmp_name, "truncated": truncated,
                "windowed": windowed, "tokens": sum(int(s.n_tokens) for s in states),
                "seconds": time.perf_counter() - t0}


class RayBackend(ExtractionBackend):
    """``workers`` Ray actors, each loading ``model`` once (same store, same states; see the module doc).

    ``model`` is a path every node can read (or None: the embedded model). ``ray_address``: local,
    auto or HOST:PORT (``scale.cluster.connect``). ``threads``: torch threads per worker, which replays
    that many trajectories at once, each at one thread (``states.extract.extract_many``).
    ``gpus_per_worker`` / ``cpus_per_worker`` are the actors' Ray resources (CPU default: a fraction
    of the cluster so actors never claim every CPU). ``device_map`` (e.g. "auto"): each worker splits its
    policy over the GPUs Ray gave it (``gpus_per_worker`` of them: one replica per group of GPUs).
    """

    name = "ray"

    def __init__(self, model: str | os.PathLike | None = None, *, ray_address: str | None = RAY_LOCAL,
                 workers: int = 2, gpus_per_worker: float = 0, cpus_per_worker: float | None = None,
                 dtype: str = "auto", device: str | None = None, threads: int | None = 1,
                 device_map: str | None = None):
        self.model = None if model is None else str(Path(model).resolve())
        self.ray_address, self.workers = ray_address, check_positive_int(workers, "workers", OWNER)
        self.gpus_per_worker, self.cpus_per_worker = gpus_per_worker, cpus_per_worker
        self.dtype, self.device, self.threads, self.device_map = dtype, device, threads, device_map
        self.ray, self.pool = None, []

    @classmethod
    def from_options(cls, *, model=None, dtype: str = "auto", device: str | None = None, threads: int | None = None,
                     ray_address: str | None = RAY_LOCAL, workers: int = 2, gpus_per_worker: float = 0,
                     device_map: str | None = None, **_: Any) -> "RayBackend":
        """``workers`` actors at ``ray_address`` (``threads`` each, default 1)."""
        require_ray()
        return cls(model, ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker, dtype=dtype,
                   device=device, threads=threads or 1, device_map=device_map)

    def describe(self) -> str:
        return f"{self.workers} Ray workers at {self.ray_address or RAY_LOCAL}"

    def start(self, settings_kw: Mapping[str, Any]) -> tuple[Fingerprint, dict[str, Any]]:
        from ray.exceptions import RayActorError

        ray = self.ray = connect(self.ray_address)
        Actor = ray.remote(ExtractWorker)
        cpus = worker_cpus(ray, self.workers, self.cpus_per_worker)
        tag = uuid.uuid4().hex[:8]
        self.pool = [Actor.options(num_cpus=cpus, num_gpus=self.gpus_per_worker, max_restarts=0,
                                   name=f"{ACTOR_PREFIX}{tag}-{i}").remote(self.model, self.dtype, self.device,
                                                                           self.threads, dict(settings_kw),
                                                                           self.device_map)
                     for i in range(self.workers)]
        try:
            infos = ray.get([a.info.remote() for a in self.pool])
        except RayActorError as e:  # the actor class itself failed to start (e.g. latentsift missing there)
            cause = str(e).strip().splitlines()[-1]
            raise LatentSiftError(f"A Ray worker could not start: {cause}. Install latentsift (with the same "
                                  "version) on every node. The store was not changed.") from None
        bad = next((i for i in infos if "error" in i), None)
        if bad:
            raise LatentSiftError(f"A Ray worker on {bad['host']} could not load the model: {bad['error']}. "
                                  "The store was not changed.")
        fps = {Fingerprint.from_dict(i["fingerprint"]).digest for i in infos}
        if len(fps) != 1:
            raise LatentSiftError("The Ray workers loaded different models (fingerprints differ); give them the "
                                  "same model path and dtype.")
        kernels = {repr(sorted((i["settings"].get("kernels") or {}).items())) for i in infos}
        if len(kernels) != 1:  # their shards would not be the bytes one setup computes (states.hardware)
            raise LatentSiftError("The Ray workers run different kernels (torch version, CPU kind or ISA settings "
                                  "differ between nodes); give them the same setup. The store was not changed.")
        return Fingerprint.from_dict(infos[0]["fingerprint"]), infos[0]["settings"]

    def run(self, store_path: Path, todo: list, shard_size: int) -> Iterator[Extracted]:
        from ray.exceptions import RayActorError

        ray, pool = self.ray, self.pool
        # token counts on all workers, then longest first: the greedy hand-out below balances the load
        parts = [todo[i::len(pool)] for i in range(len(pool))]
        counts = ray.get([a.count_tokens.remote(p) for a, p in zip(pool, parts) if p])
        n_tok = {t.traj_id: n for p, c in zip(parts, counts) for t, n in zip(p, c)}
        order = sorted(todo, key=lambda t: -n_tok[t.traj_id])
        queue = [order[a:a + shard_size] for a in range(0, len(order), shard_size)]
        queue.reverse()  # pop() takes the longest batch first
        inflight: dict[Any, tuple[Any, list, str]] = {}
        idle, dead, committed = list(pool), [], 0

        def hand_out():
            while idle and queue:
                a, batch = idle.pop(0), queue.pop()
                tmp = f"part-{uuid.uuid4().hex}.safetensors.tmp"
                inflight[a.run.remote(str(store_path), tmp, batch)] = (a, batch, tmp)

        hand_out()
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            ref = ready[0]
            actor, batch, tmp = inflight.pop(ref)
            try:
                res = ray.get(ref)
            except RayActorError:
                dead.append(actor)
                queue.append(batch)  # lost in flight: back to the queue for the survivors
                (Path(store_path) / SHARDS / tmp).unlink(missing_ok=True)
                if len(dead) == len(pool):
                    raise LatentSiftError(f"All {len(pool)} Ray workers died; {committed} trajectories were "
                                          "committed. Re-run the same command to resume.") from None
                hand_out()
                continue
            yield Extracted([t.traj_id for t in batch], res["tokens"], res["truncated"], res["windowed"],
                            shard=res["shard"], tmp_name=res["tmp_name"])  # committed by the driver
            committed += len(batch)
            idle.append(actor)
            hand_out()

    def close(self) -> None:
        for a in self.pool:
            self.ray.kill(a)
        self.pool = []


registry_add("extraction_backend", RayBackend.name, RayBackend)
