"""Reading inputs: files, folders, ``.gz`` files and ``.tar.gz`` archives, as named in-memory sources.

A ``Source`` is one file's bytes with a display name that says where it came from
(``run.tar.gz:run/x.traj`` for an archive member) and a ``group`` key (the folder it sits in, inside
its archive) so that a run-level report (``final_report.json``) is matched to the trajectories
beside it.
"""
from __future__ import annotations

import gzip
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from .._core.validation import LatentSiftError

# File names (after removing .gz) that are read; everything else in a folder or archive is listed
# as "not read" in the summary, never silently ignored.
TRAJ_SUFFIXES = (".jsonl", ".json", ".traj")


@dataclass
class Source:
    name: str       # display name used in every error message
    path: str       # path inside its container (POSIX), used to derive run / instance names
    group: str      # container + folder: files with the same group belong to the same run
    data: bytes
    # what the importer inferred from this file's name or folders, and from where ("instance_id" ->
    # "the file name"); the import summary says it
    inferred: dict[str, str] = field(default_factory=dict)

    @property
    def basename(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def folder(self) -> str:
        """Name of the folder holding the file ('' at the top of an archive)."""
        return PurePosixPath(self.path).parent.name

    def text(self) -> str:
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise LatentSiftError(f"{self.name}: not UTF-8 text (byte {e.start}).") from None


def _strip_gz(name: str) -> str:
    return name[:-3] if name.endswith(".gz") and not name.endswith(".tar.gz") else name


def is_archive(name: str) -> bool:
    return name.endswith((".tar.gz", ".tgz", ".tar"))


def iter_sources(paths: list[str | Path], skipped_files: list[tuple[str, str]]) -> Iterator[Source]:
    """Yield every readable file under ``paths`` (sorted within folders and archives).

    Files that are neither trajectories nor label reports go to ``skipped_files`` with a reason.
    """
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise LatentSiftError(f"The input {str(p)!r} does not exist.")
        if p.is_dir():
            for f in sorted(x for x in p.rglob("*") if x.is_file()):
                yield from _file_sources(f, f.relative_to(p.parent).as_posix(), skipped_files)
        else:
            yield from _file_sources(p, f"{p.resolve().parent.name}/{p.name}", skipped_files)


def _file_sources(f: Path, rel: str, skipped_files: list[tuple[str, str]]) -> Iterator[Source]:
    name = f.name
    if is_archive(name):
        yield from _tar_sources(f, skipped_files)
        return
    inner = _strip_gz(name)
    if not _wanted(inner):
        skipped_files.append((str(f), "not a trajectory or label file (by name)"))
        return
    data = f.read_bytes()
    if name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise LatentSiftError(f"{f}: not a valid gzip file ({e or type(e).__name__}).") from None
    rel_inner = _strip_gz(rel)
    yield Source(name=str(f), path=rel_inner, group=str(f.parent.resolve()), data=data)


def _wanted(name: str) -> bool:
    return name.endswith(TRAJ_SUFFIXES) or name.endswith(".csv")


def _tar_sources(f: Path, skipped_files: list[tuple[str, str]]) -> Iterator[Source]:
    try:
        tf = tarfile.open(f, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise LatentSiftError(f"{f}: not a readable tar archive ({e}).") from None
    broken = (tarfile.TarError, OSError, EOFError, zlib.error)
    with tf:
        try:
            members = sorted((m for m in tf.getmembers() if m.isfile()), key=lambda m: m.name)
        except broken as e:
            raise LatentSiftError(f"{f}: the archive is truncated or corrupt ({e or type(e).__name__}); "
                                  "re-create or re-download it.") from None
        for m in members:
            inner = _strip_gz(m.name)
            if not _wanted(inner):
                skipped_files.append((f"{f}:{m.name}", "not a trajectory or label file (by name)"))
                continue
            try:
                fh = tf.extractfile(m)
                data = fh.read() if fh is not None else b""
                if m.name.endswith(".gz"):
                    data = gzip.decompress(data)
            except broken as e:
                raise LatentSiftError(f"{f}: member {m.name!r} is truncated or corrupt ({e or type(e).__name__}); "
                                      "re-create or re-download the archive.") from None
            parent = str(PurePosixPath(m.name).parent).lstrip(".")
            yield Source(name=f"{f}:{m.name}", path=inner, group=f"{f.resolve()}:{parent}", data=data)


def names_of(src: Source, obj: Any) -> tuple[str, str]:
    """(instance_id, run) of a one-trajectory file: from the record, else inferred from the file's own
    name (``<instance_id>.traj``, ``<instance_id>.traj.json``) and the folder holding the run; what is
    inferred is noted in ``src.inferred``.

    The file's own name wins over any folder name, however much a folder looks like an instance id;
    only OpenHands' completion logs (``llm_completions/<instance_id>/<model>-<time>.json``) take the
    instance from their folder.
    """
    rec = obj if isinstance(obj, dict) else {}
    iid = None
    for holder in (rec, rec.get("metadata"), rec.get("instance"), rec.get("info")):
        if isinstance(holder, dict) and isinstance(holder.get("instance_id"), str):
            iid = holder["instance_id"]
            break
    base = src.basename
    stem = base
    for suf in (".traj.json", ".traj", ".json", ".jsonl"):
        if stem.endswith(suf):
            stem = stem[: -len(suf)]
            break
    parents = PurePosixPath(src.path).parent.parts
    if iid is None:
        if len(parents) >= 2 and parents[-2] == "llm_completions":
            iid = parents[-1]
            src.inferred["instance_id"] = "its llm_completions/<instance_id>/ folder"
        else:
            iid = stem
            src.inferred["instance_id"] = "the file name"
    run = rec.get("run") if isinstance(rec.get("run"), str) else None
    if run is None:
        folders = [p for p in parents if p not in (iid, "llm_completions")]
        run = folders[-1] if folders else Path(src.group.split(":")[0]).name
        src.inferred["run"] = "the folder name"
    return iid, run
