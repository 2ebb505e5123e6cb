"""The package's import graph, read from the source with ``ast`` (every import, also those inside
functions): no import circle, and in-package imports at module top (a function-local import hides a
circle until run time; only optional third-party extras such as ray, faiss or playwright are
imported lazily, inside the code that needs them)."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "latentsift"
ROOT = "latentsift"


def _modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package)."""
    out = {}
    for f in sorted(SRC.rglob("*.py")):
        parts = list(f.relative_to(SRC.parent).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (f, pkg)
    return out


MODULES = _modules()


def _owner(name: str) -> str:
    """The module itself if it is one, else the longest module prefix (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _in_function(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside a function body (run at call time, not at import time)."""
    inner: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner |= {id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return inner


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported in-package module, line, inside a function) for every import of module ``name``."""
    path, pkg = MODULES[name]
    tree = ast.parse(path.read_text(), filename=str(path))
    local = _in_function(tree)
    here = name.split(".") if pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for t in targets:
            if t != ROOT and not t.startswith(ROOT + "."):
                continue
            t = _owner(t)
            # importing a.b.c runs the package a.b first (not the root package, not one's own packages)
            chain = t.split(".")
            for i in range(2, len(chain) + 1):
                m = ".".join(chain[:i])
                if m in MODULES and m != name and not name.startswith(m + "."):
                    out.append((m, node.lineno, id(node) in local))
            if t == ROOT and name != ROOT:
                out.append((ROOT, node.lineno, id(node) in local))
    if name == f"{ROOT}.cli":   # the command line imports each command's module by name when it runs (cli.COMMANDS)
        from latentsift.cli import COMMANDS

        out += [(f"{ROOT}._cli.{module}", 0, False) for module, _ in COMMANDS.values()]
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _rel(name: str) -> str:
    path, _ = MODULES[name]
    return path.relative_to(SRC).as_posix()


def _local_imports() -> list[str]:
    return [f"{_rel(name)}:{line} imports {target} inside a function"
            for name in MODULES for target, line, local in _imports(name) if local]


def test_the_graph_is_read():
    edges = {name: {t for t, _, _ in _imports(name)} for name in MODULES}
    assert "latentsift.bank.bank" in edges["latentsift.sift.sift"]
    assert "latentsift.protocol.run" in edges["latentsift.protocol.reproduction"]


def test_no_import_circle():
    edges = {name: {t for t, _, _ in _imports(name)} for name in MODULES}
    assert _cycles(edges) == []


def test_in_package_imports_sit_at_module_top():
    assert _local_imports() == []


#: The subpackages bottom up: each module imports only from its own layer or a lower one (private
#: helpers at the bottom, the command line at the top). ``rollout`` (the own-policy wing) sits on ``states``
#: (it captures states while the policy samples); ``scale`` sits above ``states`` and ``bank`` (it
#: distributes their extraction and search); ``report`` reads results and knows no estimator.
LAYERS = ["_core", "trajectories", "states", "rollout", "bank", "scale", "sift", "cascade", "metrics", "deploy",
          "report", "protocol", "_jobs", "_cli", "cli"]


def _layer(name: str) -> int | None:
    """The layer of a module (None for the package root, which only re-exports)."""
    parts = name.split(".")
    return None if len(parts) == 1 else LAYERS.index(parts[1])


def test_the_top_level_is_the_layers():
    top = {p.stem for p in SRC.iterdir() if p.name != "__pycache__"}
    assert top == set(LAYERS) | {"__init__"}
    assert len(top) <= 16


def test_subpackages_form_layers_without_upward_imports():
    upward = [f"{_rel(name)}:{line} imports {target}" for name in MODULES if _layer(name) is not None
              for target, line, _ in _imports(name)
              if target != ROOT and _layer(target) > _layer(name)]
    assert upward == []


def _imported_names(name: str) -> list[tuple[str, str, int]]:
    """(in-package module, imported name, line) for every ``from X import name`` of module ``name``."""
    path, pkg = MODULES[name]
    here = name.split(".") if pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(ROOT)):
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            out += [(base, a.name, node.lineno) for a in node.names]
    return out


def test_no_private_name_crosses_subpackages():
    """A ``_name`` is imported only inside its own subpackage (a private module's public names may
    cross: ``_core`` is the shared private base)."""
    crossing = [f"{_rel(name)}:{line} imports {base}.{n}" for name in MODULES for base, n, line in _imported_names(name)
                if n.startswith("_") and base.split(".")[:2] != name.split(".")[:2]]
    assert crossing == []


def test_subpackages_export_all_and_hide_no_module():
    """Each subpackage lists its public names in ``__all__``, and none of them is also the name of one
    of its modules (``from .rules import rules`` would make ``latentsift.sift.rules`` the function)."""
    import importlib

    # older names kept: ``latentsift.crossval`` is the protocol's function, and the pruning verdict
    # predates the module ``protocol/verdict.py`` (``from latentsift.protocol.verdict import ...``
    # still reads the module)
    kept = {"latentsift.protocol.crossval", "latentsift.protocol.verdict"}
    for name, (_, pkg) in MODULES.items():
        if not pkg or name == ROOT:
            continue
        mod = importlib.import_module(name)
        assert isinstance(mod.__all__, list), name
        # the command groups register themselves; a command imports its own job module, never the package's
        assert mod.__all__ or name in (f"{ROOT}._cli", f"{ROOT}._jobs"), name
        for attr in mod.__all__:
            assert not attr.startswith("_") and hasattr(mod, attr), (name, attr)
            assert f"{name}.{attr}" not in MODULES or f"{name}.{attr}" in kept, (name, attr)


def test_the_command_line_holds_no_command_logic():
    """A ``_cli`` module parses options and prints: in the package it imports only the jobs (``_jobs``, one
    per command), ``_core`` and its own helpers; outside it, typer, rich and the standard library."""
    import sys

    allowed_pkg = ("latentsift._jobs", "latentsift._core", "latentsift._cli")
    wrong = []
    for name, (path, _) in MODULES.items():
        if not name.startswith("latentsift._cli"):
            continue
        wrong += [f"{_rel(name)}:{line} imports {t}" for t, line, _ in _imports(name)
                  if not t.startswith(allowed_pkg)]
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
            wrong += [f"{_rel(name)}:{node.lineno} imports {m}" for m in mods
                      if m.split(".")[0] not in ("typer", "rich", "__future__") and m.split(".")[0] != ROOT
                      and m.split(".")[0] not in sys.stdlib_module_names]
    assert wrong == []
