"""Options that were silently ignored or overridden, and refusals that named the library's internals (issue 65),
each run through the real command line: one ``error:`` line naming the options as the user writes them, exit
code 2, nothing written; or one line saying what an option does here. Synthetic stores (``synthetic.py``): no
model loads."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conftest import refused
from latentsift._cli._vocabulary import MEANINGS, PARAMETER_OPTIONS
from latentsift.cli import app
from synthetic import write_single_policy

INTERNAL = ("parameter of", "n_boot", "n_folds", "n_draws", "Bank", "LinearScorer", "select_by_repo", "registry")


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two one-policy data sets (pools and state stores) of 16 tasks x 4 candidates, and a bank of the first."""
    d = tmp_path_factory.mktemp("silent")
    pa, sa = write_single_policy(d / "a", k=4, agent="policy-a")
    pb, sb = write_single_policy(d / "b", k=4, agent="policy-b", seed=3)
    r = cli("bank", "build", pa, "--states", sa, "--out", d / "bank")
    assert r.exit_code == 0, r.output
    return {"d": d, "pools": pa, "states": sa, "pools_b": pb, "states_b": sb, "bank": d / "bank"}


def _refused_plainly(r, *words):
    refused(r, *words)
    line = next(line for line in r.output.splitlines() if line.startswith("error: "))
    assert not [w for w in INTERNAL if w in line], line


# --------------------------------------------------------------------------- an old name beside its new one
def test_an_old_name_beside_its_new_one_with_another_value_is_refused(data, tmp_path):
    """'--samples 0 --k 2' ran 2 samples: the old name and the new one with other values are one line naming both;
    with the same value they are one option (and the command goes on to its next check)."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    r = cli("rollout", tasks, "--out", tmp_path / "o", "--samples", "0", "--k", "2")
    _refused_plainly(r, "--k is the old name of --samples", "(--samples 0 and --k 2)")
    r = cli("crossval", data["pools"], "--states", data["states"], "--out", tmp_path / "c", "--boot=50",
            "--bootstrap", "60")
    _refused_plainly(r, "--boot is the old name of --bootstrap in crossval", "--boot 50 and --bootstrap 60")
    r = cli("rollout", tasks, "--out", tmp_path / "o", "--samples", "2", "--k", "2", "--model", tmp_path / "none")
    refused(r, "--model")
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()


# --------------------------------------------------------------------------- options that were overridden
def test_per_step_with_any_renderer_is_refused(data, tmp_path):
    """'--per-step' is '--renderer render_per_step': given with '--renderer' (the default one included, which
    --per-step overrode), one line naming both; either alone goes on (here to the empty pools' refusal)."""
    pools = tmp_path / "pools.jsonl"
    pools.write_text("")
    for renderer in ("render", "render_per_step"):
        r = cli("extract", pools, "--out", tmp_path / "s", "--per-step", "--renderer", renderer)
        _refused_plainly(r, "--per-step is --renderer render_per_step", f"--renderer {renderer} and --per-step")
    for args in (["--per-step"], ["--renderer", "render_per_step"]):
        refused(cli("extract", pools, "--out", tmp_path / "s", *args), "holds no trajectory")
    assert not (tmp_path / "s").exists()


def test_device_map_on_a_machine_without_a_gpu_says_where_the_policy_goes(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: --device-map places the policy on it")
    pools = tmp_path / "pools.jsonl"
    pools.write_text("")
    r = cli("extract", pools, "--out", tmp_path / "s", "--device-map", "auto")
    refused(r, "holds no trajectory")
    notes = [line for line in r.output.splitlines() if line.startswith("note: --device-map auto")]
    assert len(notes) == 1 and "no GPU" in notes[0] and "CPU" in notes[0], r.output


def test_bank_build_with_states_in_the_old_order_is_refused(data, tmp_path):
    """The old order (STATES_DIR --pools POOLS) takes the first argument as the states: a --states beside it was
    dropped; now one line, nothing written. Each order alone builds."""
    r = cli("bank", "build", data["states"], "--pools", data["pools"], "--states", data["states_b"], "--out",
            tmp_path / "b")
    _refused_plainly(r, "--pools belongs to the old order (STATES_DIR --pools POOLS)", f"--states {data['states_b']}")
    assert not (tmp_path / "b").exists()
    assert cli("bank", "build", data["states"], "--pools", data["pools"], "--out", tmp_path / "b").exit_code == 0


# --------------------------------------------------------------------------- the library's names
@pytest.mark.parametrize("args, words", [
    (["--layer", "99"], "--layer must be a layer index in"),
    (["--channels", "cot,colour"], "--channels must be one of"),
    (["--normalize", "unit"], "--normalize must be one of"),
    (["--repos", "nope/x"], "--repos names unknown repositories ['nope/x']"),
])
def test_bank_build_refusals_name_its_options(data, tmp_path, args, words):
    r = cli("bank", "build", data["pools"], "--states", data["states"], "--out", tmp_path / "b", *args)
    _refused_plainly(r, words)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("args, words", [
    (["--lr", "-1"], "--lr must be a positive float"), (["--accumulation", "0"], "--accumulation must be"),
    (["--init", "ones"], "--init must be one of"), (["--weight-decay", "-1"], "--weight-decay must be"),
])
def test_scorer_train_refusals_name_its_options(data, tmp_path, args, words):
    r = cli("scorer", "train", data["bank"], "--out", tmp_path / "s", *args)
    _refused_plainly(r, words)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("command", ["crossval", "premise", "transfer"])
def test_one_bootstrap_resample_is_refused_before_any_work(data, tmp_path, command):
    """'--bootstrap 1' ran every fold and then stopped on 'n_boot' of an internal function; now it is refused
    when the options are read (an interval needs two resamples)."""
    extra = ["--states", data["states"]] + (["--states", data["states_b"]] if command == "transfer" else [])
    inputs = [data["pools"], data["pools_b"]] if command == "transfer" else [data["pools"]]
    r = cli(command, *inputs, *extra, "--out", tmp_path / "o", "--bootstrap", "1")
    _refused_plainly(r, "--bootstrap must be an integer of at least 2. Got 1 instead.")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, words", [
    (["--folds", "1"], "--folds must be an integer of at least 2"), (["--draws", "0"], "--draws must be"),
    (["--seed", "-1"], "--seed must be"), (["--group-by", "agent"], "--group-by must be repo or instance"),
])
def test_transfer_checks_its_options_before_any_work(data, tmp_path, args, words):
    r = cli("transfer", data["pools"], data["pools_b"], "--states", data["states"], "--states", data["states_b"],
            "--out", tmp_path / "t", *args)
    _refused_plainly(r, words)
    assert not (tmp_path / "t").exists()


def test_transfer_says_when_a_set_has_fewer_groups_than_folds(data, tmp_path):
    """Each evaluation set is cut into at most as many folds as it has groups (16 tasks here): said per set."""
    r = cli("transfer", data["pools"], data["pools_b"], "--states", data["states"], "--states", data["states_b"],
            "--out", tmp_path / "t", "--group-by", "instance", "--folds", "99", "--k", "2", "--draws", "2",
            "--bootstrap", "20", "--scorer-epochs", "1")
    assert r.exit_code == 0, r.output
    said = [line for line in r.output.splitlines() if "--folds 99 is more than its 16 instances; 16 folds" in line]
    assert len(said) == 2, r.output   # one per agent's set


def test_every_library_parameter_named_as_an_option_is_one_of_the_command_line():
    assert set(PARAMETER_OPTIONS.values()) <= set(MEANINGS)
