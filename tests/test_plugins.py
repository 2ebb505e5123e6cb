"""Every extension point is one module plus one registration: a rule filter, an importer, a verifier
backend and a keep rule, each defined in a plugin module outside the package, named in
``LATENTSIFT_PLUGINS`` and run through the command line in a fresh process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
FIXTURE = Path(__file__).parent / "fixtures" / "trajectories" / "mini_run"

PLUGINS = {
    "p_rule": '''
import numpy as np
from latentsift.sift.rules import RuleFilter, register_filter


@register_filter("longest-patch", label="longest patch (plugin)")
class LongestPatchFilter(RuleFilter):
    def _raw(self, cands, states):
        return np.array([float(len(c.patch or "")) for c in cands])
''',
    "p_importer": '''
from latentsift.trajectories.importers import register_importer
from latentsift.trajectories.trajectory import Step, Trajectory


def looks_like(rec):
    return isinstance(rec, dict) and "my_steps" in rec


@register_importer("myformat", detect=looks_like, missing=("my_steps", "is missing"), describe="a my-format")
def read(rec, where, src):
    steps = [Step(cot=s, fn="ls", obs="ok") for s in where.get(rec, "my_steps", list)]
    return Trajectory(traj_id=f"mine/{rec['id']}", instance_id=rec["id"], repo="o/r", task_prompt="t",
                      steps=steps, agent=rec["agent"], run="mine", source_format="myformat")
''',
    "p_verifier": '''
from latentsift._core.registry import registry_add
from latentsift.cascade.backends import RawJudgement, VerifierBackend


class LengthJudge(VerifierBackend):
    """A judge that prefers short logs: P(YES) = 1 / (1 + tokens / 1000)."""

    backend_id = "length-judge"

    @classmethod
    def from_options(cls, **options):
        return cls()

    def judge(self, system, user, prefix, yes="YES", no="NO"):
        n = self.count_prompt(system, user, prefix)
        p = 1.0 / (1.0 + n / 1000.0)
        return RawJudgement(p, 1.0 - p, p, n, 1)

    def count_text(self, text):
        return len(text) // 4

    def head(self, text, n):
        return text[: 4 * n]

    def count_prompt(self, system, user, prefix):
        return self.count_text(system) + self.count_text(user) + self.count_text(prefix)

    def describe(self):
        return {"backend": "length-judge"}


registry_add("verifier_backend", "length-judge", LengthJudge)
''',
    "p_keep": '''
import numpy as np
from latentsift import order_by_score
from latentsift._core.registry import registry_add
from latentsift.sift.keep import KeepRule


class TopOne(KeepRule):
    """Keep the single best candidate."""

    name = "top-one"

    def keep(self, scores, traj_ids):
        mask = np.zeros(len(traj_ids), dtype=bool)
        mask[order_by_score(scores, traj_ids)[:1]] = True
        return mask


registry_add("keep_rule", "top-one", TopOne)
''',
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Run ``latentsift ARGS`` in a fresh process with the four plugin modules in LATENTSIFT_PLUGINS."""
    d = tmp_path_factory.mktemp("plugins")
    for name, code in PLUGINS.items():
        (d / f"{name}.py").write_text(code)
    env = dict(os.environ, COLUMNS="400", LATENTSIFT_PLUGINS=",".join(PLUGINS),
               PYTHONPATH=os.pathsep.join([str(d), str(SRC)]))

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "latentsift.cli", *map(str, args)], env=env, capture_output=True,
                           text=True, timeout=300, cwd=d)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    pools = d / "pools.jsonl"
    run("import", FIXTURE, "--out", pools)
    return run, d, pools


def test_a_plugin_importer_reads_its_format(cli):
    run, d, _ = cli
    assert "myformat" in " ".join(run("import", "--help").split())
    (d / "mine.jsonl").write_text(json.dumps({"id": "o__r-1", "agent": "my-agent", "my_steps": ["a", "b"]}) + "\n")
    run("import", d / "mine.jsonl", "--out", d / "mine_pools.jsonl")
    (t,) = [json.loads(line) for line in (d / "mine_pools.jsonl").read_text().splitlines()]
    assert t["source_format"] == "myformat" and len(t["steps"]) == 2


def test_a_plugin_rule_filter_scores_pools(cli):
    run, d, pools = cli
    assert "longest-patch" in " ".join(run("filter", "--help").split())
    run("filter", pools, "--method", "longest-patch", "--out", d / "f.json")
    out = json.loads((d / "f.json").read_text())
    assert out["method"] == "longest-patch"
    for p in out["pools"]:   # the paper's keep rule on the plugin's scores
        assert p["n_keep"] == min(p["k"], max(3, p["k"] // 2))


def test_a_plugin_keep_rule_decides_what_stage1_keeps(cli):
    run, d, pools = cli
    assert "top-one" in " ".join(run("filter", "--help").split())
    run("filter", pools, "--method", "shortest-chars", "--out", d / "base.json")
    run("filter", pools, "--method", "shortest-chars", "--keep-rule", "top-one", "--out", d / "k.json")
    base, kept = (json.loads((d / f).read_text()) for f in ("base.json", "k.json"))
    assert kept["keep_rule"]["rule"] == "top-one"
    for b, k in zip(base["pools"], kept["pools"]):
        assert k["n_keep"] == len(k["retained"]) == 1
        best = max(b["candidates"], key=lambda c: c["s"])["s"]   # same scores, the best one kept
        assert next(c for c in k["candidates"] if c["retained"])["s"] == best
        assert b["n_keep"] == min(b["k"], max(3, b["k"] // 2))


def test_a_plugin_verifier_backend_scores_trajectories(cli):
    run, d, pools = cli
    assert "length-judge" in " ".join(run("verify", "--help").split())
    run("verify", pools, "--out", d / "v", "--backend", "length-judge")
    rows = [json.loads(line) for line in (d / "v" / "verdicts.jsonl").read_text().splitlines()]
    n = len([line for line in pools.read_text().splitlines() if line.strip()])
    assert len(rows) == n and all(0.0 < r["score"] < 1.0 for r in rows)
    assert json.loads((d / "v" / "manifest.json").read_text())["backend"] == {"backend": "length-judge"}


ENTRY_POINT_PLUGIN = '''
from latentsift._core.registry import registry_add
from latentsift.rollout.folder import sandbox_env
from latentsift.rollout.policies import PolicyPin
from latentsift.rollout.tasks import load_tasks
from latentsift.states.channel import render
from latentsift.states.extract import LocalExtractionBackend


class EchoBackend(LocalExtractionBackend):
    """The local backend under another name."""


def one_sequence(traj, tokenizer, **limits):
    return render(traj, tokenizer, **limits)


registry_add("sandbox", "echo-sandbox", sandbox_env)
registry_add("task_source", "echo-tasks", load_tasks)
registry_add("policy", "echo-policy", PolicyPin(name="echo-policy", model="Echo-1B", file_name="echo.gguf", parts=(),
                                                size=10**6, sha256="0" * 64, architecture="qwen2"))
registry_add("renderer", "echo-render", one_sequence)
registry_add("extraction_backend", "echo-backend", EchoBackend)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A tiny installed distribution: a plugin module and its dist-info, whose entry point (group
    ``latentsift.plugins``) names the module; run ``python -c CODE ARGS`` with it on the path."""
    d = tmp_path_factory.mktemp("site")
    (d / "echo_plugin.py").write_text(ENTRY_POINT_PLUGIN)
    info = d / "echo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[latentsift.plugins]\necho = echo_plugin\n")
    (info / "RECORD").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "LATENTSIFT_PLUGINS"}
    env |= {"COLUMNS": "400", "PYTHONPATH": os.pathsep.join([str(d), str(SRC)])}

    def run(code: str, *args):
        return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True,
                              text=True, timeout=300, cwd=d)
    return run


CLI = "from latentsift.cli import main; main()"
#: The command line run with ARGS, then whether the plugin module was imported (the last line).
IMPORTED = ("import sys\nfrom latentsift.cli import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('echo_plugin' in sys.modules)")


def test_an_installed_plugin_is_seen_by_the_command_line(installed):
    """Each registered kind a user chooses on the command line lists the plugin's extension, and takes it."""
    def help_of(*args):
        r = installed(CLI, *args, "--help")
        assert r.returncode == 0, r.stderr
        return " ".join(r.stdout.split())
    assert "echo-sandbox" in help_of("rollout") and "echo-tasks" in help_of("rollout")
    assert "echo-policy (Echo-1B, 1 MB)" in help_of("policy", "fetch") and "echo-policy" in help_of("policy", "verify")
    assert "echo-render" in help_of("extract") and "echo-backend" in help_of("extract")
    # a name that is not registered is refused in one line naming the option and the plugin's name beside the others
    r = installed(CLI, "extract", "x.jsonl", "--out", "o", "--renderer", "nope")
    assert r.returncode == 2 and "--renderer must be a registered renderer" in r.stderr and "echo-render" in r.stderr
    r = installed(CLI, "rollout", "--out", "o", "--sandbox", "nope")
    assert r.returncode == 2 and "--sandbox must be a registered sandbox" in r.stderr and "echo-sandbox" in r.stderr


def test_help_imports_no_plugin_until_a_command_lists_one(installed):
    """``latentsift --help`` and the help of a command that lists no registered names import no plugin module
    (option defaults are names, resolved when the command runs); a command whose help lists a kind loads them."""
    for args in (["--help"], ["rollout", "export", "--help"], ["crossval", "--help"]):
        r = installed(IMPORTED, *args)
        assert r.returncode == 0 and r.stdout.split()[-1] == "False", (args, r.stdout[-300:], r.stderr)
    r = installed(IMPORTED, "rollout", "--help")
    assert r.returncode == 0 and "echo-sandbox" in r.stdout and r.stdout.split()[-1] == "True", r.stderr


#: Plugins that fail at import, each in its own way, by module name.
BROKEN = {"p_raises": "raise RuntimeError('the plugin is broken')\n",
          "p_missing_dep": "import a_module_nobody_installed\n",
          "p_syntax": "def (:\n",
          "p_exits": "import sys\nsys.exit(3)\n"}


def test_a_plugin_that_fails_at_import_is_one_warning_and_the_rest_works(installed, tmp_path):
    """Broken plugins named in LATENTSIFT_PLUGINS and one broken installed entry point: each is one warning line
    naming it (no traceback), the command that needs none of them works and writes its output, the working
    installed plugin's extensions still show, and a broken plugin's name given to an option is one error line."""
    site = Path(installed("import echo_plugin; print(echo_plugin.__file__)").stdout.strip()).parent
    for name, code in BROKEN.items():
        (tmp_path / f"{name}.py").write_text(code)
    (site / "broken_ep.py").write_text("raise ValueError('bad entry point')\n")
    info = site / "broken_ep-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[latentsift.plugins]\nbroken = broken_ep\n")
    (info / "RECORD").write_text("")
    env = dict(os.environ, COLUMNS="400", LATENTSIFT_PLUGINS=",".join(BROKEN),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(site), str(SRC)]))
    try:
        def run(*args):
            return subprocess.run([sys.executable, "-m", "latentsift.cli", *map(str, args)], env=env,
                                  capture_output=True, text=True, timeout=300, cwd=tmp_path)
        r = run("import", FIXTURE, "--out", tmp_path / "pools.jsonl")
        assert r.returncode == 0 and (tmp_path / "pools.jsonl").is_file(), r.stderr
        warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: the plugin")]
        assert "Traceback" not in r.stderr and len(warnings) == len(BROKEN) + 1, r.stderr
        for name, words in (("p_raises", "RuntimeError: the plugin is broken"),
                            ("p_missing_dep", "ModuleNotFoundError: No module named 'a_module_nobody_installed'"),
                            ("p_syntax", "SyntaxError"), ("p_exits", "SystemExit: 3"),
                            ("broken", "(broken_ep, entry point of the package broken-ep)")):
            assert sum(f"'{name}'" in w and words in w for w in warnings) == 1, (name, warnings)
        r = run("extract", "--help")
        assert r.returncode == 0 and "echo-render" in " ".join(r.stdout.split()), r.stderr
        r = run("extract", tmp_path / "pools.jsonl", "--out", tmp_path / "s", "--renderer", "broken-render")
        errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert r.returncode == 2 and len(errors) == 1 and "--renderer" in errors[0], r.stderr
        assert not (tmp_path / "s").exists()
    finally:
        shutil.rmtree(info)
        (site / "broken_ep.py").unlink()
