"""Outputs never destroy inputs: the check every writing command runs before any work.

``check_output(out, inputs, kind=...)`` refuses an output path that is, contains or lies inside one
of the command's inputs, and one that is or lies inside a saved artefact of another kind (state
store, bank, scorer, sifter, verifier results, run folder, report, explorer site), recognised by its
manifest or format files (``artefact_kind``). An output of the command's own kind may exist: it is
resumed or replaced as the command documents. Anything else that exists at the output is refused: a
non-empty folder that is not of the command's kind, and a file that is not the command's own earlier
output (``file_kind``: recognised by its first bytes; an empty file holds nothing to lose).

``owned_output(out, inputs, kind=...)`` is the one way a command takes its output: that check, then the
writer lock beside the output (a second writer to the same output is refused at once), held while the
command works; it yields an ``OwnedOutput`` whose files are written atomically.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from .io import atomic_write_json, atomic_write_text, output_lock
from .validation import PACKAGE, LatentSiftError

#: The explorer's list of the files it wrote (it deletes only those on a rerun).
SITE_MANIFEST = ".latentsift-site.json"

#: Readable names of the artefact kinds.
KIND_NAMES = {"store": "a state store", "bank": "a bank", "scorer": "a scorer", "sifter": "a sifter",
              "verifier": "verifier results", "run": "a run folder", "report": "a report folder",
              "site": "an explorer site", "rollout": "a rollout folder",
              "rollout-dataset": "a rollout dataset", "premise": "a premise run folder"}
#: The run folder a premise run writes first, inside its own folder (``latentsift premise``: OUT/own).
PREMISE_OWN = "own"


#: The single files the commands write: kind -> (how the file begins, readable name).
FILE_KINDS = {"pools": (re.compile(r'\{"traj_id":'), "canonical trajectories ('latentsift import')"),
              "filter": (re.compile(r'\{\s*"format":\s*"latentsift-filter"'), "filter results ('latentsift filter')"),
              "import-summary": (re.compile(r'\{\s*"n_trajectories":'), "an import summary ('--summary-json')")}


def file_kind(path: str | os.PathLike) -> str | None:
    """The kind of single output file ``path`` holds (see ``FILE_KINDS``; gzip read through), else ``None``."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(2)
        with (gzip.open(p, "rb") if head == b"\x1f\x8b" else open(p, "rb")) as f:
            text = f.read(256).decode("utf-8", errors="replace")
    except (OSError, EOFError):
        return None
    return next((k for k, (start, _) in FILE_KINDS.items() if start.match(text)), None)


def _manifest(path: Path) -> dict:
    try:
        data = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def artefact_kind(path: str | os.PathLike) -> str | None:
    """The kind of saved artefact the directory ``path`` holds (see ``KIND_NAMES``), else ``None``."""
    p = Path(path)
    if not p.is_dir():
        return None
    if (p / "sifter.json").is_file():
        return "sifter"
    if (p / "scorer.json").is_file() or (p / "scorer.safetensors").is_file():
        return "scorer"
    if (p / "bank.safetensors").is_file():
        return "bank"
    if artefact_kind(p / PREMISE_OWN) == "run":  # (its finished report is also summary.json + report.md)
        return "premise"
    if (p / "summary.json").is_file() and (p / "report.md").is_file():
        return "report"  # (reproduce also writes its explorer site there)
    if (p / SITE_MANIFEST).is_file():
        return "site"
    if (p / "manifest.json").is_file():
        man = _manifest(p)
        if man.get("format") == "latentsift-states" or (p / "index.parquet").is_file():
            return "store"
        if man.get("format") in ("latentsift-rollout", "latentsift-rollout-dataset"):
            return "rollout" if man["format"] == "latentsift-rollout" else "rollout-dataset"
        if man.get("kind") == "ef" or (p / "verdicts.jsonl").is_file():
            return "verifier"
        if str(man.get("command", "")).startswith(PACKAGE) or (p / "report").is_dir():
            return "run"
        return None
    if (p / "index.parquet").is_file():
        return "store"
    return None


def _resolved(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


def _inside(child: Path, parent: Path) -> bool:
    return child != parent and child.is_relative_to(parent)


def check_output(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *,
                 kind: str | None = None, file: str | None = None, option: str = "--out") -> Path:
    """Refuse ``out`` before any work when writing it could destroy an input, another artefact or a
    file or folder of the user's.

    ``inputs``: every path the command reads (``None`` entries are skipped). ``kind``: the artefact
    folder the command writes at ``out`` (an existing one of that kind may be resumed or replaced; an
    existing non-empty folder of another kind is refused). ``file``: the kind of single file it writes
    there (``FILE_KINDS``; an existing file is replaced only if it is one). Without ``file`` the command
    writes a folder: a file at ``out`` is refused. Returns the resolved path.
    """
    o = _resolved(out)
    flat = []
    for raw in inputs:  # an option given several times (fit/crossval: several pools files and stores) is a list
        flat.extend(raw if isinstance(raw, (list, tuple)) else [raw])
    for raw in flat:
        if raw is None:
            continue
        i = _resolved(raw)
        if o == i:
            raise LatentSiftError(f"{option} {out} is the input {raw}; writing it would destroy the input: "
                                  f"choose another {option}.")
        if _inside(i, o):
            raise LatentSiftError(f"{option} {out} contains the input {raw}; choose another {option}.")
        if _inside(o, i):
            raise LatentSiftError(f"{option} {out} lies inside the input {raw}; choose another {option}.")
    blocker = next((a for a in o.parents if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise LatentSiftError(f"{option} {out}: {blocker} is a file, not a folder, so nothing can be written "
                              f"inside it; choose another {option}.")
    for a in (o, *o.parents):
        found = artefact_kind(a)
        if found is None or (a == o and found == kind):
            continue
        where = "is" if a == o else f"lies inside {a}, which is"
        raise LatentSiftError(f"{option} {out} {where} {KIND_NAMES[found]}; writing there would damage it: "
                              f"choose another {option}.")
    if kind is not None and o.is_dir() and artefact_kind(o) != kind and any(o.iterdir()):
        raise LatentSiftError(f"{option} {out} is a non-empty folder that is not {KIND_NAMES[kind]}; its files "
                              f"could be replaced: choose a new or empty {option}.")
    existing = next(a for a in (o, *o.parents) if a.exists())
    if not os.access(existing if existing.is_dir() else existing.parent, os.W_OK):
        raise LatentSiftError(f"{option} {out}: {existing} is read-only (a read-only file system or no write "
                              f"permission); choose another {option}.")
    if o.exists() and file is None and not o.is_dir():  # a folder of some kind, or a folder without one (premise)
        raise LatentSiftError(f"{option} {out} is a file, but this command writes a folder there: "
                              f"choose another {option}.")
    if file is not None and o.is_dir():
        raise LatentSiftError(f"{option} {out} is a folder, but this command writes a file there: "
                              f"choose another {option}.")
    if file is not None and o.is_file() and o.stat().st_size and file_kind(o) != file:
        raise LatentSiftError(f"{option} {out} exists and is not {FILE_KINDS[file][1]} written by this command; "
                              f"replacing it would lose its contents: choose another {option} or remove the file.")
    return o


class OwnedOutput:
    """A command's output while the command holds it (``owned_output``): ``path`` (resolved), and the atomic
    writes of the files the command writes itself (``name``: a file inside the output folder; None: the
    output file itself). A reader never sees a half-written file; a kill leaves the old or the new one."""

    def __init__(self, path: Path):
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)

    def file(self, name: str | None = None) -> Path:
        return self.path if name is None else self.path / name

    def write_text(self, text: str, name: str | None = None) -> Path:
        atomic_write_text(self.file(name), text)
        return self.file(name)

    def write_json(self, obj: Any, name: str | None = None, **kw: Any) -> Path:
        atomic_write_json(self.file(name), obj, **kw)
        return self.file(name)


@contextlib.contextmanager
def owned_output(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *,
                 kind: str | None = None, file: str | None = None, option: str = "--out",
                 lock: bool = True) -> Iterator[OwnedOutput]:
    """``with owned_output(out, inputs, kind=...) as o:``: the one way a command takes its output, before any work.

    ``check_output`` first (``out`` is not an input and holds no other artefact and nothing of the user's: at
    most the command's own earlier output of ``kind`` / ``file``), then the writer lock beside ``out``
    (``output_lock``: a second writer to the same output is refused at once with one line), held until the
    block ends; ``lock=False``: the caller already holds it (one lock over two things written together).
    Yields the ``OwnedOutput``; the command's own files are written through it (atomically), the library's
    artefacts by their atomic writers (``io.replaced_folder``, ``io.write_artefact``)."""
    o = check_output(out, inputs, kind=kind, file=file, option=option)
    with output_lock(out) if lock else contextlib.nullcontext():
        yield OwnedOutput(o)
