"""``latentsift rollout`` (and the commands that load a model) on inputs that are not what they claim
and on settings the command line can check: one line, exit code 2, before any model loads, nothing
written. No model is loaded here: ``load_policy`` is replaced by a stand-in that fails the test if a
refusal came after it."""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pickle
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from conftest import refused  # tests/conftest.py
from latentsift._core.manifests import RolloutSettingsFields
from latentsift._core.validation import LatentSiftError
from latentsift._jobs import rollout as jobs
from latentsift.rollout import folder as R
from latentsift.cli import app
from latentsift.states.model import Fingerprint, default_model_path
from latentsift.rollout.agent import RolloutSettings
from latentsift.rollout.tasks import load_tasks

FIX = Path(__file__).parent / "fixtures" / "trajectories"
TASKS = [{"task_id": f"T/{i}", "prompt": f'def add{i}(x):\n    """\n    >>> add{i}(1)\n    {i + 1}\n    """\n',
          "entry_point": f"add{i}", "test": f"def check(candidate):\n    assert candidate(2) == {i + 2}\n"}
         for i in range(3)]
INTERNALS = ("SandboxLimits", "Sampling", "RolloutSettings", "load_policy", "export_dataset")


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _task_file(path: Path, tasks=TASKS) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Fail if a command gets as far as loading the model."""
    class Loaded(Exception):
        pass

    def load(*args, **kwargs):
        raise Loaded("the model would load here")

    monkeypatch.setattr(jobs, "load_policy", load)
    return Loaded


def _written(tmp_path: Path, *outs: Path) -> list[str]:
    """What a refused command left: the outputs themselves, and any lock or temporary beside them."""
    return [p.name for p in tmp_path.iterdir() if any(p.name in (o.name, f".{o.name}.lock") for o in outs)
            or ".tmp" in p.name]


# --------------------------------------------------------------------------- model paths
@pytest.fixture(scope="module")
def not_models(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Paths that claim to be a model and are not, with the words their refusal must hold."""
    d = tmp_path_factory.mktemp("models")
    text = d / "text.gguf"
    text.write_text("this is not a model\n")
    real = default_model_path().read_bytes()
    cut = d / "cut.gguf"
    cut.write_bytes(real[:3_000_000])  # the header whole, most tensors missing
    head = d / "head.gguf"
    head.write_bytes(real[:100_000])   # cut inside the header (its vocabulary)
    (d / "empty").mkdir()
    (d / "x.gguf").mkdir()
    (d / "noweights").mkdir()
    (d / "noweights" / "config.json").write_text('{"model_type": "llama"}')
    edited = d / "edited.gguf"   # one tensor's shape halved in the header: its data no longer tile the file
    edited.write_bytes(_with_dims(real, "blk.0.ffn_up.weight", lambda dims: [dims[0] // 2, *dims[1:]]))
    tiny = _tiny_folder(d / "tiny")
    folders = {}
    for case in ("other config", "empty config", "cut weights", "pickle weights"):
        folders[case] = shutil.copytree(tiny, d / case.replace(" ", "-"))
    (folders["other config"] / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 8, "n_layer": 2, "n_head": 2,
         "vocab_size": 64, "n_positions": 32}))
    (folders["empty config"] / "config.json").write_text("{}")
    weights = folders["cut weights"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    (folders["pickle weights"] / "model.safetensors").unlink()
    (folders["pickle weights"] / "pytorch_model.bin").write_bytes(pickle.dumps(_Touch(d / "unpickled")))
    return {"text": (text, "not a GGUF model"), "cut": (cut, f"the file has 3,000,000"),
            "head": (head, "cut short inside its GGUF header"), "empty folder": (d / "empty", "without a config.json"),
            "folder x.gguf": (d / "x.gguf", "without a config.json"),
            "no weights": (d / "noweights", "without weights"),
            "edited shape": (edited, "tensor 'blk.0.ffn_up.weight' of shape [288, 1536] needs 276,480 bytes, and "
                                     "552,960 lie before the next tensor"),
            "other config": (folders["other config"], "its weights are not the model its config.json builds"),
            "empty config": (folders["empty config"], "its config.json names no model_type"),
            "cut weights": (folders["cut weights"], "model.safetensors is cut short"),
            "pickle weights": (folders["pickle weights"], "holds pickle weights (pytorch_model.bin)")}


class _Touch:
    """A pickle that, when read, creates the file ``path``: pickle weights run code."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def _with_dims(gguf: bytes, tensor: str, edit) -> bytes:
    """The GGUF file's bytes with the header's dimensions of ``tensor`` replaced by ``edit(dims)`` (as many)."""
    out = bytearray(gguf)
    name = tensor.encode()
    at = out.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n = struct.unpack_from("<I", out, at)[0]
    struct.pack_into(f"<{n}Q", out, at + 4, *edit(list(struct.unpack_from(f"<{n}Q", out, at + 4))))
    return bytes(out)


def _tiny_folder(d: Path) -> Path:
    """A Hugging Face model folder of a two-layer Llama of width 8: its config and its weights (zeros, as
    safetensors), written from the config's own model built on the meta device: nothing loads."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, tie_word_embeddings=True)
    d.mkdir()
    config.save_pretrained(d)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    save_file({k: np.zeros(tuple(v.shape), np.float32) for k, v in model.state_dict().items()
               if k != "lm_head.weight"}, str(d / "model.safetensors"))
    return d


def test_a_whole_model_folder_passes_the_check(not_models):
    """The folders refused below are copies of this one, which the check takes (its weights fit its config)."""
    from latentsift.states.model_files import check_model_path

    tiny = not_models["other config"][0].parent / "tiny"
    assert check_model_path(tiny) == tiny


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("canon")
    r = cli("import", FIX / "openai_toolcalls.jsonl", "--out", d / "pools.jsonl")
    assert r.exit_code == 0, r.output
    return d / "pools.jsonl"


@pytest.mark.parametrize("case", ["text", "cut", "head", "empty folder", "folder x.gguf", "no weights", "edited shape",
                                  "other config", "empty config", "cut weights", "pickle weights"])
def test_a_model_path_that_is_not_a_model_is_one_line_in_rollout_extract_and_verify(case, not_models, canonical,
                                                                                     tmp_path, no_model):
    model, words = not_models[case]
    tasks = _task_file(tmp_path / "tasks.jsonl")
    for args in (["rollout", tasks, "--out", tmp_path / "o"], ["extract", canonical, "--out", tmp_path / "o"],
                 ["verify", canonical, "--out", tmp_path / "o"]):
        r = cli(*args, "--model", model)
        refused(r, "--model", str(model), words)
        assert _written(tmp_path, tmp_path / "o") == [], args[0]
    assert not (not_models["text"][0].parent / "unpickled").exists()   # the pickle was never read


@pytest.mark.model
def test_a_gguf_whose_shapes_were_swapped_is_one_line_when_it_loads(tmp_path, canonical):
    """Dimensions swapped in the header keep the data's size (the header check passes); the load compares
    each weight with the model the header describes and refuses in one line, before any trajectory is
    replayed, nothing written, nothing cached."""
    swapped = tmp_path / "swapped.gguf"
    swapped.write_bytes(_with_dims(default_model_path().read_bytes(), "blk.0.ffn_up.weight", lambda d: d[::-1]))
    r = cli("extract", canonical, "--out", tmp_path / "o", "--model", swapped, "--dtype", "float32")
    refused(r, f"--model {str(swapped)!r}: its weight 'model.layers.0.mlp.up_proj.weight' has shape [576, 1536] "
               "where the model it describes wants [1536, 576]")
    assert _written(tmp_path, tmp_path / "o") == []


def test_the_header_walk_reads_what_the_tensors_need():
    """The check's arithmetic on the real file: its tensors end exactly at its last byte."""
    from latentsift.states.model_files import gguf_data_end

    need, size = gguf_data_end(default_model_path())
    assert need == size == default_model_path().stat().st_size


# --------------------------------------------------------------------------- options before the model
def test_rollout_checks_its_options_before_the_model_loads_and_writes_nothing(tmp_path, no_model):
    tasks = _task_file(tmp_path / "tasks.jsonl")
    out = tmp_path / "o"
    for extra, words in ((["--timeout", "0"], "--timeout must be a positive number"),
                         (["--timeout", "nan"], "--timeout"), (["--timeout", "inf"], "--timeout"),
                         (["--temperature", "nan"], "--temperature must be a number from 0 to 10"),
                         (["--temperature", "11"], "--temperature"), (["--top-p", "0"], "--top-p"),
                         (["--seed", "-1"], "--seed"), (["--system-prompt", " "], "--system-prompt must be a non-empty"),
                         (["--dtype", "fp8"], "--dtype must be one of"),
                         (["--shard", "2/3", "--tasks", "1"], "--shard 2/3 selects no task: there are 1 (--tasks 1)"),
                         (["--shard", "3/3", "--tasks", "1"], "--shard 3/3 selects no task")):
        r = cli("rollout", tasks, "--out", out, *extra)
        refused(r, *([words] if isinstance(words, str) else words))
        assert not any(name in r.output for name in INTERNALS), r.output
        assert _written(tmp_path, out) == [], extra
    # the same options, valid, get as far as the model
    r = cli("rollout", tasks, "--out", out, "--shard", "1/3", "--tasks", "1", "--timeout", "2")
    assert isinstance(r.exception, no_model)
    assert not out.exists()


def test_a_prompt_that_cannot_fit_the_context_is_refused_before_the_model_loads(tmp_path, no_model):
    """The packaged model's context is 8,192 tokens (its GGUF header): a prompt of more than 8,192 x 256 bytes
    cannot fit whatever its tokens, and is refused in one line naming the file, the task and what helps; one
    under that bound goes on to the model (where the exact count decides)."""
    def with_docstring(n_bytes: int) -> dict:
        return {**TASKS[0], "prompt": TASKS[0]["prompt"].replace('"""\n    >>>', '"""' + "word " * (n_bytes // 5)
                                                                                 + "\n    >>>", 1)}
    out = tmp_path / "o"
    tasks = _task_file(tmp_path / "tasks.jsonl", [TASKS[1], with_docstring(2_200_000)])
    r = cli("rollout", tasks, "--out", out)
    refused(r, f"{tasks}: the prompt of task 'T/0' is 2,20", "past the model's context of 8,192: shorten the prompt "
            "or leave the task out of the file, or use a --model with a longer context")
    assert _written(tmp_path, out) == []
    r = cli("rollout", _task_file(tmp_path / "tasks.jsonl", [with_docstring(2_000_000)]), "--out", out)
    assert isinstance(r.exception, no_model), r.output


def test_rollout_help_names_options_and_files_not_functions():
    r = CliRunner().invoke(app, ["rollout", "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and "--shard" in r.output and "docs/own-policy.md" in r.output
    assert not any(name in r.output for name in INTERNALS if name != "Sampling")  # ("Sampling temperature")


# --------------------------------------------------------------------------- resume
def _fingerprint(dtype: str = "bfloat16") -> Fingerprint:
    return Fingerprint("LlamaForCausalLM", 30, 576, "a" * 16, "b" * 16, "c" * 64, dtype)


def _policy(fingerprint: Fingerprint) -> SimpleNamespace:
    """What the rollout folder reads of a loaded policy: its file, fingerprint, device and weights' dtype (the
    decode layout)."""
    return SimpleNamespace(path=str(default_model_path()), fingerprint=fingerprint, device=torch.device("cpu"),
                           model=torch.nn.Linear(1, 1, dtype=getattr(torch, fingerprint.dtype)))


def _folder(out: Path, tasks, settings: RolloutSettings, *, dtype: str = "bfloat16", done=("T/0",),
            digests: bool = True) -> Path:
    """A rollout folder as ``run_rollouts`` leaves it after the tasks ``done`` (their manifest entry and
    task file; the states are not needed by what is tested here)."""
    policy = _policy(_fingerprint(dtype))
    stem = default_model_path().name.removesuffix(".gguf")
    man = R._manifest(policy, settings, stem, stem, 1, "tasks.jsonl")
    by_id = {t.task_id: t for t in tasks}
    if digests:
        man["task_digests"] = {tid: R.task_digest(by_id[tid]) for tid in done}
    else:
        del man["task_digests"]
    (out / R.TASKS_DIR).mkdir(parents=True)
    (out / R.MANIFEST).write_text(json.dumps(man))
    for tid in done:
        (out / R.TASKS_DIR / R.task_file(tid)).write_bytes(R.gzip_bytes(""))
    return out


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_resume_names_the_one_setting_that_differs_before_the_model_loads(tmp_path, no_model):
    tasks_path = _task_file(tmp_path / "tasks.jsonl")
    out = _folder(tmp_path / "o", load_tasks(tasks_path), RolloutSettings())
    before = _tree(out)
    for extra, words in ((["--dtype", "float32"], "made in bfloat16 (--dtype); this call runs float32: pass --dtype "
                                                  "bfloat16, or another --out"),
                         (["--temperature", "0.5"], "made with --temperature 0.8; this call has 0.5"),
                         (["--samples", "4"], "made with --samples 16; this call has 4"),
                         (["--threads", "2"], "made with --threads 1; this call has 2"),
                         (["--run", "other"], "made with --run 'SmolLM2-135M-Instruct.Q4_1'; this call has 'other'")):
        r = cli("rollout", tasks_path, "--out", out, *extra)
        refused(r, words)
        line = r.output.strip().replace(str(out), "")
        assert len(line) < 200 and "{" not in line, line  # the one field, not the settings dumped
        assert _tree(out) == before
    r = cli("rollout", tasks_path, "--out", out, "--dtype", "bfloat16")
    assert isinstance(r.exception, no_model)  # the same settings resume


def test_after_the_model_loads_another_model_is_named_by_its_fingerprint_field(tmp_path):
    tasks = load_tasks(_task_file(tmp_path / "tasks.jsonl"))
    out = _folder(tmp_path / "o", tasks, RolloutSettings())
    other = dataclasses.replace(_fingerprint(), weights_sha="d" * 64)
    policy = _policy(other)
    with pytest.raises(LatentSiftError, match="another model \\(its fingerprint's weights_sha differs") as e:
        R.run_rollouts(policy, tasks, out, RolloutSettings(), run_examples=None, judge=None, threads=1)
    assert "\n" not in str(e.value) and len(str(e.value).replace(str(out), "")) < 250


def test_a_resume_with_a_changed_task_is_refused_naming_the_task(tmp_path, no_model):
    """Same ids, another hidden test: the finished task's labels would be stale (issue 51)."""
    tasks_path = _task_file(tmp_path / "tasks.jsonl")
    out = _folder(tmp_path / "o", load_tasks(tasks_path), RolloutSettings(), done=("T/0", "T/1"))
    before = _tree(out)
    changed = [TASKS[0], TASKS[1] | {"test": "def check(candidate):\n    assert candidate(5) == 6\n"}, TASKS[2]]
    r = cli("rollout", _task_file(tmp_path / "changed.jsonl", changed), "--out", out)
    refused(r, "The task 'T/1' of the task file is not the one", "changed since", "another --out")
    assert _tree(out) == before
    # a task not finished yet may change; the unchanged ones resume
    r = cli("rollout", _task_file(tmp_path / "t2.jsonl", TASKS[:2] + [TASKS[2] | {"prompt": TASKS[2]["prompt"] + "\n"}]),
            "--out", out)
    assert isinstance(r.exception, no_model)
    # in the library too (run_rollouts checks again under the folder's lock, after the model)
    policy = _policy(_fingerprint())
    with pytest.raises(LatentSiftError, match="The task 'T/1'"):
        R.run_rollouts(policy, load_tasks(tmp_path / "changed.jsonl"), out, RolloutSettings(), run_examples=None,
                       judge=None, threads=1)
    assert _tree(out) == before
    # a folder that recorded no digests (written before they were): its finished tasks cannot be matched
    old = _folder(tmp_path / "old", load_tasks(tasks_path), RolloutSettings(), digests=False)
    refused(cli("rollout", tasks_path, "--out", old), "'T/0'", "records no digest of it")


def test_a_resume_with_another_system_prompt_is_refused_naming_the_option(tmp_path, no_model):
    """The one-turn run's prompt (``--system-prompt``, the confirmation run's rules) is a recorded setting:
    a folder of the scaffold's prompt is not continued with another, and the same prompt resumes."""
    from latentsift.rollout.agent import ONE_TURN_SYSTEM_PROMPT, SYSTEM_PROMPT

    assert SYSTEM_PROMPT.startswith(ONE_TURN_SYSTEM_PROMPT) and "run on the" not in ONE_TURN_SYSTEM_PROMPT
    make = (Path(__file__).parents[1] / "Makefile").read_text()   # the confirmation run's target passes it
    assert f"CONFIRM_PROMPT := '{ONE_TURN_SYSTEM_PROMPT}'" in make
    tasks_path = _task_file(tmp_path / "tasks.jsonl")
    one_turn = RolloutSettings(max_turns=1, system_prompt=ONE_TURN_SYSTEM_PROMPT)
    out = _folder(tmp_path / "o", load_tasks(tasks_path), RolloutSettings(max_turns=1), done=("T/0",))
    before = _tree(out)
    r = cli("rollout", tasks_path, "--out", out, "--turns", "1", "--system-prompt", ONE_TURN_SYSTEM_PROMPT)
    refused(r, "made with --system-prompt", "another --out")
    assert _tree(out) == before
    ok = _folder(tmp_path / "p", load_tasks(tasks_path), one_turn, done=("T/0",))
    r = cli("rollout", tasks_path, "--out", ok, "--turns", "1", "--system-prompt", ONE_TURN_SYSTEM_PROMPT)
    assert isinstance(r.exception, no_model), r.output   # resumed as far as the model


# --------------------------------------------------------------------------- the manifest's schema
@pytest.mark.parametrize("case", ["a list", "a removed setting", "a NaN temperature", "top_p 0", "a string k"])
def test_the_rollout_manifest_is_read_through_its_schema(case, tmp_path, no_model):
    tasks_path = _task_file(tmp_path / "tasks.jsonl")
    out = _folder(tmp_path / "o", load_tasks(tasks_path), RolloutSettings())
    man = json.loads((out / R.MANIFEST).read_text())
    change, words = {
        "a list": (lambda m: [m], "must hold a JSON object"),
        "a removed setting": (lambda m: m["settings"].pop("top_p") and m, "field 'settings.top_p' is missing"),
        "a NaN temperature": (lambda m: m["settings"].update(temperature=math.nan) or m,
                              "field 'settings.temperature'"),
        "top_p 0": (lambda m: m["settings"].update(top_p=0) or m, "field 'settings.top_p'"),
        "a string k": (lambda m: m["settings"].update(k="16") or m, "field 'settings.k'"),
    }[case]
    (out / R.MANIFEST).write_text(json.dumps(change(man)))  # json writes NaN as NaN
    before = _tree(out)
    r = cli("rollout", tasks_path, "--out", out)
    if case == "a list":  # no format to read: the folder is not taken for a rollout folder at all
        refused(r, f"--out {out} is a non-empty folder that is not a rollout folder")
    else:
        refused(r, str(out / R.MANIFEST), words, "the file was edited or damaged")
    with pytest.raises(LatentSiftError, match=words.replace("(", "\\(").replace(")", "\\)")):
        R.export_dataset(out, tmp_path / "dataset")
    assert _tree(out) == before and not (tmp_path / "dataset").exists()


def test_the_manifest_schema_has_every_rollout_setting():
    assert set(RolloutSettingsFields.model_fields) == {f.name for f in dataclasses.fields(RolloutSettings)}


# --------------------------------------------------------------------------- a damaged task file
@pytest.mark.parametrize("damage", ["cut", "not gzip", "not json"])
def test_a_damaged_task_file_in_a_rollout_folder_is_named_with_what_to_do(damage, tmp_path):
    tasks = load_tasks(_task_file(tmp_path / "tasks.jsonl"))
    out = _folder(tmp_path / "o", tasks, RolloutSettings())
    part = out / R.TASKS_DIR / R.task_file("T/0")
    good = R.gzip_bytes('{"not": "a trajectory"}\n' * 50)
    part.write_bytes({"cut": good[: len(good) // 2], "not gzip": b"plain text\n",
                      "not json": R.gzip_bytes("{oops\n")}[damage])
    for call in (lambda: R.export_dataset(out, tmp_path / "dataset"),
                 lambda: R.assemble_trajectories(out, ["T/0"], tmp_path / "all.jsonl.gz")):  # what a resume runs
        with pytest.raises(LatentSiftError) as e:
            call()
        message = str(e.value)
        assert message.startswith(f"{part}: this task file of the rollout folder is damaged (")
        assert "delete it and run the same rollout command again" in message and "\n" not in message
    assert not (tmp_path / "dataset").exists() and not (tmp_path / "all.jsonl.gz").exists()
    shutil.rmtree(out)
