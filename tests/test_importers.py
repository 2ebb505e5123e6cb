"""Importers: every real file of the shared dataset, hand-written fixtures of the other formats,
strict errors, --skip-bad, labels, the canonical JSONL round trip and the CLI."""
from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latentsift.cli import app
from latentsift.trajectories.importers import RecordError, import_paths, load_pools
from latentsift.trajectories.trajectory import Step, Trajectory, load_jsonl, save_jsonl

FIX = Path(__file__).parent / "fixtures" / "trajectories"


@pytest.fixture(scope="session")
def csv_rows(data_dir):
    with open(data_dir / "candidates.csv", newline="") as f:
        return {(r["run"], r["instance_id"]): r for r in csv.DictReader(f)}


def _readme_table(data_dir) -> dict[str, dict[str, str]]:
    """The per-run table of the dataset README (run -> column -> cell)."""
    lines = (data_dir / "README.md").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| run | agent | candidates"))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for l in lines[start + 2:]:
        if not l.startswith("|"):
            break
        cells = [c.strip() for c in l.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells))
    return rows


def test_shared_dataset_counts_match_readme(shared_import, data_dir):
    s = shared_import.summary
    readme = (data_dir / "README.md").read_text()
    m = re.search(r"Candidates: (\d+) \((\d+) ACR, (\d+) SWE-agent\)", readme)
    total, acr, swe = map(int, m.groups())
    agents = Counter(t.agent for t in shared_import.trajectories)
    assert (s.n_trajectories, agents["acr"], agents["sweagent"]) == (total, acr, swe)
    assert s.n_instances == int(re.search(r"Instances: (\d+)", readme).group(1))
    per = dict((int(k), int(n)) for k, n in re.findall(r"(\d+) candidates: (\d+) instances", readme))
    assert s.candidates_per_instance == per
    table = _readme_table(data_dir)
    assert set(s.runs) == set(table)
    for run, row in table.items():
        r = s.runs[run]
        assert r["agent"] == row["agent"]
        assert r["candidates"] == int(row["candidates"])
        assert r["resolved"] == int(row["resolved"])
        assert r["unknown"] == 0
        med, mx = re.match(r"(\d+) \((\d+)\)", row["steps median (max)"]).groups()
        assert (r["steps_median"], r["steps_max"]) == (float(med), int(mx))
    assert s.skipped_records == [] and not any("disagreement" in w for w in s.warnings)


def test_shared_dataset_every_trajectory_matches_candidates_csv(shared_import, csv_rows):
    trajs = shared_import.trajectories
    assert {(t.run, t.instance_id) for t in trajs} == set(csv_rows)
    for t in trajs:
        row = csv_rows[(t.run, t.instance_id)]
        assert t.traj_id == f"{t.run}/{t.instance_id}"
        assert t.label == int(row["resolved"]) and t.repo == row["repo"]
        assert t.n_steps == int(row["n_steps"])
        expected_tests = {k: int(row[k]) for k in ("f2p_passed", "f2p_total", "p2p_passed", "p2p_total") if row[k]}
        assert t.tests == expected_tests


def test_shared_dataset_leaking_runs_marked(shared_import):
    s = shared_import.summary
    assert s.leaking_runs == ["acr-val-only", "acr-val-sbfl"]
    for t in shared_import.trajectories:
        assert t.meta.get("leaks_label", False) == (t.run in s.leaking_runs)
    assert "acr-val-only" in s.to_text() and "LEAKS LABEL" in s.to_text()


def test_acr_structure(shared_import):
    acr = [t for t in shared_import.trajectories if t.agent == "acr"]
    t = next(x for x in acr if x.traj_id == "acr-run-1/astropy__astropy-12907")
    assert t.task_prompt.startswith("Modeling's `separability_matrix`")
    assert [m["role"] for m in t.context] == ["system", "user", "user"] and t.system_prompt == t.context[0]["content"]
    assert t.steps[0].fn.startswith("<function=search_method>") and t.steps[1].fn == ""  # analysis step: no call
    # observations split into one user message per part, joined by the separator in obs
    s0 = t.steps[0]
    users = [m for m in s0.layout if m["role"] == "user"]
    assert [p[-1] for m in users for p in m["parts"] if p[0] == "obs"] == s0.meta["obs_msg_chars"]
    assert sum(s.fn.count("<function=") for s in t.steps) >= 3
    assert t.patch.startswith("diff --git") and t.meta["exit_reason"] == "applicable_patch"


def test_sweagent_structure(shared_import):
    swe = [t for t in shared_import.trajectories if t.agent == "sweagent"]
    for t in swe:
        assert t.context[0]["role"] == "system" and t.context[1]["role"] == "user"
        assert t.task_prompt in t.context[1]["content"] and "ISSUE:" not in t.task_prompt
        for s in t.steps[:-1]:
            assert s.obs.endswith("bash-$")                     # the observation exactly as sent
    t = next(x for x in swe if x.traj_id == "cost_2_2/astropy__astropy-12907")
    assert t.steps[0].fn == "create bug_reproduction.py\n"
    assert t.steps[0].cot.startswith("First, let's replicate the bug")
    assert t.reward == 0.0
    exits = [s for t in swe for s in t.steps if "scaffold_exit" in s.meta]
    assert exits and all(s.cot == "" and s.fn == "" for s in exits)   # "Exit due to cost limit" is not model text


def test_sweagent_steps_match_raw_files(shared_import, data_dir):
    import tarfile
    by_id = {t.traj_id: t for t in shared_import.trajectories}
    n = 0
    with tarfile.open(data_dir / "sweagent" / "cost_2_3.tar.gz") as tf:
        for m in tf.getmembers()[::25]:
            if not m.name.endswith(".traj"):
                continue
            raw = json.load(tf.extractfile(m))
            t = by_id["cost_2_3/" + Path(m.name).stem]
            assert t.patch == (raw["info"].get("submission") or "")
            for s, r in zip(t.steps, raw["trajectory"], strict=True):
                if r["response"] == r["thought"] + "```\n" + r["action"] + "```":
                    assert (s.cot, s.fn) == (r["thought"], r["action"])
                    assert s.obs.startswith(r["observation"])
                    n += 1
    assert n > 50


def test_canonical_roundtrip_byte_for_byte(shared_import, tmp_path):
    sample = shared_import.trajectories[::97] + import_paths([FIX / "openai_toolcalls.jsonl", FIX / "mini_run"]).trajectories
    p1, p2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    save_jsonl(sample, p1)
    loaded = load_jsonl(p1)
    save_jsonl(loaded, tmp_path / "c.jsonl")
    assert (tmp_path / "c.jsonl").read_bytes() == p1.read_bytes()
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in sample]
    save_jsonl(loaded, p2)
    assert [t.to_dict() for t in load_jsonl(p2)] == [t.to_dict() for t in sample]
    # canonical JSONL imports again unchanged
    again = import_paths([p1]).trajectories
    assert [t.to_dict() for t in again] == [t.to_dict() for t in sample]
    pools = load_pools(p1)
    assert sum(p.k for p in pools) == len(sample)


def test_openai_tool_calls_fixture():
    r = import_paths([FIX / "openai_toolcalls.jsonl"])
    assert r.summary.files == {"openai": 1}
    t0, t1 = r.trajectories
    assert (t0.traj_id, t0.reward, t1.reward) == ("vllm-qwen-run/astropy__astropy-12907", 1.0, 0.0)
    assert t0.task_prompt.startswith("Fix the bug described in issue astropy__astropy-12907")
    assert [m["role"] for m in t0.context] == ["system", "user"]
    s1 = t0.steps[1]      # two parallel calls, two tool replies
    assert s1.fn_style == "tool_calls" and s1.obs_role == "tool" and s1.cot == ""
    assert [json.loads(l)["arguments"]["command"] for l in s1.fn.split("\n")] == [
        "grep -n 'cright' astropy/modeling/separable.py", "git status"]
    assert s1.obs.split("\n\n")[1].startswith("On branch main")
    assert [m.get("tool_call_id") for m in s1.layout[1:]] == ["call_2", "call_3"]
    assert t1.steps[0].cot.startswith("The issue mentions separability_matrix") and \
        t1.steps[0].cot.endswith("Let me look at the file first.")       # reasoning_content, then content


def test_openhands_completion_log_and_harness_report():
    r = import_paths([FIX / "openhands_run"])
    (t,) = r.trajectories
    assert (t.traj_id, t.reward) == ("openhands_run/django__django-11099", 1.0)
    assert t.tests == {"f2p_passed": 2, "f2p_total": 2, "p2p_passed": 1, "p2p_total": 2}
    assert t.n_steps == 3 and json.loads(t.steps[-1].fn)["name"] == "finish"   # the logged response is a step
    assert json.loads(t.steps[1].fn)["arguments"]["new_str"] == "regex = r'\\A[\\w.@+-]+\\Z'"


def test_minisweagent_fixture_and_run_report():
    r = import_paths([FIX / "mini_run"])
    (t,) = r.trajectories
    assert t.source_format == "minisweagent" and t.reward == 0.0    # from the harness summary beside it
    assert t.task_prompt.startswith("UsernameValidator allows trailing newline")
    s0, s1, s2 = t.steps[:3]
    assert s0.fn == 'grep -rn "UsernameValidator" django/contrib/auth/validators.py'
    assert s0.cot == "THOUGHT: I need to find the validators first.\n\n"
    assert s1.fn == "" and s1.meta["format_error"] == "2 bash blocks"      # two blocks: no call
    assert s2.cot.endswith("\nThis should fix both.")                        # text after the block is cot
    assert any("predictions file" in why for _, why in r.summary.skipped_files)


def test_malformed_errors_name_file_line_field():
    with pytest.raises(RecordError) as e:
        import_paths([FIX / "malformed.jsonl"])
    assert e.value.line == 2 and str(e.value).startswith(f"{FIX / 'malformed.jsonl'}:2:")
    r = import_paths([FIX / "malformed.jsonl"], skip_bad=True)
    assert [t.instance_id for t in r.trajectories] == ["astropy__astropy-13033"]
    assert [(s.line, s.field) for s in r.skipped] == [(2, None), (3, "messages[3].role")]
    text = r.summary.to_text()
    assert "2 record(s) skipped" in text and "malformed.jsonl:3: field 'messages[3].role': is missing" in text


def test_malformed_r2egym_record_names_field(tmp_path, data_dir):
    import gzip
    with gzip.open(data_dir / "r2egym" / "acr-run-1.jsonl.gz", "rt") as f:
        rec = json.loads(f.readline())
    rec["trajectory_steps"][2]["info"]["obs_msg_chars"][0] += 1
    bad = tmp_path / "acr-bad.jsonl"
    bad.write_text(json.dumps(rec) + "\n")
    with pytest.raises(RecordError, match=r"acr-bad.jsonl:1: field 'trajectory_steps\[2\].info.obs_msg_chars'"):
        import_paths([bad])
    del rec["trajectory_steps"][0]["observation"]
    bad.write_text("\n" + json.dumps(rec) + "\n")
    r = import_paths([bad], skip_bad=True)
    assert r.trajectories == [] and [(s.line, s.field) for s in r.skipped] == [(2, "trajectory_steps[0].observation")]


def test_duplicates_and_forced_format_are_reported(tmp_path):
    with pytest.raises(RecordError, match="duplicate 'vllm-qwen-run/astropy__astropy-12907'"):
        import_paths([FIX / "openai_toolcalls.jsonl", FIX / "openai_toolcalls.jsonl"])
    with pytest.raises(RecordError, match="trajectory_steps"):
        import_paths([FIX / "openai_toolcalls.jsonl"], format="r2egym")
    r = import_paths([FIX / "mini_run"], format="openai")            # forced: the fenced command stays text
    assert r.trajectories[0].steps[0].fn == "" and r.trajectories[0].source_format == "openai"


def test_labels_csv_from_option(tmp_path):
    table = tmp_path / "labels.csv"
    table.write_text("run,agent,instance_id,repo,resolved,f2p_passed,f2p_total,p2p_passed,p2p_total\n"
                     "mini_run,minisweagent,django__django-11099,django/django,1,1,1,,\n"
                     "mini_run,minisweagent,django__django-99999,django/django,0,,,,\n")
    r = import_paths([FIX / "mini_run"], labels=table)
    (t,) = r.trajectories
    assert t.tests == {"f2p_passed": 1, "f2p_total": 1}
    assert t.reward == 0.0            # the harness summary beside the file wins; the disagreement is reported
    assert any("1 label disagreement" in w for w in r.summary.warnings)
    assert any("1 labels-table rows match no imported trajectory" in w for w in r.summary.warnings)
    table.write_text("run,instance_id,resolved\nmini_run,django__django-11099,yes\n")
    with pytest.raises(RecordError, match=r"labels.csv:2: field 'resolved'"):
        import_paths([FIX / "mini_run"], labels=table)


def test_cli_import(tmp_path):
    from latentsift.cli import app
    out = tmp_path / "pools.jsonl"
    res = CliRunner().invoke(app, ["import", str(FIX / "openai_toolcalls.jsonl"), str(FIX / "openhands_run"),
                                   str(FIX / "mini_run"), str(FIX / "malformed.jsonl"), "--out", str(out),
                                   "--skip-bad", "--summary-json", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert "5 trajectories" in res.output and "2 record(s) skipped" in res.output
    trajs = load_jsonl(out)
    assert len(trajs) == 5 and [t.instance_id for t in trajs] == sorted(t.instance_id for t in trajs)
    s = json.loads((tmp_path / "s.json").read_text())
    assert len(s["skipped_records"]) == 2 and s["n_trajectories"] == 5
    res = CliRunner().invoke(app, ["import", str(FIX / "malformed.jsonl"), "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code != 0 and not (tmp_path / "x.jsonl").exists()


def test_step_layout_default_and_checks():
    s = Step(cot="think", fn="ls", obs="a b")
    assert s.messages_layout() == [{"role": "assistant", "parts": [["cot", 5], ["markup", "\n\n"], ["fn", 2]]},
                                   {"role": "user", "parts": [["obs", 3]]}]
    t = Trajectory("r/i", "i", "", "task", [s], system_prompt="sys")
    assert t.context_messages() == [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]


def test_the_verified_pairs_import_with_their_steps_and_labels(data_dir):
    """Both files of the SWE-bench Verified pairs: R2E-Gym records (Gemini / mini-swe-agent) and OpenAI
    chat records whose last reply is ``final_response`` (OpenHands): steps and labels as candidates.csv."""
    import csv

    from latentsift.trajectories.importers import import_paths

    d = data_dir.parent / "swebench-verified-pairs"
    res = import_paths([d / "gemini-3-pro_mini-swe-agent.jsonl.gz", d / "openhands_claude-3.5-sonnet.jsonl.gz"],
                       labels=[d / "candidates.csv"])
    rows = {(r["run"], r["instance_id"]): r for r in csv.DictReader(open(d / "candidates.csv"))}
    trajs = res.trajectories
    assert len(trajs) == len(rows) == 1000
    assert {t.agent for t in trajs} == {"minisweagent", "openhands"}
    for t in trajs:
        r = rows[(t.run, t.instance_id)]
        assert t.n_steps == int(r["n_steps"]) and t.label == int(r["resolved"])
    oh = next(t for t in trajs if t.agent == "openhands" and t.steps[-1].fn)
    assert json.loads(oh.steps[-1].fn)["name"]  # the final_response's call is the last step


def test_the_scaffold_comes_from_the_data_or_the_user_never_the_file_format(data_dir, tmp_path):
    from latentsift.deploy.library import library_groups
    from latentsift.deploy.shift import scaffold_of
    verified = data_dir.parent / "swebench-verified-pairs" / "gemini-3-pro_mini-swe-agent.jsonl.gz"
    lite = import_paths([data_dir / "r2egym"]).trajectories[:6]
    gemini = import_paths([verified]).trajectories[:6]
    assert {t.source_format for t in lite + gemini} == {"r2egym"}  # one file format, two scaffolds
    assert {scaffold_of(t) for t in lite} == {"acr"} and {scaffold_of(t) for t in gemini} == {"minisweagent"}
    # no sub-bank joins AutoCodeRover and mini-swe-agent because they share a format
    assert list(library_groups(lite + gemini)) == ["agent:acr", "agent:minisweagent"]
    # the user may name it at import; it is recorded in each trajectory
    out = tmp_path / "p.jsonl"
    r = CliRunner().invoke(app, ["import", str(FIX / "mini_run"), "--scaffold", "my-scaffold", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert {scaffold_of(t) for t in load_jsonl(out)} == {"my-scaffold"}


def _nothing_inputs(tmp: Path) -> dict:
    """name -> (import arguments, words of the one-line refusal): inputs that carry no trajectory."""
    (tmp / "empty.jsonl").write_text("")
    (tmp / "nomsg.jsonl").write_text('{"foo": 1}\n{"bar": 2}\n')
    (tmp / "empty-dir").mkdir()
    (tmp / "other-dir").mkdir()
    (tmp / "other-dir" / "README.txt").write_text("hello")
    return {
        "empty file": ([tmp / "empty.jsonl"], "1 JSONL file(s) with no record (empty)"),
        "no messages, skipped": ([tmp / "nomsg.jsonl", "--format", "openai", "--skip-bad"],
                                 "2 record(s) ignored (field 'messages': is missing"),
        "empty folder": ([tmp / "empty-dir"], "no file found"),
        "unrelated files": ([tmp / "other-dir"], "1 file(s) not read", "README.txt: not a trajectory"),
        "predictions only": ([FIX / "mini_run" / "preds.json"], "predictions file"),
    }


@pytest.mark.parametrize("case", ["empty file", "no messages, skipped", "empty folder", "unrelated files",
                                  "predictions only"])
def test_an_input_with_no_trajectory_is_refused_saying_what_was_ignored(case, tmp_path):
    from latentsift.cli import app
    args, *words = _nothing_inputs(tmp_path)[case]
    out = tmp_path / "pools.jsonl"
    r = CliRunner().invoke(app, ["import", *map(str, args), "--out", str(out)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    (line,) = [l for l in r.output.splitlines() if l.startswith("error: ")]
    assert line.startswith(f"error: read 0 trajectories from {args[0]}: ") and line.endswith("Nothing to import.")
    assert all(w in line for w in words), line
    assert not out.exists()


def test_a_labels_file_that_labels_nothing_is_refused_and_what_one_labels_is_said(tmp_path, data_dir):
    from latentsift.cli import app
    header = (data_dir / "candidates.csv").read_text().splitlines()[0]
    (tmp_path / "header.csv").write_text(header + "\n")
    (tmp_path / "report.json").write_text(json.dumps({"x__y-1": {"resolved": True}}))
    cases = {"header.csv": "it holds no row, a header only",
             "report.json": "it names 1 instance(s), e.g. 'x__y-1'",
             str(data_dir / "candidates.csv"): "rows name runs ['acr-run-1'"}
    for name, words in cases.items():
        labels = tmp_path / name if not name.startswith("/") else Path(name)
        r = CliRunner().invoke(app, ["import", str(FIX / "mini_run"), "--labels", str(labels),
                                     "--out", str(tmp_path / "p.jsonl")])
        assert r.exit_code == 2, r.output
        (line,) = [l for l in r.output.splitlines() if l.startswith("error: ")]
        assert f"{labels} labels none of the 1 imported trajectories (" in line and words in line, line
    assert not (tmp_path / "p.jsonl").exists()
    table = tmp_path / "labels.csv"
    table.write_text("run,instance_id,resolved\nmini_run,django__django-11099,0\n")
    r = import_paths([FIX / "mini_run"], labels=table)
    assert r.summary.label_files[str(table)] == 1 and f"labels from {table}: 1 of 1 trajectories" in r.summary.to_text()
