"""What the CPU is, which dtype ``dtype="auto"`` runs on it, and what fixes the bytes of its states.

The dtype rule (:func:`decide_cpu_dtype`) reads stable facts first and measures only where the facts
leave the answer open:

- AMX usable (``torch.cpu._is_amx_tile_supported()``, AVX-512 kernels, no ``ONEDNN_MAX_CPU_ISA``
  below AMX): bfloat16, no measurement;
- no usable AVX512-BF16 (an AVX2-only CPU, or ATen / oneDNN limited below it by
  ``ATEN_CPU_CAPABILITY`` / ``ONEDNN_MAX_CPU_ISA``): float32, no measurement;
- AVX512-BF16 without AMX: bf16 matmuls may run at half the float32 rate (a 2-core Xeon: 164 against
  327 GFLOP/s) or at four times it (Zen 4), so the rate decides: the model's own linear
  (``PROBE_TOKENS`` x d_model by d_model x d_ff) at one torch thread, as the forwards run, float32 and
  bfloat16 interleaved ``PROBE_REPEATS`` times, the minimum time of each (other load only adds time,
  and both dtypes see the same load); bfloat16 when it runs at least ``BF16_MIN_SPEEDUP`` x float32.

A measured decision is kept per machine in ``dtype.json`` under the user cache folder, keyed by the
CPU model, the facts above and the torch version, so every later process takes the same dtype
whatever the machine's load (the reason says when it was measured and where it is cached).

:func:`kernel_record` names what decides a state's bytes beyond the model and dtype (torch version,
ATen's CPU capability, the bf16 units oneDNN dispatches on, the ISA-limiting environment variables,
the forward's thread count); the state store records it and refuses to resume under another.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from .._core.io import CACHE_ENV, atomic_write_json, cache_root
from .._core.threads import NUMERIC_THREADS, fixed_threads

DTYPE_CACHE_FILE = "dtype.json"
#: Rows of the probe's matmul: one prefill chunk (``states.DEFAULT_CHUNK_TOKENS``).
PROBE_TOKENS = 2048
#: The probe's (rows, d_model, d_ff) when the model's own are not given: the embedded SmolLM2-135M's MLP.
DEFAULT_PROBE_SHAPE = (PROBE_TOKENS, 576, 1536)
#: Interleaved float32 / bfloat16 runs of the probe (the minimum time of each counts).
PROBE_REPEATS = 7
#: bfloat16 is chosen on an AVX512-BF16 CPU without AMX only when the probe runs at least this many
#: times the float32 rate: a clear margin, so that a measurement near parity still picks float32.
BF16_MIN_SPEEDUP = 1.25
#: The environment variables that change which CPU kernels run (and so the bits they round to).
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
           "DNNL_DEFAULT_FPMATH_MODE", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE")
#: Bumped when the rule changes: cached decisions of an older rule are not used.
RULE_VERSION = 1


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a policy runs in, and why (``auto`` resolves from the hardware; an explicit dtype wins)."""

    dtype: str
    reason: str


@dataclass(frozen=True)
class CpuFacts:
    """What the dtype rule reads about this machine (all stable while the machine and setup are)."""

    model: str                  # the CPU's model name
    avx512_bf16: bool | None    # torch's feature checks (None: this torch build lacks the check)
    amx: bool | None
    capability: str             # torch.backends.cpu.get_cpu_capability(), after ATEN_CPU_CAPABILITY
    env: tuple[tuple[str, str], ...]  # the ISA_ENV variables that are set
    torch: str

    def key(self, shape: tuple[int, int, int]) -> str:
        blob = json.dumps([asdict(self), list(shape), RULE_VERSION], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Probe:
    """Minimum times of the interleaved probe runs, and the bf16 speed as a multiple of float32's."""

    shape: tuple[int, int, int]   # (rows, d_model, d_ff): x (rows, d_model) times W^T (d_model, d_ff)
    seconds_fp32: float
    seconds_bf16: float
    repeats: int

    @property
    def speedup(self) -> float:
        return self.seconds_fp32 / max(self.seconds_bf16, 1e-12)

    def gflops(self, seconds: float) -> float:
        m, k, n = self.shape
        return 2 * m * k * n / max(seconds, 1e-12) / 1e9


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_check(name: str) -> bool | None:
    import torch

    fn = getattr(torch.cpu, name, None)
    try:
        return bool(fn()) if fn is not None else None
    except Exception:  # pragma: no cover - a torch build without the check
        return None


def cpu_facts() -> CpuFacts:
    """This machine's facts, as torch sees them."""
    import torch

    return CpuFacts(model=_cpu_model(), avx512_bf16=_torch_check("_is_avx512_bf16_supported"),
                    amx=_torch_check("_is_amx_tile_supported"),
                    capability=str(torch.backends.cpu.get_cpu_capability()),
                    env=tuple((k, os.environ[k]) for k in ISA_ENV if os.environ.get(k)),
                    torch=torch.__version__)


def _onednn_isa(facts: CpuFacts) -> str:
    env = dict(facts.env)
    return (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").upper()


def usable_bf16_units(facts: CpuFacts) -> tuple[bool, bool, str]:
    """(AVX512-BF16 usable, AMX usable, what limits them): a unit counts when the CPU has it, ATen
    runs AVX-512 kernels and oneDNN is not capped below it."""
    isa = _onednn_isa(facts)
    uncapped = isa in ("", "ALL", "DEFAULT")
    allowed = uncapped or any(s in isa for s in ("BF16", "AMX", "FP16", "AVX10"))
    avx512 = facts.capability.upper().startswith("AVX512")
    limit = "" if avx512 and allowed else (f"ATen runs {facts.capability} kernels" if not avx512
                                            else f"ONEDNN_MAX_CPU_ISA={isa}")
    bf16 = bool(facts.avx512_bf16) and avx512 and allowed
    amx = bool(facts.amx) and avx512 and (uncapped or "AMX" in isa)
    return bf16 or amx, amx, limit


def measure_bf16_speed(shape: tuple[int, int, int], repeats: int = PROBE_REPEATS) -> Probe:
    """Time ``x @ W^T`` at ``shape`` in float32 and bfloat16, interleaved ``repeats`` times after one
    warm-up each, at ``NUMERIC_THREADS`` torch threads (as the forwards run); the minimum of each."""
    import torch

    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    pairs = {"float32": (x, w), "bfloat16": (x.bfloat16(), w.bfloat16())}
    best = {name: float("inf") for name in pairs}
    with fixed_threads(NUMERIC_THREADS), torch.inference_mode():
        for a, b in pairs.values():
            torch.nn.functional.linear(a, b)
        for _ in range(repeats):
            for name, (a, b) in pairs.items():
                t0 = time.perf_counter()
                torch.nn.functional.linear(a, b)
                best[name] = min(best[name], time.perf_counter() - t0)
    return Probe(tuple(shape), best["float32"], best["bfloat16"], repeats)


def decide_cpu_dtype(facts: CpuFacts, measure: Callable[[], Probe]) -> tuple[DtypeChoice, Probe | None]:
    """The rule of this module's docstring: facts first, ``measure()`` only for AVX512-BF16 without AMX."""
    bf16, amx, limit = usable_bf16_units(facts)
    if amx:
        return DtypeChoice("bfloat16", f"AMX present ({facts.model})"), None
    if not bf16:
        why = f"bf16 units unused: {limit}" if limit and facts.avx512_bf16 else "no AVX512-BF16 or AMX"
        return DtypeChoice("float32", f"{why} ({facts.model})"), None
    p = measure()
    m, k, n = p.shape
    rate = (f"bf16 matmul at {p.speedup:.2f}x of float32 at {m}x{k}x{n} ({p.gflops(p.seconds_bf16):.0f} against "
            f"{p.gflops(p.seconds_fp32):.0f} GFLOP/s, best of {p.repeats} interleaved one-thread runs; bf16 needs "
            f">= {BF16_MIN_SPEEDUP}x)")
    dtype = "bfloat16" if p.speedup >= BF16_MIN_SPEEDUP else "float32"
    return DtypeChoice(dtype, f"AVX512-BF16 without AMX, {rate}"), p


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


_CHOICES: dict[tuple, DtypeChoice] = {}


def cpu_dtype_choice(shape: tuple[int, int, int] | Callable[[], tuple[int, int, int]] = DEFAULT_PROBE_SHAPE,
                     *, facts: CpuFacts | None = None,
                     measure: Callable[[tuple[int, int, int]], Probe] = measure_bf16_speed) -> DtypeChoice:
    """The dtype of ``auto`` on this CPU (:func:`decide_cpu_dtype`). ``shape``: the probe's (rows,
    d_model, d_ff), or a function giving it (called only when a measurement is needed; default: the
    embedded SmolLM2-135M's linear). A measured decision is read from and written to the per-machine
    cache (:func:`cache_root` / ``dtype.json``); one decision per process and shape."""
    facts = facts or cpu_facts()
    bf16, amx, _ = usable_bf16_units(facts)
    if amx or not bf16:
        return decide_cpu_dtype(facts, lambda: None)[0]
    shape = tuple(shape() if callable(shape) else shape)
    key = facts.key(shape)
    if (facts, shape) in _CHOICES:
        return _CHOICES[(facts, shape)]
    root = cache_root()
    path = None if root is None else root / DTYPE_CACHE_FILE
    entry = _read_cache(path).get(key) if path is not None else None
    if (isinstance(entry, dict) and entry.get("dtype") in ("bfloat16", "float32")
            and isinstance(entry.get("reason"), str)):
        choice = DtypeChoice(entry["dtype"],
                             f"{entry['reason']}, measured {entry.get('measured', '?')}, cached in {path}")
    else:
        made, probe = decide_cpu_dtype(facts, lambda: measure(shape))
        when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        choice = DtypeChoice(made.dtype, f"{made.reason}, measured {when}" + (f", cached in {path}" if path else ""))
        if path is not None:
            data = _read_cache(path)
            data[key] = {"dtype": made.dtype, "reason": made.reason, "measured": when, "facts": asdict(facts),
                         "shape": list(shape), "seconds": [probe.seconds_fp32, probe.seconds_bf16]}
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(path, data)
            except OSError:  # a read-only cache folder: decided again by the next process
                pass
    _CHOICES[(facts, shape)] = choice
    return choice


def kernel_record(device) -> dict:
    """What decides a state's bytes besides the model, dtype and settings, for the store's manifest."""
    import torch

    dev = torch.device(device)
    rec: dict = {torch.__name__: torch.__version__, "device": dev.type, "forward_threads": NUMERIC_THREADS}
    if dev.type == "cuda":
        rec |= {"cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(dev)}
        return rec
    facts = cpu_facts()
    return rec | {"cpu_capability": facts.capability, "avx512_bf16": facts.avx512_bf16, "amx": facts.amx,
                  "env": dict(facts.env)}
