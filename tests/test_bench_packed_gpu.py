"""bench/packed_gpu.py, the prepared GPU script of issue 52, run on a CPU before any GPU sees it: tiny shapes, in
a Python that sees only torch, transformers, numpy, what they require, and latentsift's source (as on the GPU
machine, where nothing can be installed), without pydantic and threadpoolctl (the script's stand-ins take their
place). It must give every mode a rate, and the library's packed states must equal the one-per-forward ones."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "packed_gpu.py"
ON_THE_GPU_MACHINE = ("torch", "transformers", "numpy")
LEFT_OUT = {"pydantic", "pydantic-core", "threadpoolctl"}   # latentsift's, not theirs: maybe absent there


def _distributions(roots) -> list:
    """``roots`` and everything they require (extras left out), as installed here, less LEFT_OUT."""
    todo, seen, dists = list(roots), set(), []
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen or name in LEFT_OUT:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        dists.append(dist)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dists


def _bare_site(folder: Path) -> Path:
    """A site folder with links to the files of :func:`_distributions` only."""
    folder.mkdir()
    for dist in _distributions(ON_THE_GPU_MACHINE):
        for top in {Path(f).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (folder / top).exists():
                (folder / top).symlink_to(src)
    return folder


def test_the_gpu_script_runs_on_a_cpu_with_only_torch_transformers_and_numpy(tmp_path):
    site = _bare_site(tmp_path / "site")
    out = tmp_path / "packed.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT / "src")])
    argv = ["--device", "cpu", "--tiny", "--threads", "1", "--budget-tokens", "1500", "--pack", "512,2048",
            "--long-n", "1", "--long-tokens", "2500", "--rounds", "2", "--out", str(out)]
    # -S: no site-packages but the bare folder; the check fails if the script or latentsift imports anything else
    proc = subprocess.run([sys.executable, "-S", str(SCRIPT), *argv], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert sorted(res["facts"]["stand_ins"]) == ["pydantic", "threadpoolctl"]
    assert set(res["shapes"]) == {"smollm2", "qwen1.5b"}
    for shape, r in res["shapes"].items():
        assert "error" not in r and not r["skipped"], (shape, r)
        modes = r["modes"]
        for name in ("bound@512", "bound@2048", "bound-loop@2048", "rows@2048", "bare-single", "single", "packed@512", "packed@2048",
                     "long"):
            assert modes[name]["tok_s"] > 0 and len(modes[name]["seconds"]) == 2, (shape, name)
        assert modes["single"]["tokens"] == modes["packed@2048"]["tokens"] == modes["bound@2048"]["tokens"] >= 1500
        assert set(r["ratios"]) >= {"packed@2048 / bound@2048", "packed@2048 / single"}
        # the library's packed states are the one-per-forward states (float32), every round the same bytes
        for name in ("packed@512", "packed@2048"):
            assert r["agreement"][name]["span_layers"] > 0 and r["agreement"][name]["max_rel"] <= 1e-5
        assert all(r["same_bytes_every_round"].values())
        assert r["team_replay_hours"]["long"] > 0
    assert "240 M tokens" in proc.stdout and "computed from the measured rates" in proc.stdout


def _fake_varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                      window_size=(-1, -1)):
    """torch.nn.attention.varlen.varlen_attn's contract on a CPU (no GQA keyword): causal by window_size."""
    import torch
    import torch.nn.functional as F

    assert window_size == (-1, 0) and key.shape[1] == query.shape[1] and cu_seq_q is cu_seq_k
    cuts = cu_seq_q.tolist()
    assert max_q == max_k == max(b - a for a, b in zip(cuts[:-1], cuts[1:]))
    return torch.cat([F.scaled_dot_product_attention(*(x[a:b].transpose(0, 1) for x in (query, key, value)),
                                                     is_causal=True, scale=scale).transpose(0, 1)
                      for a, b in zip(cuts[:-1], cuts[1:])])


def _fake_varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    assert is_causal
    return _fake_varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size=(-1, 0))


def test_the_scripts_varlen_call_matches_attention_per_sequence():
    """The bound's GPU-only glue (layout, GQA, causal flag of either varlen_attn signature), checked on a CPU
    against a stand-in keeping varlen_attn's contract: the same output as sdpa on each sequence."""
    import importlib.util

    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    spec = importlib.util.spec_from_file_location("packed_gpu", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    module = LlamaAttention(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2), 0)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 20, 16, generator=g) for h in (4, 2, 2))
    bounds = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    per_sequence = bench.Varlen("cpu")
    ref, _ = per_sequence(module, q, k, v, None, cu_seq_lens_q=bounds, max_length_q=8, scaling=module.scaling)
    assert per_sequence.kind == "sdpa per sequence" and ref.shape == (1, 20, 4, 16)
    for fake in (_fake_varlen_2_11, _fake_varlen_2_10):
        varlen = bench.Varlen("cpu")
        varlen.fn, varlen.params = fake, set(inspect.signature(fake).parameters)
        got, _ = varlen(module, q, k, v, None, cu_seq_lens_q=bounds, max_length_q=8, scaling=module.scaling)
        assert varlen.fn is fake, varlen.why          # no fallback taken
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
