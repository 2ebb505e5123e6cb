"""Distributed state extraction: Ray actors replay trajectories, the driver commits their shards.

Each worker is a Ray actor that loads the policy once. The driver (the only writer of the store's
index, holding its lock) renders nothing itself: it asks the workers to count tokens, sorts the
trajectories still missing from the store longest first, cuts them into shard-sized batches and
hands the next batch to whichever worker finishes first (``ray.wait``), so the load is balanced by
token count. A worker writes its shard to ``shards/<tmp name>.tmp`` in the store (a filesystem shared
by all nodes) and returns its checksum and index rows; the driver checks the file, renames it to the
next shard name and rewrites the index atomically (``StateStore.commit``). The store is therefore
the same format as a single-process one (docs/states.md), and each trajectory's states are the same
bit for bit (same model, dtype and device kind).

Failures: a worker that dies loses its in-flight batch, which goes back to the queue for the
surviving workers; when none survives the run stops with a LatentSiftError and a rerun resumes
(committed trajectories are skipped; orphan temporary files are removed when the store is opened).
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .._validation import LatentSiftError, check_positive_int
from ..store import DEFAULT_SHARD_SIZE, SHARDS, ExtractProgress, ExtractReport, StateStore, select_unique
from ..states import DEFAULT_CHUNK_TOKENS
from .cluster import connect, worker_cpus

ACTOR_PREFIX = "latentsift-extract-"


class ExtractWorker:
    """Ray actor body: one policy per worker process, loaded once."""

    def __init__(self, model: str | None, dtype: str, device: str | None, threads: int | None,
                 settings_kw: dict[str, Any]):
        self.error = None
        try:
            import torch

            if threads:
                torch.set_num_threads(threads)
            from ..model import load_policy
            from ..store import extract_settings

            self.policy = load_policy(model, dtype=dtype, device=device)
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
        from ..channel import render

        s = self.settings
        return [render(t, self.policy.tokenizer, max_span_tokens=s["max_span_tokens"],
                       max_prompt_tokens=s["max_prompt_tokens"],
                       patch_step_tokens=s.get("patch_step_tokens")).n_tokens for t in trajs]

    def run(self, store_path: str, tmp_name: str, trajs: list) -> dict:
        """Replay ``trajs``, write their shard to ``shards/tmp_name``; returns what the driver commits."""
        from .._io import atomic_write_bytes
        from ..model import Fingerprint
        from ..store import encode_shard, extract_one

        t0 = time.perf_counter()
        states, truncated, windowed = [], 0, 0
        for t in trajs:
            st, tr, wi = extract_one(self.policy, t, self.settings)
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


def extract_pools_ray(model: str | os.PathLike | None, trajectories: Iterable, store: StateStore | str | os.PathLike,
                      *, ray_address: str | None = "local", workers: int = 2, gpus_per_worker: float = 0,
                      cpus_per_worker: float | None = None, dtype: str = "auto", device: str | None = None,
                      threads: int | None = 1, max_span_tokens: int | None = None,
                      max_prompt_tokens: int | None = None, max_tokens: int | None = None,
                      instances: int | None = None, layers: str | Sequence[int] = "all",
                      store_dtype: str = "float16", chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                      shard_size: int = DEFAULT_SHARD_SIZE, renderer: str = "render",
                      patch_step_tokens: int | None = None,
                      progress: Callable[[ExtractProgress], None] | None = None) -> ExtractReport:
    """``extract_pools`` on ``workers`` Ray actors (same store, same states; see the module doc).

    ``model`` is a path every node can read (or None: the embedded model). ``threads``: torch
    threads per worker. ``gpus_per_worker`` / ``cpus_per_worker`` are the actors' Ray resources
    (CPU default: a fraction of the cluster so actors never claim every CPU).
    """
    workers = check_positive_int(workers, "workers", "extract_pools_ray")
    shard_size = check_positive_int(shard_size, "shard_size", "extract_pools_ray")
    store = store if isinstance(store, StateStore) else StateStore(store)
    trajs = select_unique(trajectories, instances)
    settings_kw = dict(max_span_tokens=max_span_tokens, max_prompt_tokens=max_prompt_tokens, max_tokens=max_tokens,
                       layers=layers, store_dtype=store_dtype, chunk_tokens=chunk_tokens, shard_size=shard_size,
                       renderer=renderer, patch_step_tokens=patch_step_tokens)
    t0 = time.perf_counter()
    report = ExtractReport(len(trajs), 0, 0, 0, 0, 0, 0.0)
    with store.lock():  # before any worker starts: a second writer fails fast, nothing is touched
        ray = connect(ray_address)
        Actor = ray.remote(ExtractWorker)
        cpus = worker_cpus(ray, workers, cpus_per_worker)
        tag = uuid.uuid4().hex[:8]
        model_arg = None if model is None else str(Path(model).resolve())
        pool = [Actor.options(num_cpus=cpus, num_gpus=gpus_per_worker, max_restarts=0,
                              name=f"{ACTOR_PREFIX}{tag}-{i}").remote(model_arg, dtype, device, threads, settings_kw)
                for i in range(workers)]
        try:
            _drive(ray, pool, store, trajs, report, progress, t0, shard_size)
        finally:
            for a in pool:
                ray.kill(a)
    report.seconds = time.perf_counter() - t0
    return report


def _drive(ray, pool, store, trajs, report, progress, t0, shard_size) -> None:
    from ray.exceptions import RayActorError

    try:
        infos = ray.get([a.info.remote() for a in pool])
    except RayActorError as e:  # the actor class itself failed to start (e.g. latentsift missing there)
        cause = str(e).strip().splitlines()[-1]
        raise LatentSiftError(f"A Ray worker could not start: {cause}. Install latentsift (with the same version) "
                              "on every node. The store was not changed.") from None
    bad = next((i for i in infos if "error" in i), None)
    if bad:
        raise LatentSiftError(f"A Ray worker on {bad['host']} could not load the model: {bad['error']}. "
                              "The store was not changed.")
    from ..model import Fingerprint

    fps = {Fingerprint.from_dict(i["fingerprint"]).digest for i in infos}
    if len(fps) != 1:
        raise LatentSiftError("The Ray workers loaded different models (fingerprints differ); give them the same "
                              "model path and dtype.")
    fp, settings = Fingerprint.from_dict(infos[0]["fingerprint"]), infos[0]["settings"]
    store.open_or_create(fp, settings)
    report.redone = store.drop_damaged()  # as extract_pools: a truncated or deleted shard is not "stored"
    todo = [t for t in trajs if not store.has(t.traj_id)]
    report.n_skipped = len(trajs) - len(todo)
    if progress:
        progress(ExtractProgress(0, len(todo), report.n_skipped, 0, time.perf_counter() - t0))  # workers loaded
    if not todo:
        return
    # token counts on all workers, then longest first: the greedy hand-out below balances the load
    parts = [todo[i::len(pool)] for i in range(len(pool))]
    counts = ray.get([a.count_tokens.remote(p) for a, p in zip(pool, parts) if p])
    n_tok = {t.traj_id: n for p, c in zip(parts, counts) for t, n in zip(p, c)}
    order = sorted(todo, key=lambda t: -n_tok[t.traj_id])
    queue = [order[a:a + shard_size] for a in range(0, len(order), shard_size)]
    queue.reverse()  # pop() takes the longest batch first
    inflight: dict[Any, tuple[Any, list, str]] = {}
    idle, dead = list(pool), []

    def hand_out():
        while idle and queue:
            a, batch = idle.pop(0), queue.pop()
            tmp = f"part-{uuid.uuid4().hex}.safetensors.tmp"
            inflight[a.run.remote(str(store.path), tmp, batch)] = (a, batch, tmp)

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
            (store.path / SHARDS / tmp).unlink(missing_ok=True)
            if len(dead) == len(pool):
                raise LatentSiftError(f"All {len(pool)} Ray workers died; {report.n_extracted} trajectories were "
                                      "committed. Re-run the same command to resume.") from None
            hand_out()
            continue
        report.shards.append(store.commit(res["tmp_name"], res["shard"]))
        report.n_extracted += len(batch)
        report.n_tokens += res["tokens"]
        report.n_truncated += res["truncated"]
        report.n_windowed += res["windowed"]
        if progress:
            progress(ExtractProgress(report.n_extracted, len(todo), report.n_skipped, report.n_tokens,
                                     time.perf_counter() - t0, batch[-1].traj_id))
        idle.append(actor)
        hand_out()
