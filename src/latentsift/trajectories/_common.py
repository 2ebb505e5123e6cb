"""Strict field access and the error that names file, line and field."""
from __future__ import annotations

import math
import re
from typing import Any

from .._core.validation import LatentSiftError



class RecordError(LatentSiftError):
    """One record (file or JSONL line) could not be imported."""

    def __init__(self, source: str, line: int | None, field: str | None, reason: str):
        self.source, self.line, self.field, self.reason = source, line, field, reason
        where = source if line is None else f"{source}:{line}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {reason}")


class Where:
    """Where a record lives, to raise ``RecordError`` with file, line and field."""

    def __init__(self, source: str, line: int | None = None):
        self.source, self.line = source, line

    def error(self, field: str | None, reason: str) -> RecordError:
        return RecordError(self.source, self.line, field, reason)

    def get(self, d: Any, key: str, typ: type | tuple[type, ...], *, prefix: str = "",
            optional: bool = False, default: Any = None) -> Any:
        """``d[key]`` checked to be of ``typ``; ``prefix`` names the enclosing object in errors."""
        name = f"{prefix}{key}"
        if not isinstance(d, dict):
            raise self.error(prefix.rstrip(".") or None, f"must be a JSON object, got {type(d).__name__}")
        if key not in d or (optional and d[key] is None):
            if optional:
                return default
            raise self.error(name, "is missing")
        v = d[key]
        if isinstance(v, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
            raise self.error(name, f"must be {_tname(typ)}, got a boolean")
        if not isinstance(v, typ):
            raise self.error(name, f"must be {_tname(typ)}, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise self.error(name, f"must be a finite number, got {v}")
        return v


def _tname(typ) -> str:
    names = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object",
             bool: "a boolean"}
    if isinstance(typ, tuple):
        return " or ".join(names.get(t, t.__name__) for t in typ)
    return names.get(typ, typ.__name__)


_SWEBENCH_ID = re.compile(r"^([\w.-]+)__([\w.-]+)-(\d+)$")


def repo_from_instance(instance_id: str) -> str:
    """The repository a SWE-bench id names (``owner__repo-NUMBER``: ``django__django-11099`` ->
    ``django/django``); "" for any other id (never a repository made up from an id of another form)."""
    m = _SWEBENCH_ID.match(instance_id)
    return f"{m.group(1)}/{m.group(2)}" if m else ""
