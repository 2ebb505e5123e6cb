"""File input and output shared by every stage: atomic writes, strict JSON reading, saved artefacts.

Atomic writes: write a temporary file beside the target, then rename. A reader never sees a
half-written file, and a kill leaves either the old or the new version. The temporary name carries
the process and thread ids, so concurrent writers (the verifier's thread pool) never share one.

Whole folders: ``replaced_folder`` writes a folder into a temporary sibling and swaps it in, so a
kill never leaves a half-replaced bank or sifter. Writers: ``WriterLock`` / ``output_lock`` refuse a
second process that would write the same output at the same time.

Saved artefacts (bank, scorer, sifter, state store) are folders with one JSON manifest written last
(its presence = complete): ``write_artefact`` / ``read_artefact`` write and check its format,
version and the sha256 of every file it names. ``jsonable`` turns numpy values into JSON ones.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import math
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from .manifests import check_manifest
from .validation import PACKAGE, LatentSiftError

#: Environment variable: the folder of LatentSift's caches (default ``$XDG_CACHE_HOME/latentsift``,
#: else ``~/.cache/latentsift``); ``off`` disables them.
CACHE_ENV = "LATENTSIFT_CACHE"


def cache_root() -> Path | None:
    """The folder of LatentSift's caches (:data:`CACHE_ENV`), or None when it is ``off``."""
    root = os.environ.get(CACHE_ENV)
    if root == "off":
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), PACKAGE)
    return Path(root)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """``with atomic_path(p) as tmp: write tmp``: renamed to ``p`` on success; on any error (a full
    disk, a kill by an exception) the temporary file is removed, so no ``*.tmp*`` is left behind.
    ``suffix`` ends the temporary name (e.g. ".png" for writers that pick the format from it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.{threading.get_ident()}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):  # (on a read-only file system even this fails)
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and (e.filename is None or Path(e.filename) == tmp):  # the file asked for
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = True) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: str | os.PathLike, text: str, *, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, sort_keys: bool = False,
                      fsync: bool = True) -> None:
    """JSON (UTF-8, trailing newline) written atomically; ``default=str`` for paths and the like."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False,
                                       default=str) + "\n", fsync=fsync)


def member(folder: str | os.PathLike, name: Any, manifest: str | os.PathLike) -> Path:
    """``folder / name`` for a file a saved artefact's ``manifest`` names: refused (with the reason)
    unless it is a relative path that stays inside ``folder`` (symbolic links resolved), so a
    manifest never makes a load read anything outside its own folder."""
    folder = Path(folder)
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise LatentSiftError(f"{manifest}: refused the file name {name!r}: an artefact reads only files inside "
                              f"its own folder {folder} (a relative name without '..').")
    path = folder / name
    if not path.resolve().is_relative_to(folder.resolve()):
        raise LatentSiftError(f"{manifest}: refused {name!r}: it resolves outside the folder {folder} "
                              "(a symbolic link); an artefact reads only files inside its own folder.")
    return path


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file strictly; a syntax error names the file (as a ``LatentSiftError``)."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LatentSiftError(f"{p}: not valid JSON ({e.msg}).") from None
    except UnicodeDecodeError as e:
        raise LatentSiftError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}).") from None


def iter_jsonl(path: str | os.PathLike, *, opener=None):
    """Yield ``(where, record)`` for every non-blank line of a JSONL file, ``where`` = "path:line".

    Strict: a line that is not JSON stops with an error naming the file and line (nothing is skipped
    silently). ``opener(path)`` returns a text file object (default: ``open`` in UTF-8).
    """
    p = Path(path)
    with (opener(p) if opener else open(p, encoding="utf-8")) as f:
        lineno, lines = 0, iter(f)
        while True:
            try:
                line = next(lines)
            except StopIteration:
                break
            except UnicodeDecodeError as e:
                raise LatentSiftError(f"{p}:{lineno + 1}: not UTF-8 text ({e.reason}).") from None
            except (EOFError, OSError) as e:  # a truncated .gz (OSError: a file that is not gzip)
                if isinstance(e, OSError) and e.errno is not None:
                    raise
                raise LatentSiftError(f"{p}: truncated or not a valid compressed file "
                                      f"({e or type(e).__name__}).") from None
            lineno += 1
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise LatentSiftError(f"{where}: not valid JSON ({e.msg}).") from None


@contextlib.contextmanager
def made_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Create ``folder`` (and missing parents) for a write; if the write fails, remove what this made.

    Only folders that did not exist before are removed (the topmost of them, with what the write put
    there), so a failed save (a full disk, an interrupt) leaves no empty or partial output behind and
    never touches anything that was there already.
    """
    folder = Path(folder)
    top = None
    for p in (folder, *folder.parents):
        if p.exists():
            break
        top = p
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _remove_stale_siblings(folder: Path) -> None:
    """Remove the temporary siblings (``.NAME.tmpPID.*`` / ``.NAME.oldPID.*``) that a killed
    ``replaced_folder`` of ``folder`` left behind (their process is gone)."""
    for kind in ("tmp", "old"):
        for p in folder.parent.glob(f".{folder.name}.{kind}*"):
            pid = p.name[len(folder.name) + 1 + 1 + len(kind):].split(".", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def replaced_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """``with replaced_folder(d) as tmp: write into tmp``: on success ``tmp`` takes the place of ``d``.

    ``tmp`` is a new sibling folder (made with the umask's permissions). An existing ``d`` stays
    whole until the write is complete: it is then renamed aside, ``tmp`` renamed to ``d`` and the old
    one removed. On any error the temporary folder is removed and ``d`` is untouched (missing
    parents this made are removed too); temporaries of a killed earlier write are removed first.
    """
    folder = Path(folder)
    with made_folder(folder.parent):
        _remove_stale_siblings(folder)
        tag = f"{os.getpid()}.{threading.get_ident()}"
        tmp = folder.with_name(f".{folder.name}.tmp{tag}")
        tmp.mkdir()
        try:
            yield tmp
            if folder.exists():
                old = folder.with_name(f".{folder.name}.old{tag}")
                os.replace(folder, old)
                try:
                    os.replace(tmp, folder)
                except BaseException:
                    os.replace(old, folder)
                    raise
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, folder)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError) and e.filename is not None and Path(e.filename).is_relative_to(tmp):
                # name the file the user asked for (a full disk, a read-only mount), not the temporary one
                raise type(e)(e.errno, e.strerror, str(folder / Path(e.filename).relative_to(tmp))) from None
            raise


class WriterLock:
    """An exclusive, non-blocking writer lock on the file ``path`` (``with WriterLock(p): ...``):
    a second process is refused at once with a one-line error naming ``what``. The kernel releases
    it when the process exits, also on a kill. ``remove``: delete the lock file on release (while
    still holding it; a process that opened the old file re-checks it and retries)."""

    def __init__(self, path: str | os.PathLike, *, what: str | os.PathLike | None = None, remove: bool = False):
        self.path, self.f = Path(path), None
        self.what, self.remove = Path(what) if what is not None else self.path.parent, remove

    def __enter__(self) -> "WriterLock":
        # the folders made here are removed on release if nothing else was written into them
        self.made = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            f = open(self.path, "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                self._remove_made()
                raise LatentSiftError(f"Another process is writing to {self.what}; wait for it to finish.") from None
            try:  # the file may have been removed by the holder that just released it
                same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.f = f
                return self
            f.close()

    def __exit__(self, *exc) -> None:
        if self.remove:
            with contextlib.suppress(OSError):
                self.path.unlink()
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
        if self.remove:
            self._remove_made()

    def _remove_made(self) -> None:
        for p in self.made:  # innermost first; stops at the first folder that holds something
            try:
                p.rmdir()
            except OSError:
                break


@contextlib.contextmanager
def no_writer(path: str | os.PathLike, *, what: str | os.PathLike, doing: str):
    """Read ``what`` only while no process holds its :class:`WriterLock` at ``path`` (a shared lock
    held meanwhile, so that no writer starts either); one line if a writer holds it. Nothing is
    created: a folder without a lock file has no writer."""
    try:
        f = open(path)
    except FileNotFoundError:
        yield
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LatentSiftError(f"{what} is still being written by another process (a running rollout?); "
                                  f"{doing} now would hold only what it has finished: wait for it to end, "
                                  "or stop it first.") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def output_lock(out: str | os.PathLike) -> WriterLock:
    """The writer lock of a command's output ``out`` (a file or a folder that is replaced whole):
    the hidden file ``.NAME.lock`` beside it, removed on release."""
    out = Path(out)
    return WriterLock(out.with_name(f".{out.name}.lock"), what=out, remove=True)


# ---------------------------------------------------------------------- JSON values
def jsonable(x: Any, *, finite: bool = False) -> Any:
    """``x`` with numpy scalars as Python ones, tuples as lists and dict keys as strings, for ``json``.

    NaN becomes ``None``; with ``finite=True`` so do +-inf (JSON has no infinity: the evaluation
    tables), else inf stays a float and ``json`` writes ``Infinity`` (filter results, sifter
    manifests: a distance to an empty bank side is infinite).
    """
    if isinstance(x, dict):
        return {k if isinstance(k, str) else str(k): jsonable(v, finite=finite) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v, finite=finite) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return None if math.isnan(v) or (finite and math.isinf(v)) else v
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


# ---------------------------------------------------------------------- saved artefacts
def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ArtefactKind:
    """What a saved artefact folder is, and how its errors name it.

    ``format``/``version``: written into the manifest (``versions`` are the ones a load accepts,
    default the written one); ``manifest``: the manifest's file name; ``noun``: "a bank directory";
    ``make``: how to make one ("build one with 'latentsift bank build'"); ``redo``: what to do when a
    file does not match its checksum or the manifest its schema ("rebuild the bank"); ``schema``: the
    manifest's schema (``_core.manifests``), checked on every read.
    """

    format: str
    version: int
    manifest: str
    noun: str
    make: str
    redo: str
    versions: tuple[int, ...] = ()
    schema: Any = None

    @property
    def accepted(self) -> tuple[int, ...]:
        return self.versions or (self.version,)


def write_artefact(folder: str | os.PathLike, kind: ArtefactKind, manifest: Mapping[str, Any],
                   files: Mapping[str, tuple[str, bytes]] | None = None) -> dict:
    """Write an artefact folder: ``files`` (role -> (file name, bytes)) atomically, then the manifest
    ``{"format": ..., "version": ..., **manifest}`` with, per role, the file name under ``role``
    (unless ``manifest`` places it) and the bytes' sha256 under ``role + "_sha256"``.

    The old manifest is removed first, so it never vouches for new files; a kill leaves no manifest
    or the new one. ``manifest`` may hold ``format`` and ``version`` already (they must be the
    kind's). Returns the manifest written.
    """
    folder = Path(folder)
    if manifest.get("format", kind.format) != kind.format or manifest.get("version", kind.version) != kind.version:
        raise ValueError(f"write_artefact: a {kind.format} v{kind.version} manifest cannot say "
                         f"{manifest.get('format')!r} v{manifest.get('version')!r}")
    out = {"format": kind.format, "version": kind.version, **manifest}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / kind.manifest).unlink(missing_ok=True)
    for role, (name, data) in (files or {}).items():
        atomic_write_bytes(folder / name, data)
        out.setdefault(role, name)
        out[f"{role}_sha256"] = sha256_hex(data)
    atomic_write_json(folder / kind.manifest, out)
    return out


def read_artefact(folder: str | os.PathLike, kind: ArtefactKind,
                  files: Mapping[str, str] | None = None) -> tuple[dict, dict[str, bytes]]:
    """Read an artefact folder written by ``write_artefact``: (manifest, role -> bytes).

    Checks that the manifest exists, is JSON of the kind's format and an accepted version, matches the
    kind's schema (``_core.manifests.check_manifest``: one line naming the file and the field), and
    that every file of ``files`` (role -> default file name) lies inside the folder, exists and
    matches the sha256 the manifest records (``LatentSiftError`` naming the file).
    """
    folder = Path(folder)
    mpath = folder / kind.manifest
    if not mpath.is_file():
        raise LatentSiftError(f"{folder} is not {kind.noun} (no {kind.manifest}; {kind.make}).")
    man = read_json(mpath)
    if not isinstance(man, dict) or man.get("format") != kind.format or man.get("version") not in kind.accepted:
        got = (man.get("format"), man.get("version")) if isinstance(man, dict) else (type(man).__name__, None)
        raise LatentSiftError(f"{mpath}: not a {kind.format} v{kind.version} manifest "
                              f"(format={got[0]!r}, version={got[1]!r}).")
    if kind.schema is not None:
        check_manifest(man, kind.schema, mpath, kind.redo)
    blobs = {}
    for role, default in (files or {}).items():
        path = member(folder, man.get(role, default), mpath)
        if not path.is_file():
            raise LatentSiftError(f"{path} is missing: the {kind.noun.split(' ', 1)[1]} is incomplete "
                                  f"({kind.redo}).")
        data = path.read_bytes()
        if sha256_hex(data) != man.get(f"{role}_sha256"):
            raise LatentSiftError(f"{path} does not match {mpath} (checksum differs): {kind.redo}.")
        blobs[role] = data
    return man, blobs


def package_file(package: str, name: str, missing: str, distribution: str) -> Path:
    """The data file ``name`` inside the installed ``package``, found with ``importlib.util.find_spec``
    (the package is never imported). ``missing``: the error when the package is not installed;
    ``distribution``: its name on the package index, for the error when the file is not in it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LatentSiftError(missing)
    path = Path(list(spec.submodule_search_locations)[0]) / name
    if not path.is_file():
        raise LatentSiftError(f"The package {distribution} is installed but {path} is missing; reinstall it.")
    return path
