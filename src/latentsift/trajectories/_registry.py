"""Trajectory importers: one module per format, one registration each (in the package's one registry,
``latentsift._core.registry``, kind "importer"; plugins of ``LATENTSIFT_PLUGINS`` and the entry points
register the same way).

``@register_importer(name, detect=..., missing=..., describe=...)`` on the module's ``read(obj,
where, src)`` (one record -> a ``Trajectory``) adds a format: ``latentsift import --format NAME``
and its help, auto-detection (registered formats are tried in ``priority`` order, the first whose
``detect`` accepts the record reads it) and the error messages all read this registry. ``accepts``
says whether a record has the format's shape when the format is forced (default: ``detect``);
``missing`` is the (field, reason) of the error for a forced format's record without that shape.

What becomes the trajectory's agent (and so the shift guard's scaffold, ``shift.scaffold_of``) is
each importer's reading of the record; never the format's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .._core.registry import registry_add, registry_entries, registry_find
from .._core.validation import LatentSiftError


@dataclass(frozen=True)
class ImporterEntry:
    """One registered format (see the module docstring)."""

    name: str
    read: Callable[..., Any]
    detect: Callable[[Any], bool]
    accepts: Callable[[Any], bool]
    missing: tuple[str, str]
    describe: str
    priority: float


def register_importer(name: str, *, detect: Callable[[Any], bool], missing: tuple[str, str], describe: str,
                      accepts: Callable[[Any], bool] | None = None, priority: float = 100.0):
    """Decorator on a format's ``read(obj, where, src) -> Trajectory``: register it under ``name``."""
    if name == "auto" or not name.isidentifier() or not name.islower():
        raise LatentSiftError(f"The 'name' parameter of register_importer must be a lowercase word other than "
                              f"'auto'. Got {name!r} instead.")

    def register(read):
        old = registry_find("importer", name, plugins=False)
        if old is not None and old.obj.__qualname__ != read.__qualname__:
            raise LatentSiftError(f"register_importer: the format {name!r} is taken by {old.obj.__module__}.")
        return registry_add("importer", name, read, detect=detect, accepts=accepts or detect, missing=missing,
                            describe=describe, priority=priority)

    return register


def importers(*, plugins: bool = True) -> list[ImporterEntry]:
    """The registered formats in detection order (``plugins``: with the plugins' formats)."""
    entries = [ImporterEntry(e.name, e.obj, **e.info) for e in registry_entries("importer", plugins=plugins)]
    return sorted(entries, key=lambda e: e.priority)


def format_names(*, plugins: bool = True) -> tuple[str, ...]:
    """``auto`` and every registered format (``import --format``)."""
    return ("auto", *(e.name for e in importers(plugins=plugins)))


def described() -> str:
    """'an R2E-Gym, a SWE-agent ... or a canonical' for the 'unrecognised content' messages."""
    names = [e.describe for e in importers()]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)
