"""The last faults, tried as a new user would: internal notes in --help, hand-edited manifests, an
existing --out the command did not write, a second writer, late refusals and leftovers, escaped ids,
inputs that carry nothing. Each refuses with one ``error:`` line (exit code 2, no traceback) or works.

Cases that need a store, bank, scorer or sifter use ``artefacts``: the fixture trajectories extracted
with the packaged model and each artefact written by its own command (about a minute).
"""
from __future__ import annotations

import errno
import json
import os
import shutil

import pytest

from conftest import refused  # tests/conftest.py
from test_faults import canonical, cli, digest  # noqa: F401 (canonical: a fixture shared with test_faults)
from latentsift.cli import app
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl





# --------------------------------------------------------------------------- the last faults
def _commands(group=None, path=()):
    """(path, command) of every command and sub-command of the CLI."""
    import typer.main
    group = group or typer.main.get_command(app)
    for name, cmd in sorted(group.commands.items()):
        yield (*path, name), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))


#: What only a developer should read: reST literals, the form-feed escape, private module names.
INTERNAL = ("``", "\\f", "\f", "_jobs", "_cli", "_core", "latentsift._", "Length:", ":class:", ":func:")


@pytest.mark.parametrize("path", [()] + [p for p, _ in _commands()], ids=lambda p: " ".join(p) or "latentsift")
def test_help_shows_no_internal_note(path):
    r = cli(*path, "--help")
    assert r.exit_code == 0, r.output
    found = [w for w in INTERNAL if w in r.output]
    assert not found, f"'latentsift {' '.join(path)} --help' shows {found}:\n{r.output}"


# --------------------------------------------------------------------------- hand-edited manifests
@pytest.fixture(scope="module")
def artefacts(canonical, tmp_path_factory, one_torch_thread):
    """A store of the fixture trajectories, and a bank, scorer and sifter of its two astropy ones (a
    resolved and an unresolved), each written by its command; ``candidates.jsonl``: the third, scored."""
    d = tmp_path_factory.mktemp("artefacts")
    trajs = load_jsonl(canonical)
    save_jsonl([t for t in trajs if t.repo == "astropy/astropy"], d / "bank.jsonl")
    save_jsonl([t for t in trajs if t.repo != "astropy/astropy"], d / "candidates.jsonl")
    for args in (["extract", canonical, "--out", d / "states", "--threads", 1],
                 ["bank", "build", d / "bank.jsonl", "--states", d / "states", "--out", d / "bank"],
                 ["scorer", "train", d / "bank", "--out", d / "scorer", "--max-epochs", 1, "--val-frac", 0],
                 ["fit", d / "bank.jsonl", "--states", d / "states", "--out", d / "sifter", "--scorer-epochs", 1]):
        r = cli(*args)
        assert r.exit_code == 0, r.output
    return d


#: kind -> (the manifest in its folder, the command that reads it given (artefacts folder, copy, out)).
READERS = {
    "store": ("manifest.json", lambda a, c, o: ["bank", "build", a / "bank.jsonl", "--states", c, "--out", o / "bank"]),
    "bank": ("manifest.json", lambda a, c, o: ["filter", a / "candidates.jsonl", "--states", a / "states", "--bank",
                                               c, "--distance-only", "--out", o / "f.json"]),
    "scorer": ("scorer.json", lambda a, c, o: ["filter", a / "candidates.jsonl", "--states", a / "states", "--bank",
                                               a / "bank", "--scorer", c, "--out", o / "f.json"]),
    "sifter": ("sifter.json", lambda a, c, o: ["filter", a / "candidates.jsonl", "--states", a / "states",
                                               "--sifter", c, "--out", o / "f.json"]),
}
_GONE = object()
#: (kind, what is done) -> (path in the manifest, new value or _GONE, the words of the one-line answer).
EDITS = {
    ("store", "field removed"): (("settings",), _GONE, "field 'settings' is missing"),
    ("store", "fingerprint field removed"): (("fingerprint", "d_model"), _GONE,
                                             "field 'fingerprint.d_model' is missing"),
    ("store", "wrong type"): (("settings", "layers"), "abc", "field 'settings.layers'"),
    ("store", "unknown field"): (("colour",), "blue", "unknown field 'colour'"),
    ("store", "NaN number"): (("settings", "context"), float("nan"), "field 'settings.context'"),
    ("bank", "field removed"): (("trajectories",), _GONE, "field 'trajectories' is missing"),
    ("bank", "label removed"): (("trajectories", 0, "label"), _GONE, "field 'trajectories[0].label' is missing"),
    ("bank", "wrong type"): (("trajectories", 0, "label"), "1", "field 'trajectories[0].label'"),
    ("bank", "wrong value"): (("settings", "channels"), ["cot", "colour"], "field 'settings'"),
    ("bank", "unknown field"): (("settings", "colour"), "blue", "unknown field 'settings.colour'"),
    ("bank", "null number"): (("label_counts", "pos"), None, "field 'label_counts.pos'"),
    ("scorer", "field removed"): (("best_epoch",), _GONE, "field 'best_epoch' is missing"),
    ("scorer", "wrong type"): (("settings", "lr"), "abc", "field 'settings.lr'"),
    ("scorer", "unknown field"): (("settings", "colour"), "blue", "unknown field 'settings.colour'"),
    ("scorer", "NaN number"): (("train_pos_rate",), float("nan"), "field 'train_pos_rate'"),
    ("sifter", "shift_reference removed"): (("shift_reference",), _GONE, "field 'shift_reference' is missing"),
    ("sifter", "config removed"): (("config",), _GONE, "field 'config' is missing"),
    ("sifter", "seen removed"): (("seen",), _GONE, "field 'seen' is missing"),
    ("sifter", "wrong type"): (("library",), "abc", "field 'library'"),
    ("sifter", "wrong value"): (("config", "settings", "distance"), "sideways", "field 'config.settings'"),
    ("sifter", "unknown field"): (("colour",), "blue", "unknown field 'colour'"),
    ("sifter", "NaN quantile"): (("shift_reference", "loo_quantile"), float("nan"),
                                 "field 'shift_reference.loo_quantile' must be a finite"),
    ("sifter", "null quantile"): (("shift_reference", "loo_quantile"), None,
                                  "field 'shift_reference.loo_quantile' must be a finite"),
    ("sifter", "null threshold quantile"): (("shift_reference", "quantile"), None, "field 'shift_reference.quantile'"),
}


@pytest.mark.model
@pytest.mark.parametrize("kind,edit", sorted(EDITS), ids=[f"{k}-{e}" for k, e in sorted(EDITS)])
def test_a_hand_edited_manifest_is_one_line_naming_file_and_field(kind, edit, artefacts, tmp_path):
    name, command = READERS[kind]
    path, value, words = EDITS[(kind, edit)]
    copy = tmp_path / kind
    shutil.copytree(artefacts / ("states" if kind == "store" else kind), copy)
    man = json.loads((copy / name).read_text())
    node = man
    for k in path[:-1]:
        node = node[k]
    if value is _GONE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    (copy / name).write_text(json.dumps(man))  # (json writes NaN as NaN, as a hand edit may)
    before = digest(copy)
    out = tmp_path / "out"
    refused(cli(*command(artefacts, copy, out)), f"{copy / name}: ", words, "edited or damaged")
    assert digest(copy) == before and not out.exists()


@pytest.mark.model
def test_every_manifest_reads_back_and_an_edited_store_index_is_one_line(artefacts, tmp_path):
    import pyarrow.parquet as pq
    from latentsift._core.manifests import FingerprintFields
    from latentsift.states.model import Fingerprint
    assert set(FingerprintFields.model_fields) == {*Fingerprint.__dataclass_fields__, "digest"}
    for kind, (_, command) in READERS.items():  # unedited: every reader accepts what its writer wrote
        src = artefacts / ("states" if kind == "store" else kind)
        r = cli(*command(artefacts, src, tmp_path / kind))
        assert r.exit_code == 0, (kind, r.output)
    copy = tmp_path / "states"
    shutil.copytree(artefacts / "states", copy)
    table = pq.read_table(copy / "index.parquet")
    meta = json.loads(table.schema.metadata[b"latentsift"])
    del meta["trajectories"][0]["row"]
    pq.write_table(table.replace_schema_metadata({b"latentsift": json.dumps(meta).encode()}), copy / "index.parquet")
    refused(cli(*READERS["store"][1](artefacts, copy, tmp_path / "x")),
            f"{copy / 'index.parquet'}: field 'trajectories[0].row' is missing")


def test_an_existing_out_that_the_command_did_not_write_is_refused(canonical, tmp_path):
    """A user's file or folder at --out is never replaced; the command's own earlier output is."""
    notes, folder = tmp_path / "notes.txt", tmp_path / "mine"
    notes.write_text("my notes\n")
    folder.mkdir()
    (folder / "keep.txt").write_text("keep me")
    d, nope = tmp_path / "in", tmp_path / "nope"
    before = digest(notes, folder)
    for args, out in ((["import", canonical], notes), (["import", canonical, "--out", tmp_path / "p.jsonl",
                                                        "--summary-json"], notes),
                      (["filter", canonical, "--method", "random"], notes)):
        refused(cli(*args, *([] if args[-1] == "--summary-json" else ["--out"]), out), f"{out} exists and is not")
    folder_commands = (["extract", canonical], ["bank", "build", canonical, "--states", d], ["scorer", "train", d],
                       ["fit", canonical, "--states", d], ["crossval", canonical, "--states", d],
                       ["evaluate", canonical, "--scores", d], ["verify", canonical],
                       ["reproduce", "--data", nope], ["explore", canonical, "--pools", canonical],
                       ["transfer", canonical, "--states", d])
    for args in folder_commands:
        refused(cli(*args, "--out", folder), f"--out {folder} is a non-empty folder")
        refused(cli(*args, "--out", notes), f"--out {notes} is a file")
    assert digest(notes, folder) == before
    # the command's own earlier output is replaced (an empty file holds nothing to lose)
    (tmp_path / "empty.json").write_text("")
    for _ in range(2):
        r = cli("import", canonical, "--out", tmp_path / "p.jsonl.gz", "--summary-json", tmp_path / "s.json")
        assert r.exit_code == 0, r.output
        r = cli("filter", canonical, "--method", "random", "--out", tmp_path / "f.json")
        assert r.exit_code == 0, r.output
        assert cli("filter", canonical, "--method", "random", "--out", tmp_path / "empty.json").exit_code == 0
    assert load_jsonl(tmp_path / "p.jsonl.gz") == load_jsonl(canonical)


def test_crossval_refuses_an_oversized_k_before_any_work(canonical, tmp_path):
    """Every pool of the fixture holds one candidate: --k 2 is refused before the states are read,
    and nothing is written (no folds/, no manifest)."""
    out = tmp_path / "run"
    refused(cli("crossval", canonical, "--states", tmp_path / "no-states", "--k", 2, "--out", out),
            "--k 2 is larger than every pool", "up to 1")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_scorer_val_frac_is_checked_up_front_and_its_split_said():
    from latentsift._core.validation import LatentSiftError
    from latentsift.sift.scorer import LinearScorer, check_split
    for bad in (1, 1.5, -0.1):
        refused(cli("scorer", "train", "no-bank", "--val-frac", bad, "--out", "no-scorer"), "--val-frac", "[0, 1)")
    labels = {f"t{i}": i % 2 for i in range(10)}
    notes = []
    check_split(LinearScorer(val_frac=0.7), labels, notes.append)
    assert notes == ["warning: --val-frac 0.7 trains on 3 of the 10 bank trajectories and validates on 7; "
                     "the paper holds out 0.2."]
    check_split(LinearScorer(val_frac=0.2), labels, notes.append)
    assert len(notes) == 1  # the paper's split: nothing to say
    with pytest.raises(LatentSiftError, match=r"--val-frac 0.95 leaves 1 of the 10 bank trajectories for training"):
        check_split(LinearScorer(val_frac=0.95), labels)


@pytest.mark.model
def test_scorer_train_with_no_or_almost_all_validation(artefacts, tmp_path):
    """The fixture bank holds one resolved and one unresolved trajectory."""
    bank = artefacts / "bank"
    refused(cli("scorer", "train", bank, "--val-frac", 0.99, "--out", tmp_path / "s"),
            "--val-frac 0.99 leaves 1 of the 2 bank trajectories for training", "lower --val-frac")
    assert not (tmp_path / "s").exists()
    r = cli("scorer", "train", bank, "--val-frac", 0, "--max-epochs", 1, "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert "no validation split" in r.output and "kept the last epoch" in r.output and "nan" not in r.output


@pytest.mark.model
def test_a_full_disk_names_the_out_not_a_temporary(artefacts, tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    a, out = artefacts, tmp_path / "out"
    for args, named in ((["bank", "build", a / "bank.jsonl", "--states", a / "states", "--out", out / "bank"],
                         out / "bank" / "bank.safetensors"),
                        (["scorer", "train", a / "bank", "--val-frac", 0, "--max-epochs", 1, "--out", out / "scorer"],
                         out / "scorer" / "scorer.safetensors"),
                        (["fit", a / "bank.jsonl", "--states", a / "states", "--scorer-epochs", 1, "--out",
                          out / "sifter"], out / "sifter" / "bank" / "bank.safetensors")):
        r = cli(*args)
        refused(r, f"error: {named}: no space left on device")
        assert ".tmp" not in r.output
    assert not out.exists()


@pytest.mark.model
def test_an_unreadable_shard_is_said_as_unreadable(artefacts, tmp_path, monkeypatch):
    """(Simulated at the read: the tests may run as root, whom permissions do not stop.)"""
    import pathlib
    copy = tmp_path / "states"
    shutil.copytree(artefacts / "states", copy)
    shard = sorted((copy / "shards").iterdir())[0]
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self == shard:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    for args in (["bank", "build", artefacts / "bank.jsonl", "--states", copy, "--out", tmp_path / "bank"],
                 ["extract", artefacts / "bank.jsonl", "--out", copy, "--threads", 1]):  # the resume's check
        r = cli(*args)
        refused(r, f"{shard}: the shard cannot be read", "readable")
        assert "write" not in r.output
    assert not (tmp_path / "bank").exists()


@pytest.mark.model
def test_explore_on_an_output_with_every_pool_skipped_says_so(artefacts, tmp_path):
    a, f = artefacts, tmp_path / "f.json"
    r = cli("filter", a / "bank.jsonl", "--states", a / "states", "--bank", a / "bank", "--distance-only",
            "--on-leak", "skip", "--out", f)  # every pool's instance is in the bank
    assert r.exit_code == 0, r.output
    assert json.loads(f.read_text())["n_pools"] == 0
    r = cli("explore", f, "--pools", a / "bank.jsonl", "--out", tmp_path / "site")
    refused(r, f"{f} holds no scored pool", "left out every pool (2 with --on-leak skip", "nothing to explore")
    assert "pass the pools file" not in r.output and not (tmp_path / "site").exists()


def test_ids_with_control_or_bidi_characters_are_escaped_in_the_console(canonical, tmp_path):
    trajs = load_jsonl(canonical)
    odd_id, odd_inst = "run/\x1b[31mred\u202eevil\nline[bold]x", "inst\u200f\x07"
    trajs[0].traj_id, trajs[0].instance_id = odd_id, odd_inst
    pools = tmp_path / "odd.jsonl"
    save_jsonl(trajs, pools)
    r = cli("filter", pools, "--method", "random", "--show", 5, "--out", tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    for raw in ("\x1b", "\u202e", "\u200f", "\x07"):
        assert raw not in r.output
    assert "run/\\x1b[31mred\\u202eevil\\x0aline[bold]x" in r.output  # one line, markup shown as text
    assert "inst\\u200f\\x07: keep 1 of 1" in r.output
    saved = json.loads((tmp_path / "f.json").read_text())  # the file keeps the ids as they are
    assert odd_id in [c["traj_id"] for p in saved["pools"] for c in p["candidates"]]


def test_commands_refuse_an_input_that_carries_nothing(canonical, tmp_path):
    """An empty pools file (and an empty --ids list): one line before any model loads, nothing written."""
    empty, no_ids = tmp_path / "empty.jsonl", tmp_path / "ids.txt"
    empty.write_text("")
    no_ids.write_text("\n")
    out = tmp_path / "out"
    for args, words in ((["extract", empty, "--out", out / "s"], f"{empty} holds no trajectory: nothing to extract"),
                        (["verify", empty, "--out", out / "v"], "nothing to verify"),
                        (["verify", canonical, "--ids", no_ids, "--out", out / "v"],
                         f"--ids {no_ids} names no traj_id"),
                        (["bank", "build", empty, "--states", tmp_path / "s", "--out", out / "b"],
                         f"{empty} holds no trajectory: nothing to build a bank from"),
                        (["import", empty, "--out", out / "p.jsonl"], f"read 0 trajectories from {empty}")):
        r = cli(*args)
        refused(r, words)
        assert "model:" not in r.output
    assert not out.exists()


def test_run_and_verifier_manifests_are_read_through_the_schema(tmp_path):
    from latentsift._core.validation import LatentSiftError
    from latentsift.protocol.reproduction import open_run_dir
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"settings": {}}))
    with pytest.raises(LatentSiftError, match=r"run/manifest.json: field 'command' is missing"):
        open_run_dir(run)
    pools = tmp_path / "p.jsonl"
    pools.write_text(json.dumps({"instance_id": "i", "candidates": [{"traj_id": "a", "label": 1},
                                                                     {"traj_id": "b", "label": 0}]}) + "\n")
    ef = tmp_path / "ef"
    ef.mkdir()
    (ef / "verdicts.jsonl").write_text("".join(json.dumps({"kind": "verdict", "traj_id": t, "score": 0.5, "p_yes": 0.5,
                                                           "p_no": 0.5, "n_in": 1, "n_out": 1}) + "\n" for t in "ab"))
    (ef / "manifest.json").write_text(json.dumps({"kind": "ef", "name": 7}))
    refused(cli("evaluate", pools, "--scores", ef, "--out", tmp_path / "r"),
            f"{ef / 'manifest.json'}: field 'name': must be a valid string (got 7)")
    (ef / "manifest.json").write_text("[1]")
    refused(cli("evaluate", pools, "--scores", ef, "--out", tmp_path / "r"),
            f"{ef / 'manifest.json'}: must hold a JSON object (got list)")
    assert not (tmp_path / "r").exists()


def test_an_edited_explorer_file_list_is_one_line(canonical, tmp_path):
    from latentsift._core.outputs import SITE_MANIFEST
    f, site = tmp_path / "f.json", tmp_path / "site"
    assert cli("filter", canonical, "--method", "random", "--out", f).exit_code == 0
    assert cli("explore", f, "--pools", canonical, "--out", site).exit_code == 0
    (site / SITE_MANIFEST).write_text(json.dumps({"files": "index.html"}))
    before = digest(site)
    refused(cli("explore", f, "--pools", canonical, "--out", site), f"{site / SITE_MANIFEST}: field 'files'")
    assert digest(site) == before


def test_a_saved_operating_point_is_read_through_the_manifest_schema(tmp_path):
    """SIFTER/operating_point.json ('fit --target-recall R --calibration CAL') is read through the one
    schema like every saved artefact: a field removed, a wrong type, an unknown field or a value the rule
    refuses is one line naming the file and the field."""
    import numpy as np
    from latentsift._core.validation import LatentSiftError
    from latentsift.deploy.operating_file import load_operating_point, save_operating_point
    from latentsift.sift.keep import CalibrationPools, RecallKeep
    rng = np.random.default_rng(0)
    scores = [rng.standard_normal(4) for _ in range(40)]
    labels = [(s >= np.sort(s)[-2]).astype(int) for s in scores]  # the best two of each pool resolved
    cal_file, sifter = tmp_path / "cal.jsonl", tmp_path / "sifter"
    cal_file.write_text("{}\n")
    sifter.mkdir()
    (sifter / "sifter.json").write_text("{}")
    cal = CalibrationPools([f"p{i}" for i in range(40)], [[f"p{i}/c{j}" for j in range(4)] for i in range(40)],
                           scores, labels, how="split", extra={"file": str(cal_file)})
    rule = RecallKeep(0.9).fit(cal)
    path = sifter / "operating_point.json"
    save_operating_point(path, rule, cal, sifter_dir=sifter)
    assert load_operating_point(path, sifter_dir=sifter)[0].threshold_ == rule.threshold_
    good = json.loads(path.read_text())
    for edit, words in ((lambda r: r["rule"].pop("n_lost_allowed"), "field 'rule.n_lost_allowed' is missing"),
                        (lambda r: r["params"].update(min_keep="1"), "field 'params.min_keep'"),
                        (lambda r: r["rule"]["calibration"].update(n=-1), "field 'rule.calibration.n'"),
                        (lambda r: r["params"].update(target_recall=1.5), "field 'params'"),
                        (lambda r: r.update(note="x"), "unknown field 'note'"),
                        (lambda r: r["sifter"].pop("sifter_json_sha256"), "'sifter.sifter_json_sha256' is missing")):
        rec = json.loads(json.dumps(good))
        edit(rec)
        path.write_text(json.dumps(rec))
        with pytest.raises(LatentSiftError) as e:
            load_operating_point(path)
        msg = str(e.value)
        assert msg.startswith(f"{path}: ") and words in msg and "\n" not in msg, msg
