"""Today's agent logs: OpenHands' SWE-bench ``output.jsonl`` (V0 events, the 2024 pairs, the V1 SDK's
typed events),
SWE-agent 1.x ``.traj`` (function calling and fenced commands), mini-swe-agent 2.x (tool calls,
Responses API items and text), each from a hand-written fixture, into the right channels, ids and patch; labels from the
SWE-bench harness's run report and per-instance ``report.json`` joined to them; auto-detection by
``latentsift import`` and one line for a file of no known format."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from latentsift.cli import app
from latentsift.states.channel import render
from latentsift.trajectories.importers import RecordError, import_paths, load_pools
from latentsift.trajectories.trajectory import CHANNEL_ID

FIX = Path(__file__).parent / "fixtures" / "formats"
OH_RUN = FIX / "openhands" / "claude-sonnet-4_maxiter_100_N_v0.38.0-no-hint-run_1"
SWE1_FC = FIX / "sweagent1" / "default__anthropic--claude-sonnet-4-20250514__t-0.00__p-1.00__c-2.00___swe_bench_verified_test"
SWE1_TA = FIX / "sweagent1" / "thought_action__Qwen--Qwen3-8B__t-0.00"
MINI_TC = FIX / "mini2" / "claude-sonnet-4-5_toolcall"
MINI_TX = FIX / "mini2" / "qwen3-8b_textbased"
INSTANCE_REPORT = next((FIX / "harness").rglob("report.json"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _by_instance(trajs) -> dict:
    return {t.instance_id: t for t in trajs}


def test_openhands_output_jsonl_events_become_steps_and_the_run_report_labels_them():
    raw = {r["instance_id"]: r for r in _lines(OH_RUN / "output.jsonl")}
    res = import_paths([OH_RUN])
    assert res.summary.files == {"openhands": 1, "report": 1}
    t = _by_instance(res.trajectories)
    dj, sy, ap = t["django__django-11099"], t["sympy__sympy-20590"], t["astropy__astropy-12907"]
    # ids, patch, task and context from the record
    assert dj.traj_id == f"{OH_RUN.name}/django__django-11099" and dj.run == OH_RUN.name
    assert (dj.agent, dj.source_format, dj.repo) == ("openhands", "openhands", "django/django")
    assert dj.patch == raw["django__django-11099"]["test_result"]["git_patch"] and dj.patch.startswith("diff --git")
    assert dj.task_prompt == raw["django__django-11099"]["instance"]["problem_statement"]
    assert [m["role"] for m in dj.context] == ["system", "user"]
    assert dj.context[0]["content"].startswith("You are OpenHands agent")
    assert "<issue_description>" in dj.context[1]["content"]
    # labels from the harness's run report beside the file: resolved, empty patch (unresolved), error (unknown)
    assert (dj.reward, sy.reward, ap.reward) == (1.0, 0.0, None)
    # one step per LLM reply: its text (or reasoning) is cot, its calls fn, the answers obs
    s0, s1, s2 = dj.steps
    assert s0.cot == "Let me find the two validators first." and s0.fn_style == "tool_calls"
    assert json.loads(s0.fn) == {"name": "execute_bash",
                                 "arguments": {"command": "grep -n 'regex' django/contrib/auth/validators.py"}}
    assert s0.obs == ("9:    regex = r'^[\\w.@+-]+$'\n19:    regex = r'^[\\w.@+-]+$'"
                      "\n[The command completed with exit code 0.]"
                      "\n[Current working directory: /workspace/django__django__3.0]"
                      "\n[Python interpreter: /opt/miniconda3/envs/testbed/bin/python]"
                      "\n[Command finished with exit code 0]")            # as to_agent_observation shows it
    assert s0.obs_role == "tool" and s0.layout[1]["tool_call_id"] == "toolu_01"
    assert s1.cot.startswith("$ also matches before a trailing newline")      # reasoning_content, no text
    assert [json.loads(line)["name"] for line in s1.fn.split("\n")] == ["str_replace_editor"] * 2
    assert [m["tool_call_id"] for m in s1.layout[1:]] == ["toolu_02", "toolu_03"]   # two calls, two answers
    assert s1.obs.split("\n\n")[1].endswith("19\t    regex = r'\\A[\\w.@+-]+\\Z'")
    assert json.loads(s2.fn)["name"] == "finish" and s2.obs == ""
    assert dj.meta["events_not_rendered"] == 3 and dj.meta["agent_class"] == "CodeActAgent"
    # an agent message without a tool is a step with cot only; the harness's nudge is its observation
    assert sy.steps[0].fn == "" and sy.steps[0].cot.startswith("I think the __dict__")
    assert sy.steps[0].obs.startswith("Please continue working on the task") and sy.steps[0].obs_role == "user"
    assert json.loads(sy.steps[1].fn)["arguments"]["command"] == "grep -n '__slots__' sympy/core/symbol.py"


def test_openhands_2024_history_pairs():
    (t,) = import_paths([FIX / "openhands_2024"]).trajectories
    assert (t.source_format, t.reward, t.n_steps) == ("openhands", 1.0, 2)   # reward from test_result.report
    assert t.run == "CodeActAgent_gpt-4o-2024-05-13_maxiter_30_N_v1.9-no-hint"
    s0, s1 = t.steps
    assert s0.cot == "Let me find the validators."
    assert json.loads(s0.fn) == {"name": "run", "arguments": {
        "command": "grep -n 'regex' django/contrib/auth/validators.py", "keep_prompt": False, "is_confirmed": "confirmed"}}
    assert s0.obs == "9:    regex = r'^[\\w.@+-]+$'\n19:    regex = r'^[\\w.@+-]+$'"
    assert s1.cot == "The regexes are fixed." and json.loads(s1.fn)["name"] == "finish"


def test_openhands_sdk_v1_typed_events():
    """OpenHands V1 (the SDK's typed events): actions of one reply share ``llm_response_id``; a terminal's
    output as the SDK shows it; an agent error answers its call; state updates are not rendered."""
    (t,) = import_paths([FIX / "openhands_v1"]).trajectories
    assert (t.traj_id, t.source_format, t.reward) == ("claude-sonnet-4-5_sdk_v1.11/django__django-11099", "openhands", None)
    assert t.patch.startswith("diff --git") and t.meta["attempt"] == 1
    assert t.meta["model"] == "litellm_proxy/claude-sonnet-4-5-20250929" and t.meta["events_not_rendered"] == 3
    assert [m["role"] for m in t.context] == ["system", "user"]
    assert t.context[0]["content"].endswith("</RUNTIME_INFORMATION>")     # system prompt + dynamic context
    s0, s1, s2 = t.steps
    assert s0.cot == "The issue names the validators module.Let me find the two validators."   # reasoning, then thought
    assert json.loads(s0.fn)["arguments"]["command"] == "grep -n regex django/contrib/auth/validators.py"
    assert s0.obs.endswith("\n[Current working directory: /workspace/django]\n[Python interpreter: /usr/bin/python]"
                           "\n[Command finished with exit code 0]")
    assert len(s1.fn.split("\n")) == 2 and [m.get("tool_call_id") for m in s1.layout[1:]] == ["call_a2", "call_a3"]
    assert s1.obs.endswith("\n\nCommand timed out after 120 seconds.")        # the AgentErrorEvent
    assert json.loads(s2.fn)["name"] == "finish" and s2.obs == "Both validators now use \\A and \\Z."


def test_sweagent1_function_calling_and_the_per_instance_report():
    raw = json.loads((SWE1_FC / "django__django-11099" / "django__django-11099.traj").read_text())
    (t,) = import_paths([SWE1_FC], labels=[INSTANCE_REPORT]).trajectories
    assert (t.traj_id, t.agent, t.source_format) == (f"{SWE1_FC.name}/django__django-11099", "sweagent", "sweagent1")
    assert t.patch == raw["info"]["submission"] and t.meta["swe_agent_version"] == "1.1.0"
    assert t.task_prompt.startswith("UsernameValidator allows trailing newline") and "<pr_description>" not in t.task_prompt
    assert [m["role"] for m in t.context] == ["system", "user"]
    assert t.context[1]["content"].startswith("<uploaded_files>")           # a list of text parts, joined
    s0, s1, s2 = t.steps
    assert s0.cot == "I'll start by finding the regexes in the validators."
    assert json.loads(s0.fn) == {"name": "bash", "arguments": {"command": "grep -n regex /testbed/django/contrib/auth/validators.py"}}
    assert s0.obs.startswith("OBSERVATION:\n9:    regex") and s0.obs_role == "tool"
    assert s0.layout[1]["tool_call_id"] == "toolu_01"
    assert s1.cot.startswith("Both validators anchor with ^ and $") and s1.cot.endswith("switch them to `\\A` and `\\Z`.")
    assert s1.layout[0]["parts"][0] == ["markup", "<think>\n"]              # thinking blocks first, tags excluded
    assert json.loads(s2.fn)["name"] == "submit" and s2.meta["obs_sent"] is False
    # the harness's per-instance report.json: resolved and its test counts
    assert t.reward == 1.0 and t.tests == {"f2p_passed": 2, "f2p_total": 2, "p2p_passed": 1, "p2p_total": 2}


def test_sweagent1_fenced_commands_and_demonstrations():
    (t,) = import_paths([SWE1_TA]).trajectories
    assert t.source_format == "sweagent1" and t.reward is None and t.patch == ""
    assert [m["role"] for m in t.context] == ["system", "user"]             # the demonstration is left out
    assert t.task_prompt == ("Symbol instances have __dict__ since 1.7?\n"
                             "In version 1.6.2 Symbol instances had no `__dict__` attribute.")
    s0, s1 = t.steps
    assert s0.fn == 'search_file "__slots__" sympy/core/symbol.py\n' and s0.fn_style == "text"
    assert s0.cot == "Let's look for `__slots__` in the Symbol class.\n\n"
    assert s0.obs.endswith("(Current directory: /testbed)\nbash-$") and s0.obs_role == "user"
    assert s1.fn == "exit_forfeit\n" and s1.meta["obs_sent"] is False


def test_minisweagent2_tool_calls_drop_the_exit_message():
    (t,) = import_paths([MINI_TC]).trajectories
    raw = json.loads((MINI_TC / "django__django-11099" / "django__django-11099.traj.json").read_text())
    assert (t.traj_id, t.source_format, t.agent) == ("claude-sonnet-4-5_toolcall/django__django-11099",
                                                     "minisweagent", "minisweagent")
    assert t.patch == raw["info"]["submission"] and t.meta["trajectory_format"] == "mini-swe-agent-1.1"
    assert t.task_prompt.startswith("UsernameValidator allows trailing newline")
    s0, s1, s2 = t.steps
    assert s0.cot == "Two things to look at; they are independent, so two calls.THOUGHT: Find the validators and the tests that use them."
    assert [json.loads(line)["arguments"]["command"] for line in s0.fn.split("\n")] == [
        "grep -n regex django/contrib/auth/validators.py", "ls tests/auth_tests | head -3"]
    # two tool answers, then the format error of a reply that called nothing (the reply itself was not kept)
    assert [m["role"] for m in s0.layout] == ["assistant", "tool", "tool", "user"]
    assert s0.obs.endswith("Every response MUST include at least one tool call.")
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in json.loads(s2.fn)["arguments"]["command"]
    assert s2.obs == "" and all(m["role"] != "exit" for s in t.steps for m in s.layout)


def test_minisweagent2_responses_api_items():
    """A Responses API model (litellm_response): whole replies and function_call_output items."""
    (t,) = import_paths([FIX / "mini2" / "gpt-5-mini_responses"]).trajectories
    s0, s1 = t.steps
    assert s0.cot == "The validators live in django/contrib/auth/validators.py."      # the reasoning summary
    assert s0.layout[0]["parts"][0] == ["markup", "<think>\n"]
    assert json.loads(s0.fn) == {"name": "bash", "arguments": {"command": "grep -n regex django/contrib/auth/validators.py"}}
    assert [m["role"] for m in s0.layout] == ["assistant", "tool", "user"] and s0.layout[1]["tool_call_id"] == "call_1"
    assert s0.obs.endswith("Every response MUST include at least one tool call.")
    assert s1.cot == "Submitting." and s1.obs == "" and t.n_steps == 2


def test_minisweagent2_text_based():
    (t,) = import_paths([MINI_TX]).trajectories
    s0, s1 = t.steps
    assert s0.fn == "grep -n regex django/contrib/auth/validators.py" and s0.cot == "THOUGHT: Find the validators.\n\n"
    assert s0.obs.startswith("<returncode>0</returncode>") and s1.obs == "" and t.n_steps == 2


def test_cli_detects_every_new_format_and_joins_a_per_instance_report(tmp_path):
    out = tmp_path / "pools.jsonl"
    res = CliRunner().invoke(app, ["import", str(OH_RUN), str(FIX / "openhands_2024"), str(FIX / "openhands_v1"),
                                   str(FIX / "sweagent1"), str(MINI_TC), str(MINI_TX), "--out", str(out)])
    assert res.exit_code == 0, res.output
    got = {(t.source_format, t.run, t.instance_id) for p in load_pools(out) for t in p.candidates}
    assert {f for f, _, _ in got} == {"openhands", "sweagent1", "minisweagent"} and len(got) == 9
    # --labels with the harness's per-instance report.json on a run without labels of its own
    res = CliRunner().invoke(app, ["import", str(MINI_TC), "--out", str(tmp_path / "m.jsonl"),
                                   "--labels", str(INSTANCE_REPORT)])
    assert res.exit_code == 0, res.output
    (t,) = [c for p in load_pools(tmp_path / "m.jsonl") for c in p.candidates]
    assert t.reward == 1.0 and t.tests["f2p_total"] == 2


def test_an_unrecognised_file_is_one_line(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"instance_id": "django__django-11099", "steps_taken": 3}))
    res = CliRunner().invoke(app, ["import", str(bad), "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 2 and not (tmp_path / "o.jsonl").exists()
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and str(bad) in lines[0]
    assert "unrecognised content" in lines[0] and "an OpenHands output.jsonl" in lines[0] and "SWE-agent 1.x" in lines[0]


def test_harness_entries_without_a_verdict_stay_unknown(tmp_path):
    """A per-instance report whose failure the harness blames on the environment labels nothing;
    a run report's error_ids are unknown while its empty patches are unresolved."""
    run = tmp_path / "run"
    shutil.copytree(SWE1_FC, run)
    rep = json.loads(INSTANCE_REPORT.read_text())
    rep["django__django-11099"].update(resolved=False, infra_failure=True)
    (run / "django__django-11099" / "report.json").write_text(json.dumps(rep))
    (t,) = import_paths([run]).trajectories
    assert t.reward is None and t.tests == {}
    summary = json.loads((OH_RUN / "anthropic__claude-sonnet-4-20250514.oh_run_1.json").read_text())
    assert summary["error_ids"] == ["astropy__astropy-12907"] and summary["empty_patch_ids"] == ["sympy__sympy-20590"]


def test_every_new_fixture_renders_with_its_channels(policy):
    """Each imported step renders under the packaged policy's chat template (the session's model,
    loaded once for the suite), with tokens in exactly the channels that have text."""
    tokenizer = policy.tokenizer
    trajs = import_paths([OH_RUN, FIX / "openhands_2024", FIX / "openhands_v1", FIX / "sweagent1",
                          FIX / "mini2"]).trajectories
    assert len(trajs) == 10
    for t in trajs:
        R = render(t, tokenizer)
        assert R.n_steps == t.n_steps
        for k, s in enumerate(t.steps):
            for ch in ("cot", "obs"):
                ids = R.input_ids[(R.step == k) & (R.channel == CHANNEL_ID[ch])]
                text = getattr(s, ch)
                assert (len(ids) > 0) == bool(text.strip()), (t.traj_id, k, ch)
                assert tokenizer.decode(ids).strip()[:20] in text
            assert np.any((R.step == k) & (R.channel == CHANNEL_ID["fn"])) == bool(s.fn)


def test_a_broken_record_names_its_file_line_and_field(tmp_path):
    """Strict parsing: the error names the field of the user's file (not an internal message list);
    --skip-bad keeps the other records and lists the broken one."""
    lines = _lines(OH_RUN / "output.jsonl")
    del lines[0]["history"][4]["tool_call_metadata"]["model_response"]["choices"][0]["message"]["tool_calls"][0][
        "function"]["name"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "output.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    res = import_paths([tmp_path / "run"], skip_bad=True)
    assert sorted(t.instance_id for t in res.trajectories) == ["astropy__astropy-12907", "sympy__sympy-20590"]
    (bad,) = res.skipped
    assert (bad.line, bad.field) == (1, "history[4].tool_call_metadata.model_response.choices[0].message."
                                        "tool_calls[0].function.name")
    traj = json.loads((SWE1_FC / "django__django-11099" / "django__django-11099.traj").read_text())
    traj["history"][4]["tool_calls"] = [{"id": "toolu_02", "type": "function"}]
    one = tmp_path / "swe" / "django__django-11099"
    one.mkdir(parents=True)
    (one / "django__django-11099.traj").write_text(json.dumps(traj))
    with pytest.raises(RecordError, match=r"field 'history\[4\]\.tool_calls\[0\]\.function': is missing"):
        import_paths([tmp_path / "swe"])
    del traj["trajectory"][-1]
    (one / "django__django-11099.traj").write_text(json.dumps(traj))
    with pytest.raises(RecordError, match="has 3 assistant messages for 2 trajectory steps"):
        import_paths([tmp_path / "swe"])
