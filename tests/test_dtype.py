"""dtype "auto": chosen from the hardware (feature flags AND a timed probe), explicit dtypes win."""
from __future__ import annotations

import io

import pytest

from latentsift.states import model as M
from latentsift._cli._progress import PlainProgress
from latentsift._core.validation import LatentSiftError


@pytest.fixture
def fresh_choice(monkeypatch):
    """Forget the per-process choice so that each test decides again with its patched detection."""
    monkeypatch.setattr(M, "_CPU_CHOICE", [])
    yield


def _flags(avx512_bf16, amx):
    return lambda: {"_is_avx512_bf16_supported": avx512_bf16, "_is_amx_tile_supported": amx}


def test_auto_is_float32_on_a_cpu_without_native_bf16(monkeypatch, fresh_choice):
    monkeypatch.setattr(M, "_cpu_bf16_flags", _flags(False, False))
    monkeypatch.setattr(M, "matmul_rates", lambda: pytest.fail("no probe needed when no bf16 unit is reported"))
    c = M.resolve_dtype("auto", "cpu")
    assert c.dtype == "float32" and "without native bf16" in c.reason


def test_auto_is_bfloat16_where_flags_and_probe_agree(monkeypatch, fresh_choice):
    monkeypatch.setattr(M, "_cpu_bf16_flags", _flags(True, None))
    monkeypatch.setattr(M, "matmul_rates", lambda: {"float32": 105.0, "bfloat16": 476.0})
    c = M.resolve_dtype("auto", "cpu")
    assert c.dtype == "bfloat16" and "AVX512-BF16" in c.reason and "476.0 GFLOP/s" in c.reason
    # decided once per process: a later call does not probe again
    monkeypatch.setattr(M, "matmul_rates", lambda: pytest.fail("probed twice"))
    assert M.resolve_dtype("auto", "cpu") == c


def test_auto_trusts_the_probe_over_the_flags(monkeypatch, fresh_choice):
    """ATEN_CPU_CAPABILITY=avx2 / ONEDNN_MAX_CPU_ISA=AVX2: the flag still says bf16, the kernels don't."""
    monkeypatch.setattr(M, "_cpu_bf16_flags", _flags(True, False))
    monkeypatch.setattr(M, "matmul_rates", lambda: {"float32": 60.0, "bfloat16": 1.3})
    c = M.resolve_dtype("auto", "cpu")
    assert c.dtype == "float32" and "slow" in c.reason


def test_an_explicit_dtype_always_wins(monkeypatch, fresh_choice):
    monkeypatch.setattr(M, "_cpu_bf16_flags", lambda: pytest.fail("an explicit dtype needs no detection"))
    for d in M.DTYPES:
        assert M.resolve_dtype(d, "cpu") == M.DtypeChoice(d, "set explicitly")
    with pytest.raises(LatentSiftError, match="'dtype' parameter must be one of"):
        M.resolve_dtype("int4", "cpu")
    with pytest.raises(LatentSiftError, match="load_policy must be one of"):
        M.load_policy(dtype="fp32")


def test_the_real_probe_measures_both_dtypes():
    r = M.matmul_rates(n=64, repeats=1)
    assert set(r) == {"float32", "bfloat16"} and all(v > 0 for v in r.values())


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
