"""The one registry of the package's extension points (in the manner of inspect_ai's ``registry_add`` /
``registry_lookup``).

Every extension point is a *kind* (``KINDS``): Stage-1 filters, trajectory importers, extraction and
verifier backends, kNN backends and approximate index kinds, prune policies, keep rules,
calibration methods, span renderers, and for the policy's own rollouts the pinned policies, the
sandboxes and the task sources. An extension is one object registered under a name of its kind,
with keyword facts about it (``info``), by the one module that defines it::

    from latentsift._core.registry import registry_add
    registry_add("keep_rule", "top-two", TopTwoKeep, label="the two best")

Modules outside the package register when they are imported: those named in the environment
variable ``LATENTSIFT_PLUGINS`` (comma-separated module names) and those of the entry-point group
``latentsift.plugins`` (and, for filters, the older group ``latentsift.filters``). They are imported
on the first listing of a kind and whenever a lookup misses, so a plugin's extensions show
everywhere, the command line included. A plugin that fails to import (any exception) is one warning
line naming it; the rest works without its extensions.
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from .validation import LatentSiftError

#: The extension points.
KINDS = ("filter", "importer", "extraction_backend", "verifier_backend", "knn_backend", "index_kind",
         "prune_policy", "keep_rule", "calibration", "renderer", "policy", "sandbox", "task_source")
#: Environment variable naming modules to import for their registrations (comma-separated).
PLUGINS_ENV = "LATENTSIFT_PLUGINS"
#: Entry-point groups of installed packages that register extensions.
ENTRY_POINT_GROUPS = ("latentsift.plugins", "latentsift.filters")


@dataclass(frozen=True)
class Entry:
    """One registered extension: its ``kind``, ``name``, the registered ``obj`` and the facts ``info``."""

    kind: str
    name: str
    obj: Any
    info: dict = field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:  # ``entry.label`` reads ``info["label"]``
        info = self.__dict__.get("info", {})
        if key in info:
            return info[key]
        raise AttributeError(key)


_REGISTRY: dict[str, dict[str, Entry]] = {k: {} for k in KINDS}
#: (kind, name) -> the module that registered an object which is neither a class nor a function (a policy pin):
#: whether it is built in is told by the registering module, not by the object's class.
_REGISTERED_BY: dict[tuple[str, str], str] = {}
_loaded = False


def _check_kind(kind: str, owner: str) -> None:
    if kind not in _REGISTRY:
        raise LatentSiftError(f"The 'kind' parameter of {owner} must be one of {', '.join(KINDS)}. Got {kind!r} instead.")


def _same(a: Any, b: Any) -> bool:
    """The same object, or the same definition imported twice (a module run as a script and imported)."""
    return a is b or (getattr(a, "__qualname__", None) is not None
                      and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
                      and getattr(a, "__module__", None) == getattr(b, "__module__", None))


def registry_add(kind: str, name: str, obj: Any, /, **info: Any) -> Any:
    """Register ``obj`` under ``name`` in ``kind``; returns ``obj`` (so it can end a decorator).

    A name is taken once: registering another object under it is refused (the same one again is a no-op).
    """
    _check_kind(kind, "registry_add")
    if not isinstance(name, str) or not name:
        raise LatentSiftError(f"The 'name' parameter of registry_add must be a non-empty string. Got {name!r} instead.")
    old = _REGISTRY[kind].get(name)
    if old is not None and not _same(old.obj, obj):
        raise LatentSiftError(f"registry_add: the {kind} name {name!r} is taken by "
                              f"{getattr(old.obj, '__module__', '?')}.{getattr(old.obj, '__qualname__', old.obj)!s}.")
    _REGISTRY[kind][name] = Entry(kind, name, obj, dict(info))
    if not isinstance(obj, type) and not hasattr(obj, "__code__") and not hasattr(obj, "func"):
        _REGISTERED_BY[(kind, name)] = sys._getframe(1).f_globals.get("__name__", "")
    return obj


def registry_remove(kind: str, name: str) -> None:
    """Remove a registered extension (a plugin's, e.g. at the end of a test); the package's own stay."""
    _check_kind(kind, "registry_remove")
    e = _REGISTRY[kind].get(name)
    if e is None:
        raise LatentSiftError(f"registry_remove: no {kind} {name!r} is registered.")
    home = _REGISTERED_BY.get((kind, name), str(getattr(e.obj, "__module__", "")))
    if home.startswith("latentsift."):
        raise LatentSiftError(f"registry_remove: {name!r} is a built-in {kind}.")
    del _REGISTRY[kind][name]
    _REGISTERED_BY.pop((kind, name), None)


def load_plugins(*, force: bool = False) -> None:
    """Import the modules of ``LATENTSIFT_PLUGINS`` and of the entry points (once, unless ``force``)."""
    global _loaded
    if _loaded and not force:
        return
    _loaded = True
    for m in (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",")):
        if m:
            _import_plugin(f"{m!r} (named in {PLUGINS_ENV})", lambda m=m: importlib.import_module(m))
    for group in ENTRY_POINT_GROUPS:
        for ep in entry_points(group=group):
            dist = f" of the package {ep.dist.name}" if ep.dist is not None else ""
            _import_plugin(f"{ep.name!r} ({ep.value}, entry point{dist})", ep.load)


def _import_plugin(label: str, load) -> None:
    """``load()`` a plugin; when it raises anything (a missing module, an error of its own, a ``sys.exit``),
    one warning line naming it on stderr: its extensions are missing, and the package's own commands, and the
    other plugins', keep working. A command given one of its names refuses that name in one line."""
    try:
        load()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a plugin's failure is its own
        what = (str(e).strip().splitlines() or [""])[0]
        print(f"warning: the plugin {label} failed to import ({type(e).__name__}{': ' if what else ''}{what}); "
              "its extensions are not available.", file=sys.stderr)


def registry_entries(kind: str, *, plugins: bool = True) -> list[Entry]:
    """The entries of ``kind`` in registration order (plugins loaded first unless ``plugins`` is False:
    a module-level listing while the package itself is being imported)."""
    _check_kind(kind, "registry_entries")
    if plugins:
        load_plugins()
    return list(_REGISTRY[kind].values())


def registry_names(kind: str, *, plugins: bool = True) -> tuple[str, ...]:
    """The registered names of ``kind``."""
    return tuple(e.name for e in registry_entries(kind, plugins=plugins))


def registry_find(kind: str, name: str, *, plugins: bool = True) -> Entry | None:
    """The entry of ``name`` in ``kind``, or None (plugins are loaded on a miss unless ``plugins`` is False:
    a registration's own checks, which run while modules are being imported)."""
    _check_kind(kind, "registry_find")
    e = _REGISTRY[kind].get(name)
    if e is None and plugins:
        load_plugins()
        e = _REGISTRY[kind].get(name)
    return e


def registry_lookup(kind: str, name: str) -> Any:
    """The object registered under ``name`` in ``kind`` (plugins are loaded on a miss); a one-line
    refusal naming the registered ones otherwise."""
    e = registry_find(kind, name)
    if e is None:
        raise LatentSiftError(f"Unknown {kind.replace('_', ' ')} {name!r}; registered: "
                              f"{', '.join(registry_names(kind)) or 'none'}.")
    return e.obj
