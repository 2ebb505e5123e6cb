"""Atomic file writes shared by every stage: write a temporary file beside the target, then rename.

A reader never sees a half-written file, and a kill leaves either the old or the new version. The
temporary name carries the process and thread ids, so concurrent writers (the verifier's thread
pool) never share one.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator


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
    from ._validation import LatentSiftError
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
    from ._validation import LatentSiftError
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
    from ._validation import LatentSiftError
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
