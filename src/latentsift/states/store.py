"""On-disk store of policy states: the format, its writer and reader (``latentsift.states.extract`` fills it).

Layout of ``STATES_DIR`` (format ``latentsift-states`` version 1)::

    manifest.json                 fingerprint of the model (dtype included), settings, format version,
                                  creation time; the settings hold ``kernels`` (torch version, ATen's
                                  CPU capability, the bf16 units, ISA environment settings, the
                                  forward's thread count) and ``dtype_reason``: a resume under another
                                  dtype or other kernels is refused
    index.parquet                 one row per span: traj_id, instance_id, step, channel, shard, row,
                                  n_tokens; its key-value metadata ``latentsift`` (JSON) lists the
                                  shards (name, sha256, rows) and every trajectory (also those
                                  without spans). This file is the commit point of the store.
    shards/shard-00000.safetensors  ``states`` (rows, n_layers, d_model) float16, ``step`` int32,
                                  ``channel`` int8; rows of one trajectory are contiguous

Writes are atomic: a shard is written to a temporary name and renamed, then the index is
rewritten to a temporary name and renamed. A kill at any moment leaves either the old index (the
new shard, if renamed, is an orphan deleted on the next open) or the new one. Shards are checked
against their sha256 on load.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .._core.io import ArtefactKind, WriterLock, atomic_write_bytes, member, read_artefact, sha256_hex, write_artefact
from .._core.manifests import StoreIndex, StoreManifest, check_manifest
from .._core.validation import PACKAGE, FingerprintMismatch, LatentSiftError, param_error
from .channel import same_renderer_id
from .model import Fingerprint
from .states import TrajectoryStates

FORMAT = "latentsift-states"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.parquet"
SHARDS = "shards"
LOCK = ".lock"
META_KEY = PACKAGE.encode()
DEFAULT_SHARD_SIZE = 32
#: What to do about a missing or damaged shard: a resumed extract checks every shard and redoes
#: only the trajectories of the damaged ones (``drop_damaged``).
REPAIR = ("re-run the same 'latentsift extract' command on this store; it redoes only the trajectories of "
          "the damaged shard.")
STORE_DTYPES = ("float16", "float32")
# settings that change the stored values: they must match when a store is re-opened for writing
MATCHED_SETTINGS = ("max_span_tokens", "max_prompt_tokens", "max_tokens", "context", "layers", "store_dtype",
                    "renderer", "patch_step_tokens")
#: The settings that cut the spans (a trajectory's spans and their tokens): two models' stores of the same
#: candidates compare their encoders only when these match (``latentsift premise``: own against proxy).
SPAN_SETTINGS = ("max_span_tokens", "max_prompt_tokens", "max_tokens", "patch_step_tokens", "renderer")
#: The settings entry recording what fixes the bytes besides the model and settings
#: (``hardware.kernel_record``); a store is resumed only under the same.
KERNELS = "kernels"
STORE_ARTEFACT = ArtefactKind(FORMAT, FORMAT_VERSION, MANIFEST, noun="a state store",
                              make="run 'latentsift extract' first", redo="delete the directory and re-run extract",
                              schema=StoreManifest)


def check_recorded_settings(recorded: dict | None, store: "StateStore", what: str) -> None:
    """An artefact built from stored states (a bank records its store's settings) used with the
    states of ``store``: the value-changing settings (span budgets, layers, renderer ...) must match,
    else its distances compare spans cut differently. Artefacts that record none are not checked."""
    if not recorded:
        return
    now = store.settings
    diff = {k: (_matched(recorded, k), _matched(now, k)) for k in MATCHED_SETTINGS if k in recorded or k in now}
    diff = {k: (a, b) for k, (a, b) in diff.items() if a != b}
    if diff:
        raise LatentSiftError(f"{what} was built from states extracted with other settings than {store.path}: "
                              + ", ".join(f"{k}={a!r} (these states: {b!r})" for k, (a, b) in diff.items())
                              + "; extract the states with the same settings or rebuild it from these states.")
# value of a matched setting in a store written before the setting existed
SETTING_DEFAULTS = {"patch_step_tokens": None}


def _matched(settings: dict, key: str) -> Any:
    """A matched setting's value as it is recorded now (an older store: the default of a setting it
    predates, its renderer's path before the renderers moved)."""
    value = settings.get(key, SETTING_DEFAULTS.get(key))
    return same_renderer_id(value) if key == "renderer" else value


class StateStore:
    """A directory of policy states: safetensors shards + a Parquet index + a JSON manifest.

    ``StateStore(path).create(fingerprint, settings)`` starts a new store, ``.open()`` reads an
    existing one, ``.open_or_create(...)`` does either and checks that the model and settings
    match. ``.write(states, instance_ids)`` appends one shard; ``.load()`` returns the states by
    trajectory id after verifying each shard's sha256.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.manifest: dict | None = None
        self._rows: dict[str, list] = {k: [] for k in ("traj_id", "instance_id", "step", "channel", "shard",
                                                       "row", "n_tokens")}
        self._shards: list[dict] = []
        self._trajs: dict[str, dict] = {}

    # -- opening ----------------------------------------------------------------------------
    @property
    def exists(self) -> bool:
        return (self.path / MANIFEST).is_file()

    def create(self, fingerprint: Fingerprint, settings: dict[str, Any]) -> "StateStore":
        """Start a new, empty store (the directory may exist but must not hold a store)."""
        if self.exists:
            raise LatentSiftError(f"{self.path} already holds a state store; open it instead "
                                  "(or choose another --out).")
        (self.path / SHARDS).mkdir(parents=True, exist_ok=True)
        manifest = {"created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "fingerprint": fingerprint.to_dict(), "settings": dict(settings)}
        json.dumps(manifest)  # settings must be JSON
        self._write_index()
        self.manifest = write_artefact(self.path, STORE_ARTEFACT, manifest)
        return self

    def open(self) -> "StateStore":
        """Read the manifest and index; remove leftovers of an interrupted write (temporary files
        and shards the index does not reference)."""
        import pyarrow.parquet as pq

        self.manifest, _ = read_artefact(self.path, STORE_ARTEFACT)
        ipath = self.path / INDEX
        if not ipath.is_file():
            raise LatentSiftError(f"{self.path}: the index {INDEX} is missing; the store is damaged "
                                  "(delete the directory and re-run extract).")
        table = pq.read_table(ipath)
        meta = json.loads((table.schema.metadata or {}).get(META_KEY, b"null"))
        check_manifest(meta, StoreIndex, ipath, STORE_ARTEFACT.redo)
        self._rows = {k: table.column(k).to_pylist() for k in self._rows}
        self._shards = meta["shards"]
        self._trajs = {t["traj_id"]: t for t in meta["trajectories"]}
        self._cleanup()
        return self

    def open_or_create(self, fingerprint: Fingerprint, settings: dict[str, Any]) -> "StateStore":
        """Open the store and check model and settings, or create it when it does not exist."""
        if not self.exists:
            return self.create(fingerprint, settings)
        self.open()
        self.check(fingerprint, settings)
        return self

    def check(self, fingerprint: Fingerprint, settings: dict[str, Any]) -> None:
        """Raise when ``fingerprint``, the value-changing settings or the kernels (``KERNELS``: torch
        version, CPU capability, ISA settings) differ from the manifest: a resumed store never mixes
        shards whose bytes two setups would compute differently. A store written before the kernels
        were recorded is not checked for them."""
        old_dtype = self.fingerprint.dtype
        if old_dtype != fingerprint.dtype:
            why = f" ({settings['dtype_reason']})" if settings.get("dtype_reason") else ""
            raise FingerprintMismatch(f"The store {self.path} holds {old_dtype} states; this run computes "
                                      f"{fingerprint.dtype}{why}. Pass --dtype {old_dtype} to resume it, "
                                      "or another --out.")
        self.fingerprint.check_same(fingerprint, what=f"states in {self.path}")
        was, now = self.settings.get(KERNELS), settings.get(KERNELS)
        if was is not None and now is not None and was != now:
            diff = {k: (was.get(k), now.get(k)) for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)}
            raise LatentSiftError(f"The store {self.path} was written with other kernels: "
                                  + ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in diff.items())
                                  + "; its states would not be byte-identical to these. Resume it with the same "
                                  "torch, CPU kind and ISA settings, or use another --out.")
        old = self.settings
        diff = {k: (old.get(k, SETTING_DEFAULTS.get(k)), settings.get(k)) for k in MATCHED_SETTINGS
                if k in settings and _matched(old, k) != _matched(settings, k)}
        if diff:
            raise LatentSiftError(f"The store {self.path} was written with other settings "
                                  + ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in diff.items())
                                  + "; use the same settings or another --out.")

    def _require_open(self) -> None:
        if self.manifest is None:
            self.open()

    def _cleanup(self) -> None:
        known = {s["name"] for s in self._shards}
        sdir = self.path / SHARDS
        for p in sdir.iterdir() if sdir.is_dir() else []:
            if ".tmp" in p.name or (p.suffix == ".safetensors" and p.name not in known):
                p.unlink(missing_ok=True)
        for p in self.path.glob(INDEX + ".tmp*"):  # a torn index write (see _io.atomic_write_bytes)
            p.unlink(missing_ok=True)

    # -- metadata ---------------------------------------------------------------------------
    @property
    def fingerprint(self) -> Fingerprint:
        self._require_open()
        return Fingerprint.from_dict(self.manifest["fingerprint"])

    @property
    def settings(self) -> dict[str, Any]:
        self._require_open()
        return dict(self.manifest["settings"])

    @property
    def layer_ids(self) -> tuple[int, ...] | None:
        """Stored layer indices (``None`` = all of 1..L)."""
        layers = self.settings.get("layers")
        n = self.fingerprint.n_layers
        return None if layers in (None, list(range(1, n + 1))) else tuple(layers)

    def has(self, traj_id: str) -> bool:
        self._require_open()
        return traj_id in self._trajs

    def traj_ids(self) -> list[str]:
        """Stored trajectory ids, in the order they were written."""
        self._require_open()
        return list(self._trajs)

    def trajectories(self) -> list[dict]:
        """One record per stored trajectory: traj_id, instance_id, shard, n_tokens, n_spans."""
        self._require_open()
        return [dict(t) for t in self._trajs.values()]

    def index(self):
        """The span index as a ``pyarrow.Table`` (one row per stored span)."""
        self._require_open()
        return self._table()

    def __len__(self) -> int:
        self._require_open()
        return len(self._trajs)

    # -- writing ----------------------------------------------------------------------------
    def _table(self):
        import pyarrow as pa

        schema = pa.schema([("traj_id", pa.string()), ("instance_id", pa.string()), ("step", pa.int32()),
                            ("channel", pa.int8()), ("shard", pa.string()), ("row", pa.int64()),
                            ("n_tokens", pa.int64())])
        meta = {"format": FORMAT, "version": FORMAT_VERSION, "shards": self._shards,
                "trajectories": list(self._trajs.values())}
        return pa.table(self._rows, schema=schema).replace_schema_metadata({META_KEY: json.dumps(meta).encode()})

    def _write_index(self) -> None:
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(self._table(), buf)
        atomic_write_bytes(self.path / INDEX, buf.getvalue())

    def write(self, states: Sequence[TrajectoryStates], instance_ids: Sequence[str]) -> str | None:
        """Append one shard holding ``states`` (with their instance ids); returns its name.

        Atomic: the shard is renamed into place, then the index that references it; a kill in
        between leaves an orphan that the next ``open`` deletes.
        """
        self._require_open()
        states = list(states)
        for s in states:
            if s.traj_id in self._trajs:
                raise LatentSiftError(f"The trajectory {s.traj_id!r} is already in the store {self.path}.")
        shard = encode_shard(states, instance_ids, self.fingerprint, self.settings, where=str(self.path))
        return None if shard is None else self.append(shard)

    def append(self, shard: "EncodedShard") -> str:
        """Append one encoded shard (its bytes in ``shard.data``); returns its name. Atomic as ``write``."""
        self._require_open()
        dup = next((t for t in shard.traj_ids if t in self._trajs), None)
        if dup is not None:
            raise LatentSiftError(f"The trajectory {dup!r} is already in the store {self.path}.")
        name = self._next_name()
        atomic_write_bytes(self.path / SHARDS / name, shard.data)
        self._append(name, shard)
        return name

    def _next_name(self) -> str:
        used, n = {s["name"] for s in self._shards}, len(self._shards)
        while f"shard-{n:05d}.safetensors" in used:  # after drop_damaged, names may have gaps
            n += 1
        return f"shard-{n:05d}.safetensors"

    def damaged_shards(self) -> list[str]:
        """Names of the shards listed in the index whose file is missing or fails its sha256."""
        self._require_open()
        bad = []
        for s in self._shards:
            p = member(self.path / SHARDS, s["name"], self.path / INDEX)
            if not p.is_file() or sha256_hex(self._shard_bytes(p)) != s["sha256"]:
                bad.append(s["name"])
        return bad

    def drop_damaged(self) -> list[str]:
        """Verify every shard before it is trusted on resume; drop the missing or damaged ones from
        the index (their trajectories count as not stored, so a resumed extract redoes them) and
        delete their damaged files. Returns the trajectory ids dropped. The caller holds the lock."""
        bad = set(self.damaged_shards())
        if not bad:
            return []
        keep = [i for i, s in enumerate(self._rows["shard"]) if s not in bad]
        self._rows = {k: [v[i] for i in keep] for k, v in self._rows.items()}
        dropped = [t for t, info in self._trajs.items() if info.get("shard") in bad]
        self._trajs = {t: info for t, info in self._trajs.items() if info.get("shard") not in bad}
        self._shards = [s for s in self._shards if s["name"] not in bad]
        self._write_index()
        for name in bad:
            (self.path / SHARDS / name).unlink(missing_ok=True)
        return dropped

    def commit(self, tmp_name: str, shard: "EncodedShard") -> str:
        """Commit a shard file another process wrote as ``shards/<tmp_name>`` (the encoding of
        ``shard``, without its bytes): check its sha256, rename it to the next shard name and
        rewrite the index. The caller holds the writer lock (the driver of a distributed run)."""
        self._require_open()
        src = self.path / SHARDS / tmp_name
        if not src.is_file():
            raise LatentSiftError(f"The shard file {src} written by a worker is missing; is the store on a "
                                  "filesystem that all workers and the driver share?")
        got = sha256_hex(src.read_bytes())
        if got != shard.sha256:
            raise LatentSiftError(f"The shard file {src} does not match the checksum its worker reported; "
                                  "it was not committed.")
        dup = next((t for t in shard.traj_ids if t in self._trajs), None)
        if dup is not None:
            raise LatentSiftError(f"The trajectory {dup!r} is already in the store {self.path}.")
        name = self._next_name()
        os.replace(src, self.path / SHARDS / name)
        self._append(name, shard)
        return name

    def _append(self, name: str, shard: "EncodedShard") -> None:
        offsets = shard.offsets
        for i, (tid, inst) in enumerate(zip(shard.traj_ids, shard.instance_ids)):
            a, b = offsets[i], offsets[i + 1]
            k = b - a
            self._rows["traj_id"] += [tid] * k
            self._rows["instance_id"] += [inst] * k
            self._rows["step"] += shard.step[a:b]
            self._rows["channel"] += shard.channel[a:b]
            self._rows["shard"] += [name] * k
            self._rows["row"] += list(range(a, b))
            self._rows["n_tokens"] += [shard.n_tokens[i]] * k
            self._trajs[tid] = {"traj_id": tid, "instance_id": inst, "shard": name, "row": a,
                                "n_spans": k, "n_tokens": shard.n_tokens[i]}
        self._shards.append({"name": name, "sha256": shard.sha256, "n_rows": int(offsets[-1]),
                             "n_trajectories": len(shard.traj_ids), "bytes": shard.n_bytes})
        self._write_index()

    # -- reading ----------------------------------------------------------------------------
    def _shard_bytes(self, p: Path) -> bytes:
        """A shard's bytes; a shard that cannot be read (permissions, an I/O error) is said as such."""
        try:
            return p.read_bytes()
        except OSError as e:
            raise LatentSiftError(f"{p}: the shard cannot be read ({e.strerror or e}); make the store's files "
                                  f"readable (e.g. chmod -R u+r {self.path}) and run the command again.") from None

    def _read_shard(self, shard: dict) -> dict[str, np.ndarray]:
        from safetensors.numpy import load

        p = member(self.path / SHARDS, shard["name"], self.path / INDEX)
        if not p.is_file():
            raise LatentSiftError(f"The shard {p} listed in {self.path / INDEX} is missing: {REPAIR}")
        data = self._shard_bytes(p)
        got = sha256_hex(data)
        if got != shard["sha256"]:
            raise LatentSiftError(f"The shard {p} is corrupted: sha256 {got[:16]}... does not match the index "
                                  f"({shard['sha256'][:16]}...): {REPAIR}")
        return load(data)

    def verify(self) -> int:
        """Check every shard's sha256; returns the number of shards checked."""
        self._require_open()
        for s in self._shards:
            self._read_shard(s)
        return len(self._shards)

    def load(self, traj_ids: Iterable[str] | None = None, *, dtype: str = "float32") -> dict[str, TrajectoryStates]:
        """States by trajectory id (all, or ``traj_ids`` in that order), shards checked by sha256.

        ``dtype`` of the returned ``layers``: "float32" (default) or "float16" (half the memory).
        """
        self._require_open()
        if dtype not in STORE_DTYPES:
            raise param_error("dtype", "StateStore.load", f"one of {list(STORE_DTYPES)}", dtype)
        want = list(self._trajs) if traj_ids is None else list(traj_ids)
        missing = [t for t in want if t not in self._trajs]
        if missing:
            raise LatentSiftError(f"{len(missing)} trajectories are not in the store {self.path} "
                                  f"(first: {missing[0]!r}); run 'latentsift extract' on them.")
        by_shard: dict[str, list[str]] = {}
        for t in want:
            by_shard.setdefault(self._trajs[t]["shard"], []).append(t)
        shards = {s["name"]: s for s in self._shards}
        layer_ids = self.layer_ids
        out: dict[str, TrajectoryStates] = {}
        for name, ids in by_shard.items():
            tensors = self._read_shard(shards[name])
            for t in ids:
                rec = self._trajs[t]
                a, b = rec["row"], rec["row"] + rec["n_spans"]
                out[t] = TrajectoryStates(traj_id=t, layers=tensors["states"][a:b].astype(dtype),
                                          step=tensors["step"][a:b].copy(), channel=tensors["channel"][a:b].copy(),
                                          n_tokens=rec["n_tokens"], layer_ids=layer_ids)
        return {t: out[t] for t in want}

    def instance_of(self, traj_id: str) -> str:
        self._require_open()
        return self._trajs[traj_id]["instance_id"]

    # -- writer lock ------------------------------------------------------------------------
    def lock(self):
        """Exclusive writer lock (released when the process exits, also on a kill)."""
        return WriterLock(self.path / LOCK)


@dataclass
class EncodedShard:
    """One shard's safetensors bytes and what the index needs of it (no array: cheap to send)."""

    data: bytes | None
    sha256: str
    n_bytes: int
    traj_ids: list[str]
    instance_ids: list[str]
    offsets: list[int]
    step: list[int]
    channel: list[int]
    n_tokens: list[int]

    def without_data(self) -> "EncodedShard":
        return EncodedShard(None, self.sha256, self.n_bytes, self.traj_ids, self.instance_ids, self.offsets,
                            self.step, self.channel, self.n_tokens)


def encode_shard(states: Sequence[TrajectoryStates], instance_ids: Sequence[str], fingerprint: Fingerprint,
                 settings: dict[str, Any], *, where: str = "the store") -> EncodedShard | None:
    """Check ``states`` against the store's model and settings and encode them as one shard
    (``None`` for no states). Pure: a worker of a distributed run calls it without the store open."""
    from safetensors.numpy import save

    states = list(states)
    instance_ids = list(instance_ids)
    if len(states) != len(instance_ids):
        raise param_error("instance_ids", "StateStore.write", f"one id per trajectory ({len(states)})",
                          f"{len(instance_ids)} ids")
    if not states:
        return None
    fp = fingerprint
    n_layers = len(settings.get("layers") or range(fp.n_layers))
    dtype = settings.get("store_dtype", "float16")
    seen: set[str] = set()
    for s in states:
        if s.traj_id in seen:
            raise LatentSiftError(f"The trajectory {s.traj_id!r} is already in {where}.")
        seen.add(s.traj_id)
        if s.layers.ndim != 3 or s.layers.shape[1:] != (n_layers, fp.d_model):
            raise LatentSiftError(f"The states of {s.traj_id!r} have shape {s.layers.shape}; the store "
                                  f"{where} holds (n_spans, {n_layers}, {fp.d_model}).")
    stacked = np.concatenate([s.layers for s in states], axis=0).astype(np.float32, copy=False)
    if not np.isfinite(stacked).all():
        bad = next(s.traj_id for s in states if not np.isfinite(s.layers).all())
        raise LatentSiftError(f"The states of {bad!r} contain NaN or inf; they are not stored.")
    if dtype == "float16" and stacked.size and np.abs(stacked).max() > np.finfo(np.float16).max:
        raise LatentSiftError(f"States exceed the float16 range (max |x| = {np.abs(stacked).max():.3g}); "
                              "use store_dtype='float32' for this model.")
    # C order: safetensors writes an array's memory as it lies, so a transposed (layer-major)
    # view would be read back scrambled
    tensors = {"states": np.ascontiguousarray(stacked.astype(dtype)),
               "step": np.concatenate([s.step for s in states]).astype(np.int32),
               "channel": np.concatenate([s.channel for s in states]).astype(np.int8)}
    offsets = np.cumsum([0] + [s.n_spans for s in states]).tolist()
    # one metadata key: safetensors writes its metadata map in no fixed order
    meta = json.dumps({"format": FORMAT, "fingerprint": fp.digest, "traj_ids": [s.traj_id for s in states],
                       "offsets": offsets}, sort_keys=True)
    data = save(tensors, metadata={META_KEY.decode(): meta})
    return EncodedShard(data=data, sha256=sha256_hex(data), n_bytes=len(data), traj_ids=[s.traj_id for s in states],
                        instance_ids=instance_ids, offsets=[int(x) for x in offsets],
                        step=tensors["step"].astype(int).tolist(), channel=tensors["channel"].astype(int).tolist(),
                        n_tokens=[int(s.n_tokens) for s in states])
