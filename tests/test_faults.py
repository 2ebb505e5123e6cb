"""Bad inputs and faults against every command that writes: exit code 2, one line naming the problem,
no traceback, inputs byte-identical afterwards (hashed), no stray temporary files.

Most cases need no model: the fixture trajectories (tests/fixtures) and the shared dataset. Cases that
need a store, bank, scorer or run folder reuse the session's tiny end-to-end run (conftest
``tiny_run``) instead of extracting again.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import refused  # tests/conftest.py
from latentsift.states import extract as extraction
from latentsift.cli import app
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl

FIX = Path(__file__).parent / "fixtures" / "trajectories"


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def digest(*paths: Path) -> dict[str, str]:
    """sha256 of every file under ``paths`` (files or folders), by path."""
    out = {}
    for p in paths:
        for f in ([p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())):
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def no_tmp(*folders: Path) -> None:
    stray = [p for d in folders for p in d.rglob("*") if ".tmp" in p.name]
    assert not stray, stray


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> Path:
    """A canonical JSONL of the fixture trajectories (written by the import command itself)."""
    d = tmp_path_factory.mktemp("canon")
    r = cli("import", FIX / "openai_toolcalls.jsonl", FIX / "mini_run", "--out", d / "pools.jsonl")
    assert r.exit_code == 0, r.output
    return d / "pools.jsonl"


# --------------------------------------------------------------------------- section 3: values
BAD_FIELDS = {
    "reward NaN": (lambda d: d.__setitem__("reward", float("nan")), "'reward'"),
    "reward string": (lambda d: d.__setitem__("reward", "yes"), "'reward'"),
    "reward bool": (lambda d: d.__setitem__("reward", True), "'reward'"),
    "numeric traj_id": (lambda d: d.__setitem__("traj_id", 5), "'traj_id'"),
    "cot a number": (lambda d: d["steps"][0].__setitem__("cot", 5), "'steps[0].cot'"),
    "obs a list": (lambda d: d["steps"][0].__setitem__("obs", [1]), "'steps[0].obs'"),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_import_and_extract_check_every_field_with_file_and_line(case, canonical, tmp_path):
    change, field = BAD_FIELDS[case]
    lines = canonical.read_text().splitlines()
    rec = json.loads(lines[1])
    change(rec)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], json.dumps(rec)] + lines[2:]) + "\n")  # json writes NaN as NaN
    before = digest(bad)
    r = cli("import", bad, "--out", tmp_path / "out.jsonl")
    refused(r, f"{bad}:2", field)
    # extract reads the same records: refused before the model loads, no store started
    r = cli("extract", bad, "--out", tmp_path / "states")
    refused(r, f"{bad}:2", field)
    assert digest(bad) == before and not (tmp_path / "out.jsonl").exists() and not (tmp_path / "states").exists()
    no_tmp(tmp_path)


def test_import_never_writes_a_bare_nan(canonical, tmp_path):
    from latentsift._core.validation import LatentSiftError
    t = load_jsonl(canonical)[0]
    t.meta["score"] = float("nan")
    with pytest.raises(LatentSiftError, match="NaN"):
        save_jsonl([t], tmp_path / "x.jsonl")
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary


def test_a_truncated_archive_is_a_message(tmp_path):
    import tarfile
    full = tmp_path / "runs.tar.gz"
    with tarfile.open(full, "w:gz") as tf:
        tf.add(FIX / "openai_toolcalls.jsonl", arcname="openai_toolcalls.jsonl")
        tf.add(FIX / "mini_run", arcname="mini_run")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    before = digest(cut)
    r = cli("import", cut, "--out", tmp_path / "out.jsonl")
    refused(r, str(cut), "truncated or corrupt")
    assert digest(cut) == before and not (tmp_path / "out.jsonl").exists()


def test_extract_option_errors_come_before_the_model(canonical, tmp_path):
    for opt, value in (("--chunk-tokens", 0), ("--shard-size", -1), ("--threads", 0), ("--max-span-tokens", 0)):
        r = cli("extract", canonical, "--out", tmp_path / "s", opt, value)
        refused(r, opt)
        assert "extract_pools" not in r.output and "model:" not in r.output and "loading the model" not in r.output
    refused(cli("extract", canonical, "--out", tmp_path / "s", "--layers", "x"), "--layers")
    refused(cli("extract", canonical, "--out", tmp_path / "s", "--dtype", "int8"), "--dtype")
    refused(cli("extract", canonical, "--out", tmp_path / "s", "--model", tmp_path / "nope"), "--model")
    assert not (tmp_path / "s").exists()


def test_extract_layers_out_of_range_are_refused_from_the_config(canonical, tmp_path, monkeypatch):
    """Layer indices beyond the model's 30 layers: refused from its config, before the weights load."""
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before --layers was checked")

    monkeypatch.setattr(extraction, "load_policy", no_load)  # the local backend loads the policy there
    for value in ("10,99", "0,30", "10,20"):  # beyond L; below 1; without the final layer
        refused(cli("extract", canonical, "--out", tmp_path / "s", "--layers", value), "layers", "1..30")
    assert not (tmp_path / "s").exists()


def test_reproduce_checks_its_selection_before_any_work(data_dir, tmp_path):
    refused(cli("reproduce", "--data", data_dir, "--out", tmp_path / "run", "--max-instances", -4),
            "--max-instances")
    assert not (tmp_path / "run").exists()
    # 8 instances cannot give 4 repository folds with both classes in every bank: said before extraction
    r = cli("reproduce", "--data", data_dir, "--out", tmp_path / "run", "--max-instances", 8)
    refused(r, "fold", "--folds")
    assert not (tmp_path / "run" / "states").exists()


def test_fold_errors_name_the_group_kind(canonical, data_dir, tmp_path):
    from latentsift._core.validation import LatentSiftError
    from latentsift.protocol.reproduction import ReproduceRun, ReproduceSettings
    trajs = load_jsonl(canonical)
    for group_by, noun in (("instance", "instances"), ("repo", "repositories")):
        run = ReproduceRun(ReproduceSettings(data=str(data_dir), out=str(tmp_path / "run"), group_by=group_by, n_folds=9), log=lambda m: None)
        with pytest.raises(LatentSiftError, match=f"come from {len({run.group(t) for t in trajs})} {noun}"):
            run.folds(trajs)


def test_filter_show_must_not_be_negative(canonical, tmp_path):
    refused(cli("filter", canonical, "--states", tmp_path / "s", "--method", "random", "--show", -1,
                "--out", tmp_path / "f.json"), "--show")
    assert not (tmp_path / "f.json").exists()


# --------------------------------------------------------------------------- section 4: the file system
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_failing_write_is_a_message_and_leaves_nothing(code, canonical, tmp_path, monkeypatch):
    """A full disk, a read-only file system, a folder without write permission (simulated at the
    write: the tests may run as root, whom permissions do not stop)."""
    def failing_fsync(fd):
        raise OSError(code, os.strerror(code))

    out = tmp_path / "out"
    before = digest(canonical)
    # the write itself fails: import (streamed JSONL) and the atomic writers (fsync)
    monkeypatch.setattr("latentsift.trajectories.trajectory.dumps", lambda t: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
    r = cli("import", canonical, "--out", out / "pools.jsonl", "--format", "canonical")
    refused(r, str(out / "pools.jsonl"), {errno.ENOSPC: "no space", errno.EROFS: "read-only",
                                          errno.EACCES: "permission"}[code])
    monkeypatch.undo()
    monkeypatch.setattr(os, "fsync", failing_fsync)
    r = cli("import", canonical, "--out", out / "p2.jsonl", "--summary-json", out / "summary.json")
    refused(r, str(out / "summary.json"))
    assert digest(canonical) == before and not (out / "pools.jsonl").exists() and not (out / "summary.json").exists()
    no_tmp(tmp_path)


def test_a_read_only_output_is_refused_before_any_work(canonical, tmp_path, monkeypatch):
    """What ``os.access`` reports for a read-only mount (also to root): refused before reading inputs."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == tmp_path else real(p, mode, **k))
    for args in (["import", canonical], ["extract", canonical], ["bank", "build", canonical, "--states", tmp_path / "s"],
                 ["fit", canonical, "--states", tmp_path / "s"]):
        refused(cli(*args, "--out", tmp_path / "out"), "is read-only")
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_folder_is_a_message(canonical, tmp_path):
    """A real read-only folder where permissions apply (not as root)."""
    if os.geteuid() == 0:
        pytest.skip("root ignores folder permissions (the simulated case above covers the message)")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        refused(cli("import", canonical, "--out", ro / "x.jsonl"), "permission denied")
    finally:
        ro.chmod(0o700)
    assert list(ro.iterdir()) == []


# --------------------------------------------------------------------------- section 2: outputs vs inputs
def test_import_out_over_its_input(canonical, tmp_path):
    src = tmp_path / "pools.jsonl"
    shutil.copy(canonical, src)
    before = digest(src)
    refused(cli("import", src, "--out", src), "is the input")
    refused(cli("import", FIX / "mini_run", "--out", FIX / "mini_run" / "x.jsonl"), "lies inside the input")
    assert digest(src) == before and not (FIX / "mini_run" / "x.jsonl").exists()


def test_explore_page_names_are_unique_and_it_deletes_only_its_files(canonical, tmp_path):
    from latentsift._core.outputs import SITE_MANIFEST
    from latentsift.report.explore.site import write_site
    t1, t2 = load_jsonl(canonical)[:2]
    t1.instance_id, t1.traj_id = "proj/x-1", "run/proj/x-1"
    t2.instance_id, t2.traj_id = "proj_x-1", "run/proj_x-1"
    out = tmp_path / "site"
    (out / "instances").mkdir(parents=True)
    (out / "instances" / "mine.html").write_text("the user's page")
    (out / "notes.txt").write_text("the user's notes")
    write_site(out, [t1, t2])
    pages = sorted(p.name for p in (out / "instances").iterdir())
    assert len(pages) == 3 and "mine.html" in pages  # two distinct pages + the user's
    listed = json.loads((out / SITE_MANIFEST).read_text())["files"]
    assert all((out / f).is_file() for f in listed) and "instances/mine.html" not in listed
    # a rerun with one page fewer removes that page (listed) and nothing of the user's
    write_site(out, [t1])
    assert sorted(p.name for p in (out / "instances").iterdir()) == ["mine.html", "proj_x-1.html"]
    assert (out / "instances" / "mine.html").read_text() == "the user's page"
    assert (out / "notes.txt").read_text() == "the user's notes"
    no_tmp(tmp_path)


# --------------------------------------------------------------------------- on the tiny run's artefacts
@pytest.fixture(scope="module")
def tiny(tiny_run, tmp_path_factory, one_torch_thread):
    """The tiny run's folder, a sifter fitted from it (by the CLI) and copies of its bank outside it."""
    run = Path(tiny_run["out"])
    d = tmp_path_factory.mktemp("faults")
    r = cli("fit", run / "pools.jsonl", "--states", run / "states", "--out", d / "sifter", "--scorer-epochs", 2)
    assert r.exit_code == 0, r.output
    shutil.copytree(run / "folds" / "fold-0" / "paper" / "bank", d / "bank")
    return run, d


@pytest.mark.model
def test_no_output_may_destroy_an_input_or_another_artefact(tiny, data_dir, tmp_path):
    run, d = tiny
    pools, states, report = run / "pools.jsonl", run / "states", run / "report"
    fold = run / "folds" / "fold-0" / "paper"
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    before = digest(run, d, user)
    cases = [
        (["bank", "build", pools, "--states", states, "--out", states], "is the input"),
        (["bank", "build", pools, "--states", states, "--out", fold / "bank"], "a run folder"),
        (["scorer", "train", d / "bank", "--out", states / "scorer"], "a state store"),
        (["scorer", "train", d / "bank", "--out", d / "sifter" / "scorer"], "a sifter"),
        (["filter", pools, "--states", states, "--bank", fold / "bank", "--out", pools], "is the input"),
        (["filter", pools, "--states", states, "--sifter", d / "sifter", "--out", d / "sifter" / "f.json"],
         "lies inside the input"),
        (["filter", d / "nope.jsonl", "--states", d / "nope", "--method", "random", "--out", d / "sifter" / "f.json"],
         "a sifter"),
        (["fit", pools, "--states", states, "--out", user], "non-empty folder"),
        (["fit", pools, "--states", states, "--out", d / "bank"], "a bank"),
        (["extract", pools, "--out", d / "bank"], "a bank"),
        (["crossval", pools, "--states", states, "--out", states], "is the input"),
        (["evaluate", d / "p.jsonl", "--scores", run / "verifier", "--out", report], "a run folder"),
        (["explore", run / "stage1" / "latentsift.json", "--pools", pools, "--out", pools], "is the input"),
        (["explore", run / "stage1" / "latentsift.json", "--pools", pools, "--out", user], "non-empty folder"),
        (["verify", pools, "--out", states], "is a state store"),
        (["reproduce", "--data", data_dir, "--out", states], "is a state store"),
        (["reproduce", "--data", data_dir, "--out", data_dir / "x"], "lies inside the input"),
        (["import", pools, "--out", d / "bank" / "pools.jsonl"], "a bank"),
    ]
    for args, words in cases:
        refused(cli(*args), words)
    assert digest(run, d, user) == before
    no_tmp(run, d, user)


@pytest.mark.model
def test_filter_refuses_a_bank_of_other_span_settings_and_a_manifest_naming_outside_files(tiny, tmp_path):
    run, d = tiny
    pools, states = run / "pools.jsonl", run / "states"
    r = cli("bank", "build", pools, "--states", states, "--out", tmp_path / "bank")
    assert r.exit_code == 0, r.output
    other = tmp_path / "states-other"
    shutil.copytree(states, other)
    man = json.loads((other / "manifest.json").read_text())
    man["settings"]["max_span_tokens"] = 64
    (other / "manifest.json").write_text(json.dumps(man))
    before = digest(other, tmp_path / "bank")
    refused(cli("filter", pools, "--states", other, "--bank", tmp_path / "bank", "--distance-only",
                "--out", tmp_path / "f.json"), "max_span_tokens=8 (these states: 64)")
    refused(cli("filter", pools, "--states", other, "--sifter", d / "sifter", "--out", tmp_path / "f.json"),
            "max_span_tokens=8 (these states: 64)")
    # a bank manifest that names a file outside its folder is refused with the reason
    bad = tmp_path / "bad-bank"
    shutil.copytree(tmp_path / "bank", bad)
    man = json.loads((bad / "manifest.json").read_text())
    man["tensors"] = "../bank/bank.safetensors"
    (bad / "manifest.json").write_text(json.dumps(man))
    refused(cli("filter", pools, "--states", states, "--bank", bad, "--distance-only", "--out", tmp_path / "f.json"),
            "inside its own folder")
    # Stage 1 must keep someone
    refused(cli("filter", pools, "--states", states, "--bank", tmp_path / "bank", "--distance-only",
                "--min-keep", 0, "--frac", 0, "--out", tmp_path / "f.json"), "--min-keep")
    assert digest(other, tmp_path / "bank") == before and not (tmp_path / "f.json").exists()


@pytest.mark.model
def test_a_resumed_store_trusts_no_damaged_shard(tiny, tmp_path):
    from latentsift.states.store import StateStore
    run, _ = tiny
    copy = tmp_path / "states"
    shutil.copytree(run / "states", copy)
    store = StateStore(copy).open()
    n = len(store)
    shard = sorted((copy / "shards").iterdir())[0]
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    with store.lock():
        dropped = StateStore(copy).open().drop_damaged()
    assert dropped and all(not StateStore(copy).open().has(t) for t in dropped)
    assert len(StateStore(copy).open()) == n - len(dropped) and not shard.exists()
    StateStore(copy).open().verify()  # what is left is whole


@pytest.mark.model
def test_write_report_writes_summary_last(tiny_run, tmp_path, monkeypatch):
    import latentsift.report.report as report
    summary = json.loads(tiny_run["summary"])
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # an older, finished report
    monkeypatch.setattr(report, "render_markdown", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(RuntimeError):
        report.write_report(summary, out)
    assert not (out / "summary.json").exists()  # a crash never leaves a summary that reads as finished
    monkeypatch.undo()
    report.write_report(summary, out)
    assert json.loads((out / "summary.json").read_text()) == summary


def test_malformed_inputs_name_their_file(tmp_path, data_dir):
    junk, binary = tmp_path / "junk.jsonl", tmp_path / "bin.jsonl"
    junk.write_text("not json\n")
    binary.write_bytes(b"\xff\xfe bad")
    refused(cli("import", junk, "--out", tmp_path / "o.jsonl"), f"{junk}:1", "not valid JSON")
    refused(cli("extract", binary, "--out", tmp_path / "s"), f"{binary}:1", "not UTF-8")
    refused(cli("explore", junk, "--pools", junk, "--out", tmp_path / "site"), str(junk), "not valid JSON")
    refused(cli("evaluate", binary, "--scores", tmp_path / "sc", "--out", tmp_path / "r"), str(binary))
    refused(cli("reproduce", "--data", tmp_path / "nope", "--out", tmp_path / "run"), "dataset folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin.jsonl", "junk.jsonl"]  # nothing written


@pytest.mark.model
def test_a_full_disk_during_filter_bank_and_fit_leaves_nothing(tiny, tmp_path, monkeypatch):
    run, d = tiny
    pools, states = run / "pools.jsonl", run / "states"
    before = digest(run, d)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "out"
    for args in (["bank", "build", pools, "--states", states, "--out", out / "bank"],
                 ["fit", pools, "--states", states, "--out", out / "sifter", "--scorer-epochs", 1],
                 ["filter", pools, "--states", states, "--method", "random", "--out", out / "f.json"]):
        refused(cli(*args), "no space left")
    assert digest(run, d) == before
    assert not [p for p in out.rglob("*") if p.is_file()] if out.exists() else True
    assert not (out / "bank").exists() and not (out / "sifter").exists()  # no empty output folders either
    no_tmp(tmp_path, run, d)


# --------------------------------------------------------------------------- the faults left (issue 27)
def test_an_out_inside_a_file_is_refused(canonical, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    for args in (["import", canonical, "--out", blocker / "pools.jsonl"],
                 ["filter", canonical, "--method", "random", "--out", blocker / "f.json"],
                 ["fit", canonical, "--states", tmp_path / "states", "--out", blocker / "sub" / "sifter"],
                 ["bank", "build", canonical, "--states", tmp_path / "states", "--out", blocker / "bank"]):
        refused(cli(*args), f"{blocker} is a file, not a folder")
    assert blocker.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_options_a_sifter_would_ignore_are_refused(canonical, tmp_path):
    for opt, value in (("--fusion-weight", 0.3), ("--distance", "pos"), ("--weighting", "uniform"),
                       ("--channels", "cot")):
        refused(cli("filter", canonical, "--sifter", tmp_path / "s", "--out", tmp_path / "f.json", opt, value),
                "--sifter scores with the settings it was fitted with", f"drop {opt}")
    assert not list(tmp_path.iterdir())


def test_a_second_writer_to_one_out_is_refused(canonical, tmp_path):
    from latentsift._core.io import output_lock
    f, s, b, sc = tmp_path / "f.json", tmp_path / "sifter", tmp_path / "bank", tmp_path / "scorer"
    with output_lock(f), output_lock(s), output_lock(b), output_lock(sc):  # another process writing them
        refused(cli("filter", canonical, "--method", "random", "--out", f), f"Another process is writing to {f}")
        refused(cli("fit", canonical, "--states", tmp_path / "states", "--out", s),
                f"Another process is writing to {s}")
        refused(cli("bank", "build", canonical, "--states", tmp_path / "states", "--out", b),
                f"Another process is writing to {b}")
        refused(cli("scorer", "train", tmp_path / "bank-in", "--out", sc), f"Another process is writing to {sc}")
    assert not f.exists() and not s.exists() and not b.exists() and not sc.exists()
    r = cli("filter", canonical, "--method", "random", "--out", f)  # released: the lock file is gone too
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_malformed_records_of_filter_scores_and_verifier_files_are_one_line(canonical, tmp_path):
    good = tmp_path / "f.json"
    assert cli("filter", canonical, "--method", "random", "--out", good).exit_code == 0
    d = json.loads(good.read_text())
    cases = {"s": ("pools", 0, "candidates", 0, "s", "x"), "traj_id": ("pools", 0, "candidates", 0, "traj_id", 5),
             "retained": ("pools", 0, "candidates", 0, "retained", "yes"), "pool": ("pools", 0, None, None, None, 7)}
    for name, (k, i, k2, j, field_, value) in cases.items():
        bad = json.loads(json.dumps(d))
        if k2 is None:
            bad[k][i] = value
        else:
            bad[k][i][k2][j][field_] = value
        path = tmp_path / f"bad-{name}.json"
        path.write_text(json.dumps(bad))
        refused(cli("explore", path, "--pools", canonical, "--out", tmp_path / "site"), str(path),
                "pools[0]" + (".candidates[0]" if k2 else ""))
    pools = tmp_path / "p.jsonl"
    ids = [c["traj_id"] for c in d["pools"][0]["candidates"]]
    pools.write_text(json.dumps({"instance_id": d["pools"][0]["instance_id"],
                                 "candidates": [{"traj_id": t, "label": 1} for t in ids]}) + "\n")
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps({"traj_id": t, "score": 0.5, "components": [1]}) + "\n" for t in ids))
    refused(cli("evaluate", pools, "--scores", scores, "--out", tmp_path / "r"), f"{scores}:1",
            "'components'")
    verdicts = tmp_path / "ef" / "verdicts.jsonl"
    verdicts.parent.mkdir()
    verdicts.write_text(json.dumps({"kind": "verdict", "traj_id": ids[0], "score": 0.5, "p_yes": "x", "p_no": 0.5,
                                    "n_in": 1, "n_out": 1}) + "\n")
    refused(cli("evaluate", pools, "--scores", verdicts.parent, "--out", tmp_path / "r"),
            f"{verdicts}:1", "wrong type or value")
    assert not (tmp_path / "site").exists() and not (tmp_path / "r").exists()


@pytest.mark.model
def test_filter_with_no_pool_left_is_no_traceback(tiny, tmp_path):
    run, _ = tiny
    pools, states = run / "pools.jsonl", run / "states"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused(cli("filter", empty, "--states", states, "--method", "random", "--out", tmp_path / "f.json"),
            "holds no candidate pools")
    assert cli("bank", "build", pools, "--states", states, "--out", tmp_path / "bank").exit_code == 0
    # the bank holds every pool's instance: with --on-leak skip nothing is left to score
    r = cli("filter", pools, "--states", states, "--bank", tmp_path / "bank", "--distance-only", "--on-leak", "skip",
            "--out", tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    out = json.loads((tmp_path / "f.json").read_text())
    assert out["n_pools"] == 0 and len(out["leak"]["warnings"]) == len({t.instance_id for t in load_jsonl(pools)})


@pytest.mark.model
def test_bank_build_replaces_a_bank_whole_or_not_at_all(tiny, tmp_path, monkeypatch):
    import latentsift.bank.bank as bank_mod
    from latentsift._jobs.bank import build_bank
    run, _ = tiny
    pools, states, bank = run / "pools.jsonl", run / "states", tmp_path / "bank"
    assert cli("bank", "build", pools, "--states", states, "--out", bank).exit_code == 0
    before = digest(bank)
    # a build killed while writing the new bank: the old one is whole, no temporary is left
    monkeypatch.setattr(bank_mod, "write_artefact", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        build_bank(states, pools, center="mean").save(bank)
    monkeypatch.undo()
    assert digest(bank) == before
    no_tmp(tmp_path)
    # what a SIGKILL leaves (a temporary of a process that is gone) is removed by the next build
    stale = tmp_path / ".bank.tmp999999999.1"
    stale.mkdir()
    (stale / "bank.safetensors").write_bytes(b"x" * 100)
    r = cli("bank", "build", pools, "--states", states, "--out", bank, "--center", "mean")
    assert r.exit_code == 0, r.output
    assert digest(bank) != before and json.loads((bank / "manifest.json").read_text())["settings"]["center"] == "mean"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]


@pytest.mark.model
def test_a_scorer_records_its_span_settings_and_train_keeps_other_folders(tiny, tmp_path):
    run, d = tiny
    pools, states = run / "pools.jsonl", run / "states"
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    refused(cli("scorer", "train", d / "bank", "--out", user, "--max-epochs", 1), "non-empty folder")
    assert [p.name for p in user.iterdir()] == ["notes.txt"]
    r = cli("scorer", "train", d / "bank", "--states", states, "--out", tmp_path / "scorer", "--max-epochs", 1)
    assert r.exit_code == 0, r.output
    recorded = json.loads((tmp_path / "scorer" / "scorer.json").read_text())["source"]["store_settings"]
    assert recorded["max_span_tokens"] == 8
    # states of other span settings, with a bank that records none (so only the scorer can tell)
    other = tmp_path / "states-other"
    shutil.copytree(states, other)
    man = json.loads((other / "manifest.json").read_text())
    man["settings"]["max_span_tokens"] = 64
    (other / "manifest.json").write_text(json.dumps(man))
    bare = tmp_path / "bank-bare"
    shutil.copytree(d / "bank", bare)
    bman = json.loads((bare / "manifest.json").read_text())
    bman["source"].pop("store_settings", None)
    (bare / "manifest.json").write_text(json.dumps(bman))
    refused(cli("filter", pools, "--states", other, "--bank", bare, "--scorer", tmp_path / "scorer",
                "--on-leak", "allow", "--out", tmp_path / "f.json"),
            f"The scorer {tmp_path / 'scorer'}", "max_span_tokens=8 (these states: 64)")


@pytest.mark.model
def test_a_damaged_shard_says_a_rerun_repairs_it_and_fit_keeps_the_umask(tiny, tmp_path):
    from latentsift.states.store import StateStore
    run, d = tiny
    mask = os.umask(0)
    os.umask(mask)
    assert (d / "sifter").stat().st_mode & 0o777 == 0o777 & ~mask
    copy = tmp_path / "states"
    shutil.copytree(run / "states", copy)
    shard = sorted((copy / "shards").iterdir())[0]
    shard.write_bytes(shard.read_bytes()[:100])
    store = StateStore(copy).open()
    with pytest.raises(Exception, match="re-run the same 'latentsift extract' command on this store"):
        store.load(store.traj_ids())


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", ["extract", "rollout"])
def test_a_device_this_machine_lacks_or_does_not_know_is_one_line(command, canonical, tmp_path):
    """``--device cuda`` without a GPU (and an unknown device) is refused before the model loads, by both
    commands that run the policy, and nothing is written."""
    head = ["extract", canonical] if command == "extract" else ["rollout", "--tasks", "1"]
    refused(cli(*head, "--out", tmp_path / "cuda", "--device", "cuda"), "--device cuda", "no CUDA device")
    refused(cli(*head, "--out", tmp_path / "tpu", "--device", "tpu"), "--device must be cpu or cuda", "'tpu'")
    assert not any(tmp_path.iterdir())


def test_several_values_after_one_repeatable_flag_are_one_line(canonical, tmp_path):
    """``--k 4 8`` (a list option given its values once) used to read the 8 as a file to open; it is now
    refused before anything runs, saying how to write it. One value per flag still runs."""
    r = cli("transfer", canonical, "--states", tmp_path / "none", "--k", "4", "8", "--out", tmp_path / "t")
    refused(r, "--k takes one value per flag", "--k 4 --k 8")
    r = cli("crossval", canonical, "--states", tmp_path / "none", "--target-recall", "0.9", "0.95",
            "--out", tmp_path / "c")
    refused(r, "--target-recall 0.9 --target-recall 0.95")
    r = cli("transfer", canonical, "--states", tmp_path / "none", "--k", "4", "--k", "8", "--out", tmp_path / "t")
    refused(r, "no state store")     # parsed as before: the next check is the command's own
    assert not any(tmp_path.iterdir())
