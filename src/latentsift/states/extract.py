"""Extraction: render + replay every trajectory and append its states to a state store, resumable.

One driver, :func:`extract_pools`, with the work done by an :class:`ExtractionBackend`:

- :class:`LocalExtractionBackend`: a policy loaded in this process replays the trajectories, as many at once as
  torch has threads, each at one thread (:func:`extract_many`);
- ``latentsift.scale.extract.RayBackend``: N Ray actors, each loading the model once, replay
  shard-sized batches (docs/scale.md); Ray is imported only there.

The driver never asks which backend it has. It selects the trajectories, holds the store's writer
lock, asks the backend for the model's fingerprint and the manifest settings, skips what is already
stored, and is the only one that commits: the backend yields :class:`Extracted` records (finished
trajectories, and a finished batch's encoded shard) and the driver appends each shard to the store
(``StateStore.append`` for bytes in memory, ``StateStore.commit`` for a file a worker wrote). A
worker's partial output is never visible as stored. Backends give the same states, each
trajectory's bit for bit (same model, dtype and device kind); only the grouping into shards may
differ (the Ray backend batches the longest trajectories first).

``latentsift.scale.backends.open_backend`` turns the command-line choices (``--model``, ``--dtype``,
``--device``, ``--threads``, ``--ray``, ``--workers``, ``--gpus-per-worker``) into a backend.
"""
from __future__ import annotations

import abc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from .._core.registry import registry_add
from .._core import words
from .._core.threads import one_thread_pool, ordered_map
from .._core.validation import LatentSiftError, check_positive_int, param_error
from .channel import RENDER, renderer_id, renderer_names, renderer_of
from .hardware import kernel_record
from .model import Fingerprint, load_policy
from .packing import can_pack, memory_pack_tokens, model_token_bytes, pack_plan, replay_packed, run_length
from .states import DEFAULT_CHUNK_TOKENS, TrajectoryStates, merge_states, replay_many
from .store import DEFAULT_SHARD_SIZE, STORE_DTYPES, EncodedShard, StateStore, encode_shard

OWNER = "extract_pools"  # the function named in settings errors
#: ``pack_tokens`` when it is not given, per device kind (0: one trajectory per forward), halved while a
#: pack's transients would take more than ``packing.PACK_MEMORY`` (a 7B shape: 32,768). On a CPU packing
#: short trajectories measured no faster than one per forward at one thread each (docs/scale.md); on an
#: H200 SmolLM2's shapes replayed at 31k tok/s one per forward, 303k in packs of 16,384 tokens and 345k
#: in packs of 65,536 (docs/studies/scale.md).
DEFAULT_PACK_TOKENS = {"cpu": 0, "cuda": 65536}
#: ``chunk_tokens`` when it is not given, per device kind (else :data:`~latentsift.states.states.DEFAULT_CHUNK_TOKENS`).
#: On a GPU a window in one chunk runs FlashAttention without a mask, where chunks after the first attend to
#: their KV cache through a mask (the math kernel): a 30k-token trajectory of a 1.5B shape replayed 9.7x faster
#: in chunks of 32,768 than of 2,048 (H200, bfloat16; docs/studies/scale.md).
DEFAULT_CHUNK = {"cpu": DEFAULT_CHUNK_TOKENS, "cuda": 32768}


@dataclass
class ExtractProgress:
    """Passed to the ``progress`` callback of :func:`extract_pools` (at start and as trajectories finish)."""

    done: int          # trajectories extracted in this call so far
    total: int         # trajectories to extract in this call (already stored ones excluded)
    skipped: int       # trajectories already in the store
    tokens: int        # tokens run through the model in this call so far
    elapsed: float     # seconds since the start of this call
    traj_id: str | None = None


@dataclass
class ExtractReport:
    """What :func:`extract_pools` did."""

    n_requested: int
    n_skipped: int
    n_extracted: int
    n_tokens: int
    n_truncated: int     # trajectories cut by max_tokens (their later spans have no state)
    n_windowed: int      # trajectories longer than the context (sliding-window rule applied)
    seconds: float
    shards: list[str] = field(default_factory=list)
    redone: list[str] = field(default_factory=list)  # stored in a missing or damaged shard: extracted again

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Extracted:
    """Finished work a backend hands to the driver: trajectories done, and/or a batch's shard to commit."""

    traj_ids: list[str]                 # trajectories finished (counted and reported to ``progress``)
    tokens: int = 0
    truncated: int = 0
    windowed: int = 0
    shard: EncodedShard | None = None   # a finished batch, committed by the driver before the counts
    tmp_name: str | None = None         # the file ``shards/<tmp_name>`` a worker wrote (None: ``shard.data``)


class ExtractionBackend(abc.ABC):
    """Where trajectories are replayed. The driver calls ``check``, then, holding the store's lock,
    ``start``, ``run`` and finally ``close``."""

    def check(self, settings_kw: Mapping[str, Any]) -> None:
        """Validate the settings before the store is touched (the default: the policy-free checks)."""
        check_settings(**settings_kw)

    @abc.abstractmethod
    def start(self, settings_kw: Mapping[str, Any]) -> tuple[Fingerprint, dict[str, Any]]:
        """Ready the model(s); return the model's fingerprint and the manifest settings (:func:`extract_settings`)."""

    @abc.abstractmethod
    def run(self, store_path: Path, todo: list, shard_size: int) -> Iterator[Extracted]:
        """Replay ``todo`` in batches of ``shard_size`` trajectories; yield what finishes as it finishes.
        The driver commits each yielded shard before the generator resumes."""

    def close(self) -> None:
        """Release workers (called once, also after an error)."""

    def describe(self) -> str:
        """One line for the log."""
        return type(self).__name__

    @classmethod
    def from_options(cls, **options: Any) -> "ExtractionBackend":
        """The backend ``latentsift extract`` builds from its options (``model``, ``dtype``, ``device``,
        ``threads``, ``ray_address``, ``workers``, ``gpus_per_worker``; each backend reads those it needs)."""
        raise LatentSiftError(f"The extraction backend {cls.__name__} cannot be built from command-line options.")


class LocalExtractionBackend(ExtractionBackend):
    """This process: ``policy`` replays the trajectories (:func:`extract_many`), one shard per ``shard_size``
    in input order."""

    name = words.LOCAL

    def __init__(self, policy):
        self.policy = policy
        self.settings: dict[str, Any] | None = None

    @classmethod
    def from_options(cls, *, model=None, dtype: str = "auto", device: str | None = None, threads: int | None = None,
                     device_map: str | None = None, **_: Any) -> "LocalExtractionBackend":
        """The policy loaded here (``threads``: torch threads of this process; ``device_map``: split by
        accelerate, see ``load_policy``)."""
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        return cls(load_policy(model, dtype=dtype, device=device, device_map=device_map))

    def check(self, settings_kw: Mapping[str, Any]) -> None:
        extract_settings(self.policy, **settings_kw)

    def start(self, settings_kw: Mapping[str, Any]) -> tuple[Fingerprint, dict[str, Any]]:
        self.settings = extract_settings(self.policy, **settings_kw)
        return self.policy.fingerprint, self.settings

    def run(self, store_path: Path, todo: list, shard_size: int) -> Iterator[Extracted]:
        batch, states = [], []  # one pool for all shards: the workers go on while a shard is committed
        for i, (st, truncated, windowed) in enumerate(extract_many(self.policy, todo, self.settings)):
            batch.append(todo[i])
            states.append(st)
            yield Extracted([todo[i].traj_id], st.n_tokens, int(truncated), int(windowed))
            if len(batch) == shard_size or i == len(todo) - 1:
                shard = encode_shard(states, [b.instance_id for b in batch], self.policy.fingerprint,
                                     self.settings, where=str(store_path))
                batch, states = [], []
                yield Extracted([], shard=shard)

    def describe(self) -> str:
        return f"model: {self.policy.describe()}"


# ---------------------------------------------------------------------- settings and selection
registry_add("extraction_backend", LocalExtractionBackend.name, LocalExtractionBackend)


def resolve_layers(layers: str | Sequence[int], n_layers: int) -> list[int]:
    """``"all"`` -> 1..L, ``"final"`` -> [L], or a list of layer indices in 1..L (must include L,
    the distance-state layer)."""
    if isinstance(layers, str):
        if layers == "all":
            return list(range(1, n_layers + 1))
        if layers == "final":
            return [n_layers]
        raise param_error("layers", OWNER, "'all', 'final' or a list of layer indices", layers)
    ids = sorted({int(x) for x in layers})
    if not ids or ids[0] < 1 or ids[-1] != n_layers:
        raise param_error("layers", OWNER, f"layer indices in 1..{n_layers} including {n_layers}", layers)
    return ids


def check_settings(*, max_span_tokens: int | None = None, max_prompt_tokens: int | None = None,
                   max_tokens: int | None = None, layers: str | Sequence[int] = "all",
                   store_dtype: str = "float16", chunk_tokens: int | None = None,
                   shard_size: int = DEFAULT_SHARD_SIZE, renderer: str = RENDER,
                   patch_step_tokens: int | None = None, pack_tokens: int | None = None) -> None:
    """The checks of :func:`extract_settings` that need no policy."""
    if renderer not in renderer_names():
        raise param_error("renderer", OWNER, f"one of {list(renderer_names())}", renderer)
    for name, v in (("max_span_tokens", max_span_tokens), ("max_prompt_tokens", max_prompt_tokens),
                    ("max_tokens", max_tokens), ("patch_step_tokens", patch_step_tokens)):
        if v is not None:
            check_positive_int(v, name, OWNER)
    if store_dtype not in STORE_DTYPES:
        raise param_error("store_dtype", OWNER, f"one of {list(STORE_DTYPES)}", store_dtype)
    if chunk_tokens is not None:
        check_positive_int(chunk_tokens, "chunk_tokens", OWNER)
    check_positive_int(shard_size, "shard_size", OWNER)
    if pack_tokens is not None and (isinstance(pack_tokens, bool) or not isinstance(pack_tokens, int)
                                    or pack_tokens < 0):
        raise param_error("pack_tokens", OWNER, "a non-negative int (0: one trajectory per forward)", pack_tokens)


def extract_settings(policy, *, max_span_tokens: int | None = None, max_prompt_tokens: int | None = None,
                     max_tokens: int | None = None, layers: str | Sequence[int] = "all",
                     store_dtype: str = "float16", chunk_tokens: int | None = None,
                     shard_size: int = DEFAULT_SHARD_SIZE, renderer: str = RENDER,
                     patch_step_tokens: int | None = None, pack_tokens: int | None = None) -> dict[str, Any]:
    """The manifest settings of an extraction (validated), with what fixes the states' bytes on this
    machine (``kernels``: :func:`~latentsift.states.hardware.kernel_record`) and why the dtype was chosen.

    ``pack_tokens``: the token budget of a packed forward (:func:`extract_many`); None: the device's
    default (:data:`DEFAULT_PACK_TOKENS`); recorded as used (0 where the model cannot be packed,
    :func:`~latentsift.states.packing.can_pack`). It changes the states by rounding only, so a store
    is resumed at any value. ``chunk_tokens``: None: the device's default (:data:`DEFAULT_CHUNK`)."""
    check_settings(max_span_tokens=max_span_tokens, max_prompt_tokens=max_prompt_tokens, max_tokens=max_tokens,
                   store_dtype=store_dtype, chunk_tokens=chunk_tokens, shard_size=shard_size, renderer=renderer,
                   patch_step_tokens=patch_step_tokens, pack_tokens=pack_tokens)
    ctx = policy.context_length
    # a pack may be longer than the context: each rendering in it has positions 0..n-1 of its own (pack_size)
    if not can_pack(policy):
        pack_tokens = 0
    elif pack_tokens is None:
        pack_tokens = DEFAULT_PACK_TOKENS.get(policy.device.type, 0)
        if pack_tokens:   # the memory rule reads the model's config only where packing is on by default
            pack_tokens = memory_pack_tokens(pack_tokens, model_token_bytes(policy))
    if chunk_tokens is None:
        chunk_tokens = DEFAULT_CHUNK.get(policy.device.type, DEFAULT_CHUNK_TOKENS)
    return {"max_span_tokens": max_span_tokens, "max_prompt_tokens": max_prompt_tokens, "max_tokens": max_tokens,
            "context": ctx, "window_stride": ctx // 2, "layers": resolve_layers(layers, policy.n_layers),
            "store_dtype": store_dtype, "dtype": policy.fingerprint.dtype, "chunk_tokens": chunk_tokens,
            "shard_size": shard_size, "renderer": renderer_id(renderer),
            "patch_step_tokens": patch_step_tokens, "pack_tokens": pack_tokens, "kernels": kernel_record(policy.device),
            "dtype_reason": policy.dtype_choice.reason if policy.dtype_choice else None}


def select_instances(trajectories: Sequence, n_instances: int | None) -> list:
    """The trajectories of the first ``n_instances`` instances (sorted by instance id), in input order."""
    trajectories = list(trajectories)
    if n_instances is None:
        return trajectories
    n_instances = check_positive_int(n_instances, "instances", OWNER)
    keep = set(sorted({t.instance_id for t in trajectories})[:n_instances])
    return [t for t in trajectories if t.instance_id in keep]


def select_unique(trajectories: Iterable, instances: int | None) -> list:
    """``select_instances``, then an error if a trajectory id occurs twice (it would be stored once)."""
    trajs = select_instances(trajectories, instances)
    ids = [t.traj_id for t in trajs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise LatentSiftError(f"The trajectory id {dup!r} occurs more than once in the input.")
    return trajs


def render_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``render`` keywords of the manifest ``settings``."""
    return {"max_span_tokens": settings["max_span_tokens"], "max_prompt_tokens": settings["max_prompt_tokens"],
            "patch_step_tokens": settings.get("patch_step_tokens")}


def renderings_of(policy, trajectory, settings: dict[str, Any]) -> list:
    """The renderings :func:`extract_one` replays for ``trajectory`` (one, or one per step)."""
    rs = renderer_of(settings["renderer"])(trajectory, policy.tokenizer, **render_settings(settings))
    return rs if isinstance(rs, list) else [rs]


def _layer_ids(policy, settings: dict[str, Any]):
    layer_ids = settings["layers"]
    return None if len(layer_ids) == policy.n_layers else layer_ids


def _finish(policy, trajectory, rs: list, parts: list) -> tuple[TrajectoryStates, bool, bool]:
    st = parts[0] if len(parts) == 1 else merge_states(parts, trajectory.traj_id)
    truncated = any(p.n_tokens < r.n_tokens for p, r in zip(parts, rs))
    windowed = any(p.n_tokens > policy.context_length for p in parts)
    return st, truncated, windowed


def extract_one(policy, trajectory, settings: dict[str, Any]) -> tuple[TrajectoryStates, bool, bool]:
    """Render and replay one trajectory with the manifest ``settings`` of :func:`extract_settings`.

    Returns (states, truncated by max_tokens, longer than the context)."""
    rs = renderings_of(policy, trajectory, settings)
    parts = replay_many(policy, rs, chunk_tokens=settings["chunk_tokens"], max_tokens=settings["max_tokens"],
                        layer_ids=_layer_ids(policy, settings))
    return _finish(policy, trajectory, rs, parts)


def extract_pack(policy, pack: list, settings: dict[str, Any]) -> list[tuple[TrajectoryStates, bool, bool]]:
    """:func:`extract_one` of each ``(trajectory, renderings)`` of ``pack``: all renderings in one packed
    forward (:func:`~latentsift.states.packing.replay_packed`), or, for a pack of one that does not fit
    (:func:`pack_size`), one forward per rendering, chunked."""
    if len(pack) == 1 and pack_size(pack[0][1], settings) > settings["pack_tokens"]:
        t, rs = pack[0]
        parts = replay_many(policy, rs, chunk_tokens=settings["chunk_tokens"], max_tokens=settings["max_tokens"],
                            layer_ids=_layer_ids(policy, settings))
        return [_finish(policy, t, rs, parts)]
    parts = replay_packed(policy, [r for _, rs in pack for r in rs], max_tokens=settings["max_tokens"],
                          layer_ids=_layer_ids(policy, settings))
    out, a = [], 0
    for t, rs in pack:
        out.append(_finish(policy, t, rs, parts[a:a + len(rs)]))
        a += len(rs)
    return out


def pack_size(rs: list, settings: dict[str, Any]) -> int:
    """The tokens the renderings ``rs`` of one trajectory take in a pack; more than ``pack_tokens`` when
    one of them is longer than a chunk or the context (it is replayed alone, chunked, as without packing)."""
    runs = [run_length(r, settings["max_tokens"]) for r in rs]
    if max(runs, default=0) > min(settings["chunk_tokens"], settings["context"]):
        return settings["pack_tokens"] + 1
    return sum(runs)


def extract_many(policy, trajectories: Sequence, settings: dict[str, Any],
                 workers: int | None = None) -> Iterator[tuple[TrajectoryStates, bool, bool]]:
    """:func:`extract_one` of each trajectory, in order, ``workers`` trajectories at a time (default:
    ``policy.replay_workers()``: the torch thread count on a CPU, one on a GPU).

    Each worker thread replays whole trajectories at one torch thread, so a trajectory's states are
    the same bits at any worker count, in any order, and as a single-threaded replay (measured on
    2 cores: two one-thread forwards side by side are 1.4x the throughput of one two-thread forward,
    which moreover rounds differently; see ``states.replay``).

    ``settings["pack_tokens"]`` > 0: the trajectories are rendered by the workers, grouped in input
    order into packs of at most that many tokens (:func:`~latentsift.states.packing.pack_plan`) and
    each pack is replayed in one forward by one worker (:func:`extract_pack`); a trajectory longer than
    the budget or a chunk is a pack of its own, replayed as without packing. The packs depend on the
    input's order and lengths only, so the same input gives the same bytes; and which trajectories
    share a pack changes a trajectory's states by the linear layers' rounding at another row count
    only (tests/test_packed.py: float32 within 1e-5; measured the same bytes on an AVX-512 CPU)."""
    n = policy.replay_workers() if workers is None else check_positive_int(workers, "workers", OWNER)
    with one_thread_pool(n) as pool:
        if not settings.get("pack_tokens"):
            yield from ordered_map(pool, lambda t: extract_one(policy, t, settings), trajectories, ahead=2 * n)
            return
        rendered = ordered_map(pool, lambda t: (t, renderings_of(policy, t, settings)), trajectories, ahead=2 * n)
        packs = pack_plan(rendered, lambda tr: pack_size(tr[1], settings), settings["pack_tokens"])
        for done in ordered_map(pool, lambda pack: extract_pack(policy, pack, settings), packs, ahead=2 * n):
            yield from done


# ---------------------------------------------------------------------- the driver
def extract_pools(backend, trajectories: Iterable, store: StateStore | str | os.PathLike, *,
                  max_span_tokens: int | None = None, max_prompt_tokens: int | None = None,
                  max_tokens: int | None = None, instances: int | None = None,
                  layers: str | Sequence[int] = "all", store_dtype: str = "float16",
                  chunk_tokens: int | None = None, shard_size: int = DEFAULT_SHARD_SIZE,
                  renderer: str = RENDER, patch_step_tokens: int | None = None, pack_tokens: int | None = None,
                  progress: Callable[[ExtractProgress], None] | None = None) -> ExtractReport:
    """Render each trajectory, replay it through the policy and append its states to ``store``.

    ``backend``: an :class:`ExtractionBackend` (``LocalExtractionBackend(policy)``, ``RayBackend(model,
    workers=N)``, or ``backends.open_backend``), or a loaded policy (run here: ``LocalExtractionBackend(policy)``).

    Resumable: trajectories already in the store are skipped, so re-running after a kill finishes
    the work without duplicates (at most the ``shard_size`` trajectories of an interrupted shard are
    recomputed); shards that are missing or fail their checksum are dropped and their trajectories
    extracted again (``ExtractReport.redone``). The store is created on first use; re-opening it
    with another model or other value-changing settings raises an error. ``max_span_tokens`` /
    ``max_prompt_tokens`` go to ``render``; ``max_tokens`` keeps the first tokens of each rendering
    (later spans get no state); ``instances`` keeps the first N instances by id.
    ``renderer="render_per_step"`` is for chat templates that drop earlier ``<think>`` blocks
    (Qwen3): each step is replayed in the context the policy saw when writing it (O(T^2) tokens) and
    the disjoint spans are merged. ``patch_step_tokens`` keeps the first N tokens of each span of the
    step that wrote the final patch (``channel.patch_step``) instead of ``max_span_tokens``.
    ``pack_tokens``: several short trajectories per forward, up to that many tokens (0: one per forward;
    None: the device's default, :data:`DEFAULT_PACK_TOKENS`; see :func:`extract_many`); ``chunk_tokens``
    None: the device's default, :data:`DEFAULT_CHUNK`.
    """
    backend = backend if isinstance(backend, ExtractionBackend) else LocalExtractionBackend(backend)
    settings_kw = dict(max_span_tokens=max_span_tokens, max_prompt_tokens=max_prompt_tokens, max_tokens=max_tokens,
                       layers=layers, store_dtype=store_dtype, chunk_tokens=chunk_tokens, shard_size=shard_size,
                       renderer=renderer, patch_step_tokens=patch_step_tokens, pack_tokens=pack_tokens)
    backend.check(settings_kw)
    store = store if isinstance(store, StateStore) else StateStore(store)
    trajs = select_unique(trajectories, instances)
    t0 = time.perf_counter()
    report = ExtractReport(len(trajs), 0, 0, 0, 0, 0, 0.0)
    with store.lock():  # before any worker starts: a second writer fails fast, nothing is touched
        try:
            fingerprint, settings = backend.start(settings_kw)
            store.open_or_create(fingerprint, settings)
            report.redone = store.drop_damaged()  # a truncated or deleted shard is not "already stored"
            todo = [t for t in trajs if not store.has(t.traj_id)]
            report.n_skipped = len(trajs) - len(todo)
            if progress:
                progress(ExtractProgress(0, len(todo), report.n_skipped, 0, time.perf_counter() - t0))
            for done in backend.run(store.path, todo, shard_size) if todo else ():
                if done.shard is not None:
                    report.shards.append(store.commit(done.tmp_name, done.shard) if done.tmp_name
                                         else store.append(done.shard))
                if done.traj_ids:
                    report.n_extracted += len(done.traj_ids)
                    report.n_tokens += done.tokens
                    report.n_truncated += done.truncated
                    report.n_windowed += done.windowed
                    if progress:
                        progress(ExtractProgress(report.n_extracted, len(todo), report.n_skipped, report.n_tokens,
                                                 time.perf_counter() - t0, done.traj_ids[-1]))
        finally:
            backend.close()
    report.seconds = time.perf_counter() - t0
    return report
