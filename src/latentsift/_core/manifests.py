"""The schemas of the saved artefacts' manifests, and the one check every manifest is read through.

``check_manifest(data, schema, path, redo)`` validates a parsed manifest against its schema (a
pydantic model: strict types, no unknown field, finite numbers where a setting needs one) and turns
the first problem into one line naming the file and the field, e.g.::

    /runs/sifter/sifter.json: field 'shift_reference.loo_quantile': must be a finite number (got nan);
    the file was edited or damaged: restore it or fit the sifter again.

``read_artefact`` (``_core.io``) calls it for every artefact whose ``ArtefactKind`` names a schema:
the state store (``StoreManifest``, and ``StoreIndex`` for its index), the bank (``BankManifest``), the
scorer (``ScorerManifest``) and the sifter (``SifterManifest``, its bank library included); a run
folder (``RunManifest``), score and verifier folders (``VerifierManifest``), the explorer's file list
(``SiteManifest``), a saved operating point (``OperatingPointManifest``) and a rollout folder
(``RolloutManifest``) are read through it too.

Records that describe where an artefact came from (a bank's ``source``, a store's extraction
``settings``, a sifter's ``choice`` and ``evidence``) are kept as written: their known entries are
typed, others are allowed, since no load acts on them. Everything a load turns into an object
(settings passed to a constructor, the shift guard's reference, the trajectories and labels) is
closed: an unknown field is refused rather than ignored.
"""
from __future__ import annotations

import contextlib
import math
from typing import Annotated, Any, Iterator, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .validation import LatentSiftError

#: A number that must be finite (NaN and infinity refused).
Finite = Annotated[float, Field(allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Label = Annotated[int, Field(ge=0, le=1)]


class Closed(BaseModel):
    """A manifest part a load acts on: strict types (no "3" for 3, no true for 1), no unknown field."""

    model_config = ConfigDict(strict=True, extra="forbid")


class Record(BaseModel):
    """A manifest part that records provenance: known entries typed, others kept as written."""

    model_config = ConfigDict(strict=True, extra="allow")


class FingerprintFields(Closed):
    """``states.model.Fingerprint`` as saved (test_faults checks the two field lists agree)."""

    architecture: str
    n_layers: Positive
    d_model: Positive
    tokenizer_sha: str
    template_sha: str
    weights_sha: str
    dtype: str
    digest: str


class Artefact(Closed):
    format: str
    version: int


# ---------------------------------------------------------------------- state store
class StoreSettings(Record):
    """The extraction settings a store was written with (compared, never passed to a constructor)."""

    max_span_tokens: Positive | None = None
    max_prompt_tokens: Positive | None = None
    max_tokens: Positive | None = None
    patch_step_tokens: Positive | None = None
    context: Positive | None = None
    window_stride: Positive | None = None
    layers: list[int] | None = None
    store_dtype: str | None = None
    dtype: str | None = None
    chunk_tokens: Positive | None = None
    pack_tokens: Count | None = None  # tokens per packed forward (0: one trajectory per forward)
    shard_size: Positive | None = None
    renderer: str | None = None
    kernels: dict[str, Any] | None = None  # what fixes the bytes (states.hardware.kernel_record)
    dtype_reason: str | None = None


class StoreManifest(Artefact):
    created: str | None = None
    fingerprint: FingerprintFields
    settings: StoreSettings


class StoreShard(Record):
    name: str
    sha256: str
    n_rows: Count


class StoreTrajectory(Record):
    traj_id: str
    instance_id: str
    shard: str
    row: Count
    n_spans: Count
    n_tokens: Count


class StoreIndex(Artefact):
    """The metadata of a store's ``index.parquet``: its shards and where each trajectory lies."""

    shards: list[StoreShard]
    trajectories: list[StoreTrajectory]


# ---------------------------------------------------------------------- bank
class BankSettings(Closed):
    layer: int
    normalize: str | None
    center: str | None
    channels: list[str]
    backend: str


class BankTrajectory(Closed):
    traj_id: str
    label: Label
    instance_id: str
    repo: str


class BankManifest(Artefact):
    fingerprint: FingerprintFields
    settings: BankSettings
    label_counts: dict[str, Count]
    state_counts: dict[str, dict[str, Count]]
    repos: list[str]
    trajectories: list[BankTrajectory]
    source: Record = Field(default_factory=Record)
    tensors: str
    tensors_sha256: str


# ---------------------------------------------------------------------- scorer
class ScorerSettings(Closed):
    lr: Finite
    weight_decay: Finite
    accumulation: Positive
    max_epochs: Positive
    val_frac: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]
    seed: int
    init: str
    patience: Positive | None
    train_loss: bool


class ScorerManifest(Artefact):
    settings: ScorerSettings
    fingerprint: FingerprintFields | None = None
    n_layers: Positive
    d_model: Positive
    layer_ids: list[int] | None = None
    best_epoch: Count
    train_pos_rate: Finite
    history: list[dict[str, float | None]]
    train_ids: list[str]
    val_ids: list[str]
    tensors: str
    tensors_sha256: str
    source: Record = Field(default_factory=Record)


# ---------------------------------------------------------------------- sifter
class ShiftReference(Closed):
    """The shift guard's reference (``deploy.shift.Reference``). Its threshold ``loo_quantile`` may be
    null only when no reference pool exists (``n_loo`` 0, a bank of one group): anything else would
    turn the guard off without a word."""

    agents: list[str] | None
    scaffolds: list[str] | None
    loo_quantile: float | None
    loo_median: float | None
    n_loo: Count
    quantile: Finite = 0.95
    kind: str = "instance"
    false_alarm: Finite | None = None
    pool_medians: list[Finite] | None = None

    @model_validator(mode="after")
    def _threshold(self) -> "ShiftReference":
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"field 'quantile' must lie between 0 and 1 (got {self.quantile!r})")
        for name in ("loo_quantile", "loo_median"):
            v = getattr(self, name)
            if self.n_loo > 0 and (v is None or not math.isfinite(v)):
                got = "null" if v is None else repr(v)
                raise ValueError(f"field {name!r} must be a finite number when n_loo is {self.n_loo} "
                                 f"(got {got}: the shift guard would be off)")
        return self


#: A share: a finite number in [0, 1].
Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class SifterSettings(Closed):
    """The filter settings a sifter was fitted with, with the ranges their options take (``filter``)."""

    channels: list[str]
    distance: str
    weighting: str
    branches: str
    fusion_weight: Share
    n_evidence: Count
    min_keep: Positive
    frac: Share
    seed: int


class SifterConfig(Closed):
    method: str
    settings: SifterSettings
    scorer_epochs: Positive = 40
    method_info: Record | None = None
    choice: Record = Field(default_factory=Record)
    evidence: Record = Field(default_factory=Record)
    fitted: Record = Field(default_factory=Record)


class Seen(Closed):
    agents: list[str]
    scaffolds: list[str]
    repos: list[str]
    n_trajectories: Count
    n_instances: Count
    label_counts: dict[str, Count]
    instances: dict[str, str] | None = None


class Parts(Closed):
    bank: str
    scorer: str


class SifterParts(Closed):
    """A sifter's saved parts (folders; None: the method has none, e.g. a free rule has no bank)."""

    bank: str | None = None
    scorer: str | None = None
    probe: str | None = None


class LibraryEntry(Closed):
    name: str
    agents: list[str]
    scaffolds: list[str]
    n_trajectories: Count
    label_counts: dict[str, Count] = Field(default_factory=dict)
    shift_reference: ShiftReference
    parts: Parts


class SifterManifest(Artefact):
    fingerprint: FingerprintFields | None
    config: SifterConfig
    seen: Seen
    shift_reference: ShiftReference | None
    parts: SifterParts = Field(default_factory=lambda: SifterParts(bank="bank", scorer="scorer"))
    library: list[LibraryEntry] = Field(default_factory=list)
    library_skipped: list[Record] = Field(default_factory=list)


# ---------------------------------------------------------------------- run folders and verifier results
class RunManifest(Record):
    """A ``reproduce`` / ``crossval`` run folder's ``manifest.json`` (its settings are checked by the
    command's settings class)."""

    command: str
    settings: dict[str, Any]
    format: int | None = None


class VerifierManifest(Record):
    """The ``manifest.json`` of a score input folder: verifier results, a filter's scores (also written
    by hand: ``{"kind": "filter"|"ef", "name": ...}``; other entries are kept as written)."""

    kind: str | None = None
    name: str | None = None


class SiteManifest(Record):
    """The explorer's list of the files it wrote into its folder (it deletes only those on a rerun)."""

    files: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------- saved operating point
class KeepParams(Closed):
    """The recall-targeted keep rule's constructor settings (``RecallKeep``, ``ConfidentRecallKeep``)."""

    target_recall: Finite
    min_keep: Positive
    calibration: str
    seed: int
    confidence: Finite | None = None


class CalibrationFields(Closed):
    """A calibration map (``sift.calibration.CalibrationMap``): its parameters ``x`` / ``y``, one ``y`` per ``x``."""

    method: str
    x: Annotated[list[Finite], Field(min_length=1)]
    y: Annotated[list[Finite], Field(min_length=1)]
    n: Count
    n_pos: Count

    @model_validator(mode="after")
    def _paired(self) -> "CalibrationFields":
        if len(self.x) != len(self.y):
            raise ValueError(f"field 'y' must hold one value per value of 'x' (got {len(self.y)} for {len(self.x)})")
        if self.n_pos > self.n:
            raise ValueError(f"field 'n_pos' ({self.n_pos}) cannot exceed 'n' ({self.n})")
        return self


#: What a fitted threshold means: null for the first two (an infinite threshold), a number for the last.
THRESHOLD_MEANINGS = ("keep all", "keep min_keep only", "keep score >= threshold")


class FittedKeep(Record):
    """What the rule fitted (``RecallKeep.to_dict``): the load rebuilds the rule from these (a threshold is
    null exactly when its meaning says it is infinite; its probability is null with it)."""

    threshold: Finite | None
    threshold_meaning: str
    p_threshold: Finite | None
    n_calibration_pools: Count
    n_lost_allowed: Count
    calibration: CalibrationFields

    @model_validator(mode="after")
    def _consistent(self) -> "FittedKeep":
        if self.threshold_meaning not in THRESHOLD_MEANINGS:
            raise ValueError(f"field 'threshold_meaning' must be one of {', '.join(THRESHOLD_MEANINGS)} "
                             f"(got {self.threshold_meaning!r})")
        finite = self.threshold_meaning == THRESHOLD_MEANINGS[-1]
        if (self.threshold is not None) != finite:
            raise ValueError(f"field 'threshold' must be {'a number' if finite else 'null'} when "
                             f"'threshold_meaning' is {self.threshold_meaning!r} (got "
                             f"{'null' if self.threshold is None else self.threshold!r})")
        if (self.p_threshold is not None) != finite:
            raise ValueError(f"field 'p_threshold' must be {'a number' if finite else 'null'} with that threshold")
        if self.n_lost_allowed > self.n_calibration_pools:
            raise ValueError(f"field 'n_lost_allowed' ({self.n_lost_allowed}) cannot exceed 'n_calibration_pools' "
                             f"({self.n_calibration_pools})")
        return self


class OperatingPointCalibration(Record):
    """How the calibration pools were scored (kept as written), and their sizes: [smallest K, largest K]
    (a pool to filter outside that range is not guaranteed; absent in files written before it was recorded)."""

    pool_sizes: Annotated[list[Positive], Field(min_length=2, max_length=2)] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> "OperatingPointCalibration":
        if self.pool_sizes is not None and self.pool_sizes[0] > self.pool_sizes[1]:
            raise ValueError(f"field 'pool_sizes' must be [smallest K, largest K] (got {self.pool_sizes})")
        return self


class OperatingPointSifter(Closed):
    path: str
    sifter_json_sha256: str


class OperatingPointManifest(Artefact):
    """``SIFTER/operating_point.json`` (``latentsift.deploy.operating_file``)."""

    rule: FittedKeep
    params: KeepParams
    calibration_pools: OperatingPointCalibration
    calibration_fingerprint: str
    calibration_instances: Annotated[list[str], Field(min_length=1)]   # filter refuses pools among them
    not_guaranteed: list[str]
    sifter: OperatingPointSifter


# ---------------------------------------------------------------------- rollout folder
class RolloutSettingsFields(Closed):
    """``rollout.agent.RolloutSettings`` as saved (every field: a resume compares them all)."""

    k: Positive
    max_turns: Positive
    seed: Count
    temperature: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)]
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
    max_new_tokens: Positive
    system_prompt: str
    user_template: str
    feedback_template: str
    no_code_message: str


class RolloutManifest(Artefact):
    """A rollout folder's ``manifest.json`` (``latentsift.rollout.folder``); ``task_digests``: the content
    digest of every task begun (absent in folders written before it was recorded); ``decode_layout``: the
    weights' layout while sampling (``latentsift.states.decode.DECODE_LAYOUTS``; absent in folders made
    before it was recorded, which ran in the stored layout)."""

    model: str
    fingerprint: FingerprintFields
    settings: RolloutSettingsFields
    run: str
    agent: str
    threads: Positive
    tasks: str
    decode_layout: Literal["out-in", "in-out", "mkl-packed"] | None = None
    task_digests: dict[str, str] = Field(default_factory=dict)


# ---------------------------------------------------------------------- the check
def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(err: Mapping[str, Any]) -> str:
    """One pydantic error as a phrase naming the field."""
    field, kind, got = _where(err["loc"]), err["type"], err.get("input")
    if not field and kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must hold a JSON object (got {type(got).__name__})"
    if kind == "missing":
        return f"field {field!r} is missing"
    if kind == "extra_forbidden":
        return f"unknown field {field!r}"
    if kind == "value_error":  # a model validator's own sentence (it names its field)
        msg = str(err["msg"]).removeprefix("Value error, ")  # "field 'x' must ..." of the model at ``field``
        return msg.replace("field '", f"field '{field}.", 1) if field else msg
    msg = str(err["msg"])
    msg = msg[0].lower() + msg[1:]
    msg = msg.replace("input should be", "must be")
    shown = "null" if got is None else repr(got)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"field {field!r}: {msg} (got {shown})"


def manifest_error(path: Any, problem: str, redo: str) -> LatentSiftError:
    """The one line every manifest problem is told in."""
    return LatentSiftError(f"{path}: {problem}; the file was edited or damaged: restore it or {redo}.")


@contextlib.contextmanager
def manifest_values(path: Any, field: str, redo: str) -> Iterator[None]:
    """``with manifest_values(p, "settings", redo): Bank(**settings)``: a value the schema let through
    but the object refuses (a channel name, a distance) is told as a problem of the file ``p``."""
    try:
        yield
    except LatentSiftError as e:
        raise manifest_error(path, f"field {field!r}: {str(e).rstrip('.')}", redo) from None


def check_manifest(data: Any, schema: type[BaseModel], path: Any, redo: str) -> Any:
    """Validate the parsed manifest ``data`` (read from ``path``) against ``schema``; returns ``data``
    unchanged. Any problem: a ``LatentSiftError`` of one line naming the file, the first field at
    fault and how many more there are, and ``redo`` (how to make the artefact again)."""
    try:
        schema.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise manifest_error(path, f"{_problem(errors[0])}{more}", redo) from None
    return data
