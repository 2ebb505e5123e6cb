"""The importers on real files from the scaffolds' own repositories (tests/data/real, SOURCES.md says
repository, commit and path of each): SWE-agent 0.x and 1.x test data, an OpenHands v0.35
``output.jsonl`` record, OpenHands SDK (V1) records with terminal, file-edit, browser, think and
finish observations; and the SWE-bench harness's reports (written to its code's layout: no run of it
is published with them) labelling two runs side by side, in its per-instance ``logs/`` layout, and a
labels CSV without a run column. Identity, steps, each channel's characters against the raw file,
labels against the report; every inference said, an ambiguous one refused."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latentsift.cli import app
from latentsift.trajectories.importers import import_paths
from latentsift._core.validation import LatentSiftError

REAL = Path(__file__).parent / "data" / "real"
SWE0_RUN = REAL / "sweagent" / "gpt4__swe-agent__test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1"
SWE1_RUN = REAL / "sweagent" / "gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1"
OH_RUN = REAL / "openhands" / "openrouter-llama-4-maverick_maxiter_50_N_v0.35.0-no-hint-run_1"
SDK_RUN = REAL / "openhands_sdk" / "gpt-4o-2024-08-06_maxiter_100_N_initial"
HARNESS = REAL / "swebench_harness"
MINI = Path(__file__).parent / "fixtures" / "formats" / "mini2"   # hand-written: no 2.x run is published
IID = "django__django-11099"


def _messages(step) -> list[tuple[str, str, list[str]]]:
    """(role, text, call JSONs) of each message of a step, rebuilt from its layout and channels."""
    pos = {"cot": 0, "fn": 0, "obs": 0}
    out = []

    def take(ch: str, n: int) -> str:
        text = getattr(step, ch)[pos[ch]:pos[ch] + n]
        pos[ch] += n
        return text

    for m in step.messages_layout():
        text, calls = "", []
        for part in m["parts"]:
            if part[0] == "markup":
                text += part[1]
            elif part[0] == "skip":
                take(part[1], part[2])
            else:
                text += take(*part)
        for part in m.get("tool_calls", []):
            calls.append(take(*part) if part[0] == "fn" else take(part[1], part[2]) and "")
        out.append((m["role"], text, [c for c in calls if c]))
    assert pos == {ch: len(getattr(step, ch)) for ch in pos}    # every character used once
    return out


def _three_runs(tmp_path: Path) -> Path:
    """Runs side by side: mini-swe-agent 2.x's tool-call run, a rerun of it, the text-based run."""
    runs = tmp_path / "runs"
    shutil.copytree(MINI / "claude-sonnet-4-5_toolcall", runs / "claude-sonnet-4-5_toolcall")
    shutil.copytree(MINI / "claude-sonnet-4-5_toolcall", runs / "claude-sonnet-4-5_toolcall_rerun")
    shutil.copytree(MINI / "qwen3-8b_textbased", runs / "qwen3-8b_textbased")
    return runs


# ---------------------------------------------------------------------------------------------- SWE-agent
def test_sweagent0_identity_from_its_file_name_and_every_character_from_history():
    raw = json.loads((SWE0_RUN / "swe-agent__test-repo-i1.traj").read_text())
    res = import_paths([SWE0_RUN])
    (t,) = res.trajectories
    # the file's own name, not the run folder that looks like owner__repo-N; no repository made up
    assert (t.instance_id, t.run, t.repo) == ("swe-agent__test-repo-i1", SWE0_RUN.name, "")
    assert (t.source_format, t.n_steps) == ("sweagent", len(raw["trajectory"])) and t.n_steps == 5
    assert "inferred: instance id from the file name for 1 trajectories (swe-agent__test-repo-i1)" \
        in res.summary.to_text()
    hist = [m for m in raw["history"] if not m.get("is_demo")]
    first = next(k for k, m in enumerate(hist) if m["role"] == "assistant")
    assert [c["content"] for c in t.context] == [m["content"] for m in hist[:first]]   # the demo left out
    turns = hist[first:]
    for k, s in enumerate(t.steps[:-1]):     # each step is the assistant message and the reply, verbatim
        assert _messages(s) == [("assistant", turns[2 * k]["content"], []), ("user", turns[2 * k + 1]["content"], [])]
        assert s.fn == raw["trajectory"][k]["action"].rstrip("\n") + "\n" and s.fn in turns[2 * k]["content"]
    last = t.steps[-1]
    assert _messages(last)[0] == ("assistant", turns[-1]["content"], [])
    assert last.obs == raw["trajectory"][-1]["observation"] and last.meta["obs_sent"] is False
    assert t.patch == raw["info"]["submission"]


def test_sweagent1_a_final_step_only_in_trajectory_imports():
    """SWE-agent's own test data: 4 assistant messages for 5 steps, the final ``submit`` only in
    ``trajectory``; the instance from ``replay_config``, the repository from its GitHub URL."""
    path = SWE1_RUN / "6e44b9__sweagenttestrepo-1c2844.traj"
    raw = json.loads(path.read_text())
    res = import_paths([path])
    (t,) = res.trajectories
    assert (t.instance_id, t.repo, t.run) == ("SWE-agent__test-repo-i1", "SWE-agent/test-repo", SWE1_RUN.name)
    text = res.summary.to_text()
    assert "inferred: instance id from replay_config.problem_statement.id (not the file name)" in text
    assert "inferred: repository from replay_config.env.repo.github_url" in text
    assert (t.source_format, t.n_steps, t.meta["steps_only_in_trajectory"]) == ("sweagent1", 5, 1)
    asst = [m for m in raw["history"] if m["role"] == "assistant"]
    replies = [m for m in raw["history"] if m["role"] == "tool"]
    assert len(asst) == 4 and len(raw["trajectory"]) == 5
    for s, a, r in zip(t.steps, asst, replies):       # tool calls: text, the call, the tool's reply
        (role, text_, calls), (role2, obs, _) = _messages(s)
        assert (role, text_, role2, obs) == ("assistant", a["content"], "tool", r["content"])
        (call,) = a["tool_calls"]
        assert [json.loads(c) for c in calls] == [{"name": call["function"]["name"],
                                                   "arguments": json.loads(call["function"]["arguments"])}]
    last, step = t.steps[-1], raw["trajectory"][-1]
    assert (last.cot, last.fn, last.obs) == (step["response"], "submit", step["observation"])
    assert last.meta == {"only_in_trajectory": True, "obs_sent": False}
    assert t.patch == raw["info"]["submission"]


# ---------------------------------------------------------------------------------------------- OpenHands
def test_openhands_v035_output_record():
    raw = json.loads(gzip.decompress((OH_RUN / "output.jsonl.gz").read_bytes()))
    res = import_paths([OH_RUN])
    (t,) = res.trajectories
    assert (t.instance_id, t.repo, t.run) == ("ponylang__ponyc-4593", "ponylang/ponyc", OH_RUN.name)
    assert t.patch == raw["test_result"]["git_patch"] and t.task_prompt == raw["instance"]["problem_statement"]
    replies = {e["tool_call_metadata"]["model_response"]["id"] for e in raw["history"]
               if "action" in e and e.get("source") == "agent" and e.get("tool_call_metadata")}
    assert t.n_steps == len(replies) == 33                         # one step per LLM reply
    answers = [e for e in raw["history"] if "observation" in e and e.get("tool_call_metadata")]
    obs = "".join(s.obs for s in t.steps)
    for e in answers:                                               # every tool answer, whole
        assert e["content"] in obs
    assert len(obs) >= sum(len(e["content"]) for e in answers)
    for s in t.steps:
        calls = _messages(s)[0][2]
        assert len(calls) == len(s.fn.split("\n")) and all(json.loads(c)["name"] for c in calls)


def test_openhands_sdk_v1_observations_as_the_sdk_renders_them():
    """SDK 1.0 records (``output`` fields): each observation as its ``to_llm_content`` gives it, the
    command's output kept whole (not only the directory and exit-code lines)."""
    raw = {json.loads(line)["instance_id"]: json.loads(line)
           for line in (SDK_RUN / "output.critic_attempt_1.jsonl").read_text().splitlines()}
    res = import_paths([SDK_RUN])
    got = {t.instance_id: t for t in res.trajectories}
    assert sorted(got) == sorted(raw) == ["safety-applications", "safety-login-attempts", "safety-workbook"]
    seen = set()
    for iid, t in got.items():
        assert (t.run, t.repo, t.source_format) == (SDK_RUN.name, "", "openhands")   # no made-up repository
        events = raw[iid]["history"]
        replies = {e["llm_response_id"] for e in events if e["kind"] == "ActionEvent"}   # with tools
        said = [e for e in events if e["kind"] == "MessageEvent" and e["source"] == "agent"]  # without
        assert t.n_steps == len(replies) + len(said)
        by_call = {e["tool_call_id"]: e["observation"] for e in events if e["kind"] == "ObservationEvent"}
        for s in t.steps:
            for m, (role, text, _) in zip(s.messages_layout()[1:], _messages(s)[1:]):
                o = by_call.pop(m["tool_call_id"])
                seen.add(o["kind"])
                md = o.get("metadata") or {}
                expected = {
                    "ExecuteBashObservation": f"{md.get('prefix', '')}{o.get('output')}{md.get('suffix', '')}"
                    f"\n[Current working directory: {md.get('working_dir')}]"
                    f"\n[Python interpreter: {md.get('py_interpreter_path')}]"
                    f"\n[Command finished with exit code {md.get('exit_code')}]",
                    "FileEditorObservation": o.get("error") or o.get("output"),
                    "BrowserObservation": f"Error: {o.get('error')}" if o.get("error") else o.get("output"),
                    "ThinkObservation": o.get("content"), "FinishObservation": o.get("message")}[o["kind"]]
                assert (role, text) == ("tool", expected), (iid, o["kind"])
        assert not by_call
    assert seen == {"ExecuteBashObservation", "FileEditorObservation", "BrowserObservation", "ThinkObservation",
                    "FinishObservation"}
    bash = [e["observation"] for r in raw.values() for e in r["history"]
            if e["kind"] == "ObservationEvent" and e["observation"]["kind"] == "ExecuteBashObservation"]
    obs_chars = sum(len(s.obs) for t in got.values() for s in t.steps)
    assert obs_chars > sum(len(o["output"]) for o in bash) > 400


def test_an_sdk_observation_of_unknown_kind_is_refused_by_name(tmp_path):
    line = (SDK_RUN / "output.critic_attempt_1.jsonl").read_text().splitlines()[0]
    rec = json.loads(line)
    obs = next(e for e in rec["history"] if e["kind"] == "ObservationEvent")["observation"]
    obs["kind"] = "SpreadsheetObservation"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "output.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(LatentSiftError, match=r"observation\.kind': observation kind 'SpreadsheetObservation'"):
        import_paths([tmp_path / "run"])


# ---------------------------------------------------------------------------------------------- labels
def test_run_reports_side_by_side_label_the_run_their_run_id_names(tmp_path):
    runs = _three_runs(tmp_path)
    for f in (HARNESS / "run_reports").iterdir():
        shutil.copy(f, runs / f.name)
    res = import_paths([runs])
    got = {t.run: t for t in res.trajectories}
    assert {r: t.reward for r, t in got.items()} == {"claude-sonnet-4-5_toolcall": 1.0,
                                                     "claude-sonnet-4-5_toolcall_rerun": 0.0,
                                                     "qwen3-8b_textbased": 0.0}   # its empty patch
    for run, t in got.items():
        report = json.loads(Path(t.meta["label_source"]).read_text())
        assert Path(t.meta["label_source"]).name.endswith(f".{run}.json")
        assert (IID in report["resolved_ids"]) == (t.reward == 1.0)
    text = res.summary.to_text()
    assert ("anthropic__claude-sonnet-4-5-20250929.claude-sonnet-4-5_toolcall_rerun.json labels run "
            "claude-sonnet-4-5_toolcall_rerun: its name") in text
    # a report whose run_id names none of the three runs beside it: an error naming them
    shutil.copy(runs / "hosted_vllm__Qwen__Qwen3-8B.qwen3-8b_textbased.json", runs / "hosted_vllm__Qwen__Qwen3-8B.run_3.json")
    with pytest.raises(LatentSiftError, match=r"run_3.json'? matches none of the imported runs; 3 runs sit beside it "
                                              r"\(claude-sonnet-4-5_toolcall, claude-sonnet-4-5_toolcall_rerun, "
                                              r"qwen3-8b_textbased\)"):
        import_paths([runs])


def test_the_harness_logs_folder_labels_each_run_by_its_run_id(tmp_path):
    runs = _three_runs(tmp_path)
    res = import_paths([runs / "claude-sonnet-4-5_toolcall", runs / "claude-sonnet-4-5_toolcall_rerun"],
                       labels=[HARNESS / "logs"])
    got = {t.run: t for t in res.trajectories}
    first, rerun = got["claude-sonnet-4-5_toolcall"], got["claude-sonnet-4-5_toolcall_rerun"]
    assert (first.reward, first.tests) == (1.0, {"f2p_passed": 2, "f2p_total": 2, "p2p_passed": 1, "p2p_total": 2})
    assert (rerun.reward, rerun.tests) == (0.0, {"f2p_passed": 1, "f2p_total": 2, "p2p_passed": 1, "p2p_total": 2})
    assert "/run_evaluation/claude-sonnet-4-5_toolcall_rerun/" in rerun.meta["label_source"]
    assert "labels run claude-sonnet-4-5_toolcall_rerun: its run_id 'claude-sonnet-4-5_toolcall_rerun' (from its " \
           "path)" in res.summary.to_text()
    # the logs among the inputs: the same
    res = import_paths([runs / "claude-sonnet-4-5_toolcall", runs / "claude-sonnet-4-5_toolcall_rerun", HARNESS / "logs"])
    assert sorted(t.reward for t in res.trajectories) == [0.0, 1.0]
    # a run_id that names no imported run, with two runs: refused, naming them
    (runs / "claude-sonnet-4-5_toolcall_rerun").rename(runs / "second")
    with pytest.raises(LatentSiftError, match=r"its run_id 'claude-sonnet-4-5_toolcall_rerun' \(from its path\) matches "
                                              r"none of the imported runs; it labels one of the 2 imported runs "
                                              r"\(claude-sonnet-4-5_toolcall, second\)"):
        import_paths([runs / "claude-sonnet-4-5_toolcall", runs / "second"], labels=[HARNESS / "logs"])


def test_import_help_says_labels_takes_a_file_or_the_logs_folder():
    res = CliRunner().invoke(app, ["import", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "logs/" in res.output and "instance_id,resolved" in res.output


def test_a_labels_csv_without_a_run_column(tmp_path):
    table = tmp_path / "labels.csv"
    table.write_text("instance_id,resolved\nswe-agent__test-repo-i1,1\nSWE-agent__test-repo-i1,0\n")
    res = import_paths([SWE0_RUN, SWE1_RUN], labels=[table])
    assert {t.instance_id: t.reward for t in res.trajectories} == {"swe-agent__test-repo-i1": 1.0,
                                                                   "SWE-agent__test-repo-i1": 0.0}
    assert "no run column: each instance id is in one imported run" in res.summary.to_text()
    # one instance in two runs: which row is whose cannot be told
    runs = _three_runs(tmp_path)
    table.write_text(f"instance_id,resolved\n{IID},1\n")
    with pytest.raises(LatentSiftError, match=r"labels.csv:2: 'django__django-11099' is in 2 imported runs "
                                              r"\(claude-sonnet-4-5_toolcall, claude-sonnet-4-5_toolcall_rerun\); "
                                              r"add a 'run' column"):
        import_paths([runs / "claude-sonnet-4-5_toolcall", runs / "claude-sonnet-4-5_toolcall_rerun"], labels=[table])
