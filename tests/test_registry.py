"""The registry of Stage-1 filters: a filter is one module plus one registration, and everything that
lists filters reads the registry (the command line's help, the protocol, its tables and report)."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latentsift import LatentSiftError
from latentsift._core.registry import KINDS, registry_entries, registry_remove
from latentsift.cli import app
from latentsift.sift.rules import (REFERENCE, filter_entry, make_baseline, method_names, register_filter, rule_keys,
                                   rules, unregister_filter)
from latentsift.sift.sift import Stage1Filter

SRC = Path(__file__).resolve().parents[1] / "src"
PLUGIN = '''
import numpy as np
from latentsift.sift.rules import RuleFilter, register_filter


@register_filter("longest-patch", label="longest patch (plugin)")
class LongestPatchFilter(RuleFilter):
    """Prefer the longest final patch."""

    def _raw(self, cands, states):
        return np.array([float(len(c.patch or "")) for c in cands])
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A filter registered from a temporary module (imported as a user's plugin), removed after."""
    (tmp_path / "my_rules.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("my_rules")
    yield tmp_path
    unregister_filter("longest-patch")
    sys.modules.pop("my_rules", None)


def test_the_builtin_rules_and_their_keys():
    assert [e.name for e in rules()] == [filter_entry(k).name for k in rule_keys()[-1:] + rule_keys()[:-1]]
    assert method_names()[0] == "latentsift" and filter_entry("latentsift").kind == "state"
    assert REFERENCE in rule_keys() and filter_entry(REFERENCE).column == ("n_chars", -1.0)
    for e in rules():
        assert e.key == e.name.replace("-", "_") and make_baseline(e.key).name == e.name
    with pytest.raises(LatentSiftError, match="Unknown Stage-1 filter 'nope'"):
        make_baseline("nope")
    with pytest.raises(LatentSiftError, match="not a rule filter"):
        make_baseline("latentsift")
    with pytest.raises(LatentSiftError, match="lowercase words"):
        register_filter("Bad Name")
    with pytest.raises(LatentSiftError, match="taken by"):
        register_filter(rules()[0].name)(type("Other", (Stage1Filter,), {}))
    with pytest.raises(LatentSiftError, match="built-in"):
        unregister_filter(rules()[0].name)


def test_the_protocol_filters_are_registered_but_not_methods():
    """The ablations, the inner-CV default and the EF verifier are registered filters: the protocol builds the
    ablations from the registry, its tables group them, and none is a --method choice."""
    from latentsift.cascade.verifier import EF, EFVerifier
    from latentsift.protocol.stage1 import latentsift_variants
    from latentsift.protocol.tables import ablation_tables
    from latentsift.sift.ablations import BRANCH_DISTANCE, BRANCH_LEARNED
    from latentsift.sift.prune import STATE_POLICIES
    from latentsift.sift.rules import PAPER, filters
    from latentsift.sift.variants import DEFAULT
    ablations = filters("ablation")
    assert len(ablations) == 11 and list(latentsift_variants()) == [PAPER] + [e.key for e in ablations]
    assert latentsift_variants()[BRANCH_LEARNED] == {"branches": "learned"} and {BRANCH_DISTANCE, BRANCH_LEARNED} <= set(
        STATE_POLICIES)
    tables = ablation_tables([PAPER, DEFAULT, *(e.key for e in ablations)])
    assert sum(len(t["filters"]) - 1 for k, t in tables.items() if k != "variants") == len(ablations)
    assert tables["naive"]["labels"][BRANCH_DISTANCE] == filter_entry(BRANCH_DISTANCE).label == "distance branch only"
    assert filter_entry(EF).factory is EFVerifier and filter_entry(EF).kind == "verifier"
    assert filter_entry(DEFAULT).kind == "choice" and tables["variants"]["filters"] == [PAPER, DEFAULT]
    assert not ({e.name for e in ablations} | {EF, DEFAULT}) & set(method_names())
    with pytest.raises(LatentSiftError, match="lowercase word, then optionally"):
        register_filter("Channels:x", kind="ablation")


def test_a_plugin_filter_shows_in_the_help_and_scores_pools(plugin, tmp_path):
    env = dict(os.environ, COLUMNS="400", LATENTSIFT_PLUGINS="my_rules",
               PYTHONPATH=os.pathsep.join([str(plugin), str(SRC)]))
    r = subprocess.run([sys.executable, "-c", "from latentsift.cli import app; app()", "filter", "--help"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "longest-patch" in " ".join(r.stdout.split())
    assert rule_keys()[-1] == "longest_patch" and rule_keys("headline")[-1] == "longest_patch"  # after the built-ins
    fixture = Path(__file__).parent / "fixtures" / "trajectories"
    pools = tmp_path / "pools.jsonl"
    assert CliRunner().invoke(app, ["import", str(fixture / "mini_run"), "--out", str(pools)]).exit_code == 0
    r = CliRunner().invoke(app, ["filter", str(pools), "--method", "longest-patch", "--out", str(tmp_path / "f.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "f.json").read_text())["method"] == "longest-patch"


@pytest.mark.model
def test_a_plugin_filter_runs_in_crossval_and_its_report(plugin, tiny_run, tmp_path, one_torch_thread):
    from latentsift.protocol import crossval
    run = Path(tiny_run["out"])
    report = crossval(run / "pools.jsonl", run / "states", tmp_path / "cv", n_folds=2, ks=(2,), n_draws=5,
                      n_boot=20, scorer_epochs=2, variants=False, agent_transfer=False, curve_fractions=(1.0,),
                      log=lambda m: None)
    summary = json.loads((report / "summary.json").read_text())
    assert "longest_patch" in summary["retention"] and "longest_patch" in summary["settings"]["headline"]
    naive = next(t for t in summary["ablations"].values() if any(r["filter"] == "longest_patch" for r in t["rows"]))
    assert naive["rows"][-1]["filter"] == "longest_patch"
    assert "longest patch (plugin)" in (report / "report.md").read_text()


IMPORTER = '''
from latentsift.trajectories.importers import register_importer
from latentsift.trajectories.trajectory import Step, Trajectory


def looks_like(rec):
    return isinstance(rec, dict) and "my_steps" in rec


@register_importer("myformat", detect=looks_like, missing=("my_steps", "is missing (not a my-format record)"),
                   describe="a my-format")
def read(rec, where, src):
    steps = [Step(cot=s, fn="ls", obs="ok") for s in where.get(rec, "my_steps", list)]
    return Trajectory(traj_id=f"mine/{rec['id']}", instance_id=rec["id"], repo="o/r", task_prompt="t",
                      steps=steps, agent=rec["agent"], run="mine", source_format="myformat")
'''


def test_an_importer_is_one_module_and_one_registration(tmp_path, monkeypatch):
    from latentsift.trajectories.importers import format_names, import_paths
    (tmp_path / "my_importer.py").write_text(IMPORTER)
    env = dict(os.environ, COLUMNS="400", PYTHONPATH=os.pathsep.join([str(tmp_path), str(SRC)]))
    code = "import my_importer; from latentsift.cli import app; app()"
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("my_importer")
    try:
        assert format_names()[-1] == "myformat"
        r = subprocess.run([sys.executable, "-c", code, "import", "--help"], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "myformat" in r.stdout, r.stderr
        data = tmp_path / "mine.jsonl"
        data.write_text(json.dumps({"id": "o__r-1", "agent": "my-agent", "my_steps": ["a", "b"]}) + "\n")
        (t,) = import_paths(data).trajectories  # auto-detected by the registered format
        assert t.source_format == "myformat" and t.n_steps == 2
        with pytest.raises(LatentSiftError, match="'my_steps': is missing"):
            import_paths(Path(__file__).parent / "fixtures" / "trajectories" / "openai_toolcalls.jsonl",
                         format="myformat")
    finally:
        registry_remove("importer", "myformat")
        sys.modules.pop("my_importer", None)


def _package_modules():
    """Import every module of the package, so that every registration has run."""
    import pkgutil
    import latentsift
    for m in pkgutil.walk_packages(latentsift.__path__, "latentsift."):
        importlib.import_module(m.name)


def _home(obj) -> str:
    """The source file (relative to src/) of a registered object (a partial's function, an instance's class)."""
    obj = getattr(obj, "func", obj)
    obj = obj if inspect.isclass(obj) or inspect.isroutine(obj) else type(obj)
    return str(Path(inspect.getsourcefile(obj)).resolve().relative_to(SRC))


def _name_literals() -> dict[str, set[str]]:
    """string literal -> the source files that spell it (every string constant but the names of ``__all__``, which
    name Python objects: the renderer ``render`` is registered under its function's name)."""
    out: dict[str, set[str]] = {}
    for f in sorted((SRC / "latentsift").rglob("*.py")):
        tree = ast.parse(f.read_text())
        exported = {id(c) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                    and any(getattr(t, "id", None) == "__all__"
                            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
                    for c in ast.walk(node.value)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exported:
                out.setdefault(node.value, set()).add(str(f.relative_to(SRC)))
    return out


WORDS = "latentsift/_core/words.py"


def test_every_registered_name_is_spelled_in_one_source_file():
    """A registered name (a filter's results key too), as a string literal, is in exactly one source file: the
    module of the registered object, or, for a word that names more than one thing (registered in two kinds, as
    "local" and "openai", or also another concept, as the cascade's tie rule "random"), the words module
    ``latentsift._core.words``, which holds such words only."""
    from latentsift._core import words
    _package_modules()
    literals = _name_literals()
    homes: dict[str, set[str]] = {}
    for kind in KINDS:
        for e in registry_entries(kind):
            for word in {e.name, e.info.get("key", e.name)}:
                homes.setdefault(word, set()).add(_home(e.obj))
    assert {"random", "latentsift", "local", "openai", "torch", "sweagent", "branch:distance", "variant:stack:length",
            "variant:scaffold-bank", "sweep:*", "default", "ef_verifier"} <= set(homes)  # none exempt
    stray = {w: sorted(literals.get(w, set())) for w, home in homes.items()
             if not (literals.get(w, set()) <= home and len(literals.get(w, set())) <= 1)
             and literals.get(w) != {WORDS}}
    assert stray == {}
    held = {v for k, v in vars(words).items() if k.isupper() and isinstance(v, str)}
    assert held and held <= set(homes) and all(literals[w] == {WORDS} for w in held)
    assert len(homes["local"]) == 2 and len(homes["openai"]) == 2  # registered in two kinds: one spelling


def test_the_variants_and_the_sweep_are_registered_filters():
    """The beyond-paper variants (stacks included) and the sweep's family are registered filters: the protocol
    builds the variants in registration order, its tables and the report find them by kind, and a post-hoc
    filter is one registered as such."""
    from latentsift.protocol.decide import REF_LENGTH_STACK, is_post_hoc
    from latentsift.protocol.tables import ablation_tables
    from latentsift.sift.rules import PAPER, filters, find_filter
    from latentsift.sift.variants import (DEFAULT, PROBE, STACK_CONFIGS, SWEEP, StackedFilter, sweep_filter, sweep_name,
                                          variant_setting)
    variants = filters("variant")
    assert [variant_setting(e.key) for e in variants if e.signals] == list(STACK_CONFIGS)
    assert len(variants) == 11 and all(e.key == e.name for e in variants)  # the fitted fusion the eleventh
    stack = filter_entry(REF_LENGTH_STACK)
    assert stack.factory is StackedFilter and stack.signals == ("neg_chars", "neg_steps") and stack.post_hoc
    assert filter_entry(PROBE).signals == ("probe",) and not filter_entry(PROBE).post_hoc
    assert sweep_name("gemma", PAPER) == "sweep:gemma" and sweep_name("gemma", DEFAULT) == "sweep:gemma:default"
    assert sweep_filter(sweep_name("gemma", DEFAULT)) == DEFAULT and sweep_filter(sweep_name("gemma", PAPER)) == PAPER
    assert find_filter(sweep_name("gemma", DEFAULT)).name == SWEEP and find_filter("_components") is None
    assert is_post_hoc(REF_LENGTH_STACK) and is_post_hoc(sweep_name("gemma", DEFAULT)) and is_post_hoc(DEFAULT)
    assert not is_post_hoc(PROBE) and not is_post_hoc(sweep_name("gemma", PAPER)) and not is_post_hoc(PAPER)
    names = [PAPER, DEFAULT, "shortest_chars", "_components", sweep_name("g", PAPER), REF_LENGTH_STACK, PROBE]
    assert ablation_tables(names)["variants"]["filters"] == [PAPER, DEFAULT, sweep_name("g", PAPER), PROBE,
                                                             REF_LENGTH_STACK, "shortest_chars"]
    # a plugin's variant is a stack like the built-ins: registered post hoc, it is one
    register_filter("variant:stack:plugin", key="variant:stack:plugin", kind="variant", signals=("neg_steps",),
                    post_hoc=True)(type("PluginStack", (StackedFilter,), {"__module__": "my_plugin"}))
    try:
        assert is_post_hoc("variant:stack:plugin") and filters("variant")[-1].signals == ("neg_steps",)
    finally:
        unregister_filter("variant:stack:plugin")
