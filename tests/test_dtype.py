"""dtype "auto": chosen from the CPU's facts (AMX, AVX512-BF16, ISA limits) and, for AVX512-BF16 without AMX,
a load-robust probe cached per machine; explicit dtypes win."""
from __future__ import annotations

import io

import pytest

from latentsift.states import hardware as H
from latentsift.states import model as M
from latentsift._cli._progress import PlainProgress
from latentsift._core.validation import LatentSiftError


@pytest.fixture
def fresh_choice(monkeypatch, tmp_path):
    """Forget this process's decisions and give the test its own per-machine cache folder."""
    monkeypatch.setattr(H, "_CHOICES", {})
    monkeypatch.setenv(H.CACHE_ENV, str(tmp_path / "cache"))
    yield tmp_path / "cache" / H.DTYPE_CACHE_FILE


def _facts(avx512_bf16=True, amx=False, capability="AVX512", env=(), torch="2.13.0+cpu"):
    return H.CpuFacts(model="Test CPU", avx512_bf16=avx512_bf16, amx=amx, capability=capability,
                      env=tuple(env), torch=torch)


def _probe(speedup, shape=(2048, 576, 1536)):
    return lambda s=shape: H.Probe(tuple(s), 0.05, 0.05 / speedup, 7)


def _no_probe(*_):
    pytest.fail("the facts decide: no measurement")


@pytest.mark.parametrize("facts, dtype, said", [
    (_facts(amx=True), "bfloat16", "AMX present (Test CPU)"),
    (_facts(avx512_bf16=False, capability="AVX2"), "float32", "no AVX512-BF16 or AMX (Test CPU)"),
    (_facts(avx512_bf16=False), "float32", "no AVX512-BF16 or AMX"),
    # the Makefile's AVX2 emulation on a bf16 CPU: the flags say bf16, the kernels cannot use it
    (_facts(amx=True, capability="AVX2"), "float32", "bf16 units unused: ATen runs AVX2 kernels"),
    (_facts(amx=True, env=[("ONEDNN_MAX_CPU_ISA", "AVX2")]), "float32", "bf16 units unused: ONEDNN_MAX_CPU_ISA=AVX2"),
])
def test_the_facts_decide_without_a_measurement(facts, dtype, said, fresh_choice):
    choice = H.cpu_dtype_choice(_no_probe, facts=facts, measure=_no_probe)
    assert (choice.dtype, said in choice.reason) == (dtype, True), choice
    assert not fresh_choice.exists()  # nothing measured, nothing cached


def test_amx_capped_by_onednn_falls_back_to_the_measured_avx512_bf16_rule(fresh_choice):
    facts = _facts(amx=True, env=[("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")])
    c = H.cpu_dtype_choice(facts=facts, measure=_probe(3.0))
    assert c.dtype == "bfloat16" and c.reason.startswith("AVX512-BF16 without AMX, bf16 matmul at 3.00x")


@pytest.mark.parametrize("speedup, dtype", [(4.32, "bfloat16"), (1.25, "bfloat16"), (1.2, "float32"),
                                            (1.0, "float32"), (0.5, "float32")])
def test_avx512_bf16_without_amx_needs_the_margin(speedup, dtype, fresh_choice):
    c = H.cpu_dtype_choice(facts=_facts(), measure=_probe(speedup))
    assert c.dtype == dtype
    assert f"bf16 matmul at {speedup:.2f}x of float32 at 2048x576x1536" in c.reason
    assert "bf16 needs >= 1.25x" in c.reason and f"cached in {fresh_choice}" in c.reason


def test_a_measured_decision_comes_from_the_cache_in_the_next_process(fresh_choice, monkeypatch):
    first = H.cpu_dtype_choice(facts=_facts(), measure=_probe(0.5))
    assert first.dtype == "float32" and fresh_choice.is_file()
    monkeypatch.setattr(H, "_CHOICES", {})  # a new process: only the file remembers
    again = H.cpu_dtype_choice(facts=_facts(), measure=_no_probe)
    assert again == first
    # the cache is per machine, shape and torch version: another one measures again
    other = H.cpu_dtype_choice(facts=_facts(torch="2.14.0+cpu"), measure=_probe(2.0))
    assert other.dtype == "bfloat16"
    shape = H.cpu_dtype_choice((2048, 960, 2560), facts=_facts(), measure=_probe(2.0, (2048, 960, 2560)))
    assert shape.dtype == "bfloat16" and "2048x960x2560" in shape.reason
    # a damaged cache file is measured over, not trusted
    fresh_choice.write_text("{not json")
    monkeypatch.setattr(H, "_CHOICES", {})
    assert H.cpu_dtype_choice(facts=_facts(), measure=_probe(2.0)).dtype == "bfloat16"


def test_the_real_probe_decides_the_same_under_load(fresh_choice, monkeypatch):
    """The probe at the default model's shape on this CPU, with the measured branch forced (the
    facts of an AVX512-BF16 CPU without AMX): a quiet run and one beside a busy thread give the same
    dtype (the minimum of interleaved runs; the margin keeps a near-parity machine on float32)."""
    import threading

    import torch

    facts = _facts()
    quiet = H.cpu_dtype_choice(facts=facts)
    stop = threading.Event()

    def busy():
        torch.set_num_threads(1)
        a = torch.randn(512, 512)
        while not stop.is_set():
            a @ a

    t = threading.Thread(target=busy)
    t.start()
    try:
        monkeypatch.setattr(H, "_CHOICES", {})
        monkeypatch.setenv(H.CACHE_ENV, "off")  # measured again, under load
        loaded = H.cpu_dtype_choice(facts=facts)
    finally:
        stop.set()
        t.join()
    assert loaded.dtype == quiet.dtype, (quiet.reason, loaded.reason)
    assert "measured" in loaded.reason and "cached in" not in loaded.reason


def test_this_machine_s_rule_and_the_model_s_probe_shape(fresh_choice, request, monkeypatch):
    """What the rule picks here, from the real facts (printed for the log), and the shape it would
    measure for the embedded model (read from the session's converted copy, else the GGUF header)."""
    facts = H.cpu_facts()
    assert facts.torch and facts.capability
    bf16, amx, _ = H.usable_bf16_units(facts)
    monkeypatch.setenv(H.CACHE_ENV, request.config._latentsift_cache)
    shape = M.probe_shape(M.default_model_path())
    assert shape == (H.PROBE_TOKENS, 576, 1536)
    monkeypatch.setenv(H.CACHE_ENV, str(fresh_choice.parent))
    c = M.resolve_dtype("auto", "cpu", lambda: shape)
    print(facts, c)
    if amx:
        assert c.dtype == "bfloat16" and "AMX present" in c.reason
    elif bf16:
        assert c.reason.startswith("AVX512-BF16 without AMX, bf16 matmul at") and "2048x576x1536" in c.reason
    else:
        assert c.dtype == "float32" and "measured" not in c.reason


def test_an_explicit_dtype_always_wins(monkeypatch, fresh_choice):
    monkeypatch.setattr(H, "cpu_facts", lambda: pytest.fail("an explicit dtype needs no detection"))
    for d in M.DTYPES:
        assert M.resolve_dtype(d, "cpu") == M.DtypeChoice(d, "set explicitly")
    with pytest.raises(LatentSiftError, match="--dtype must be one of"):
        M.resolve_dtype("int4", "cpu")
    with pytest.raises(LatentSiftError, match="--dtype must be one of"):
        M.load_policy(dtype="fp32")


def test_plain_progress_prints_at_a_steady_interval():
    now = [0.0]
    out = io.StringIO()
    p = PlainProgress(out, interval=30, clock=lambda: now[0])
    for t, done in ((0, 0), (10, 10), (31, 20), (40, 30), (65, 40), (70, 100), (71, 100)):
        now[0] = t
        p.update("extract", done, 100, f"{done * 7} tok/s")
    lines = out.getvalue().splitlines()
    # first call, 30 s after it, 30 s after that, completion; nothing more once complete
    assert [l.split()[1] for l in lines] == ["0/100", "20/100", "40/100", "100/100"]
    assert lines[1] == "[extract]  20/100  (20.0%)  140 tok/s  elapsed 0:31  ETA 2:04"
    assert "ETA" not in lines[-1] and "(100.0%)" in lines[-1]
    # the same stage begun again (premise's proxy run after its own run): its lines and clock start afresh
    for t, done in ((200, 0), (215, 50), (231, 60), (240, 100)):
        now[0] = t
        p.update("extract", done, 100, "")
    again = out.getvalue().splitlines()[len(lines):]
    assert [l.split()[1] for l in again] == ["0/100", "60/100", "100/100"]
    assert again[1] == "[extract]  60/100  (60.0%)  elapsed 0:31  ETA 0:20" and again[2].endswith("elapsed 0:40")


def test_a_stage_begun_again_restarts_its_bar_on_a_terminal():
    from rich.console import Console

    from latentsift._cli._progress import StageProgress
    with StageProgress(Console(file=io.StringIO(), force_terminal=True), plain=False) as p:
        p.update("stage1", 0, 4, "folds")
        p.update("stage1", 4, 4, "folds")
        (task,) = p._bar.tasks
        assert task.finished
        p.update("stage1", 0, 4, "folds")
        assert p._bar.tasks == [task] and task.completed == 0 and not task.finished


def test_a_model_from_the_process_cache_is_said_with_this_calls_dtype_reason():
    """One load per (model, dtype, device) in a process, but each call says why it got that dtype: a load with
    the dtype set explicitly, then one with "auto" that resolves to the same dtype, share the model and say
    their own reasons (the second said "set explicitly" before)."""
    auto = M.resolve_dtype(M.AUTO_DTYPE, "cpu", lambda: M.probe_shape(M.default_model_path()))
    explicit = M.load_policy(dtype=auto.dtype, device="cpu")
    chosen = M.load_policy(device="cpu")
    assert chosen.model is explicit.model and chosen.fingerprint == explicit.fingerprint
    assert explicit.dtype_choice.reason == "set explicitly"
    assert chosen.dtype_choice == auto and chosen.dtype_choice.reason != "set explicitly"
    assert f"({auto.reason})" in chosen.describe()
