"""Rollout generation speed levers, side by side in one run (``latentsift rollout``'s engine,
``latentsift.states.online.OnlineBatch``):

    .venv/bin/python bench/rollout.py [--model FILE.gguf] [--k 8] [--new 64] [--rounds 2] [--threads 1]

Printed:
- **capture**: the same seeded batch generated with online state capture and without it (the same
  tokens are drawn either way): tokens/s and the capture's overhead;
- **leave**: finished samples leaving the batch at once vs staying until the last one stops;
- **dtype**: float32 vs bfloat16 (native AVX512-BF16 / AMX kernels, else emulated);
- **static cache**: transformers' ``generate`` with its dynamic vs static KV cache on the same batch (no
  capture; our loop uses the dynamic cache);
- **bound**: the decode rate next to its memory-bandwidth bound: every decode step reads all weights
  once (the embedding table only for its rows, except where tied to the head), so steps/s <= copy
  bandwidth / weight bytes; tokens/s bound = that times the batch.

Times are the process's CPU seconds (``time.process_time``; run at one torch thread), so that other
processes on a shared machine slow no variant's figure by taking its core; they still share the memory
bandwidth. Variants alternate within each round; the figures are the best round. Keep it short.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def copy_bandwidth(mb: int = 256, repeats: int = 3) -> float:
    """Bytes/s of a large tensor copy (read + write counted), best of ``repeats``."""
    import torch

    a = torch.empty(mb * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best


def weight_bytes(policy) -> int:
    """Bytes read per decode step: every parameter except the input embedding table (a lookup reads
    one row per token), unless it is the head's weight too (tied), which reads all of it."""
    model = policy.model
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if emb.data_ptr() != head.data_ptr():
        total -= emb.numel() * emb.element_size()
    return total


def prompt_target(policy):
    from latentsift.rollout.agent import RolloutSettings, generation_suffix, target_of
    from latentsift.rollout.tasks import load_tasks
    from latentsift.trajectories.trajectory import Trajectory

    task = load_tasks()[0]
    s = RolloutSettings()
    t = Trajectory(traj_id="bench", instance_id=task.task_id, repo="", steps=[], system_prompt=s.system_prompt,
                   task_prompt=s.user_template.format(prompt=task.prompt))
    return target_of(t, policy.tokenizer, generation_suffix(policy.tokenizer))


def run_batch(policy, target, k: int, new: int, *, capture: bool, leave: bool) -> tuple[float, int, int]:
    """(CPU seconds, tokens sampled, tokens run) of one turn of ``k`` samples (seeds 0..k-1)."""
    from latentsift.states.online import OnlineBatch, Sampling
    from latentsift.rollout.agent import stop_ids

    batch = OnlineBatch(policy, list(range(k)), stop_ids(policy), capture=capture, leave=leave)
    t0 = time.process_time()
    gen = batch.turn(list(range(k)), [target] * k, Sampling(0.8, 0.95, new))
    return time.process_time() - t0, sum(map(len, gen)), batch.n_forward_tokens


def hf_generate(policy, target, k: int, new: int, cache: str) -> tuple[float, int]:
    import torch

    ids = torch.as_tensor(target.input_ids)[None].repeat(k, 1)
    torch.manual_seed(0)
    t0 = time.process_time()
    with torch.inference_mode():
        out = policy.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                    temperature=0.8, top_p=0.95, max_new_tokens=new, min_new_tokens=new,
                                    cache_implementation=cache, pad_token_id=policy.tokenizer.pad_token_id)
    return time.process_time() - t0, int((out.shape[1] - ids.shape[1]) * k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: leave,dtype,static")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))

    import torch

    from latentsift.states.model import cpu_dtype_choice, load_policy

    torch.set_num_threads(a.threads)
    bw = copy_bandwidth()
    print(f"copy bandwidth: {bw / 1e9:.1f} GB/s (read + write), torch threads {a.threads}; "
          f"dtype auto here: {cpu_dtype_choice().dtype} ({cpu_dtype_choice().reason})")
    pols = {"float32": load_policy(a.model, dtype="float32", device="cpu")}
    if "dtype" not in skip:
        pols["bfloat16"] = load_policy(a.model, dtype="bfloat16", device="cpu")
    target = prompt_target(pols["float32"])
    print(f"model {pols['float32'].describe()}; prompt {target.n_tokens} tokens, K = {a.k}, "
          f"{a.new} new tokens per sample at most")
    variants = {"float32 capture": ("float32", True, True), "float32 no capture": ("float32", False, True)}
    if "leave" not in skip:
        variants["float32 capture, finished stay"] = ("float32", True, False)
    if "dtype" not in skip:
        variants["bfloat16 capture"] = ("bfloat16", True, True)
        variants["bfloat16 no capture"] = ("bfloat16", False, True)
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(max(1, a.rounds)):
        for name, (dt, cap, leave) in variants.items():
            r = run_batch(pols[dt], target, a.k, a.new, capture=cap, leave=leave)
            if name not in best or r[0] < best[name][0]:
                best[name] = r
    hf: dict[str, tuple[float, int]] = {}
    if "static" not in skip:
        for _ in range(max(1, a.rounds)):
            for cache in ("dynamic", "static"):
                r = hf_generate(pols["float32"], target, a.k, a.new, cache)
                if cache not in hf or r[0] < hf[cache][0]:
                    hf[cache] = r
    print(f"\n{'variant':34s} {'cpu s':>7s} {'sampled':>8s} {'run':>7s} {'tok/s':>8s}")
    for name, (sec, gen, fwd) in best.items():
        print(f"{name:34s} {sec:7.2f} {gen:8d} {fwd:7d} {gen / sec:8.1f}")
    for cache, (sec, gen) in hf.items():
        print(f"{'transformers generate, ' + cache:34s} {sec:7.2f} {gen:8d} {'':>7s} {gen / sec:8.1f}")
    c, n = best["float32 capture"], best["float32 no capture"]
    print(f"\ncapture overhead (float32): {100 * (c[0] / n[0] - 1):+.1f}% CPU time, same {c[1]} tokens")
    if "bfloat16 capture" in best:
        b = best["bfloat16 capture"][0] / best["bfloat16 no capture"][0]
        print(f"capture overhead (bfloat16): {100 * (b - 1):+.1f}%")
        print(f"bfloat16 / float32 speed (capture): {c[0] / best['bfloat16 capture'][0]:.2f}x")
    if "float32 capture, finished stay" in best:
        s = best["float32 capture, finished stay"]
        print(f"finished samples leaving the batch: {s[0] / c[0]:.2f}x faster than staying "
              f"({c[2]} vs {s[2]} tokens run)")
    if hf:
        print(f"static vs dynamic KV cache (transformers generate): {hf['dynamic'][0] / hf['static'][0]:.2f}x")
    for dt, pol in pols.items():
        wb = weight_bytes(pol)
        name = f"{dt} capture"
        sec, gen, _ = best[name]
        bound_steps = bw / wb
        print(f"{dt}: weights read per step {wb / 1e6:.0f} MB -> bound {bound_steps:.1f} steps/s = "
              f"{bound_steps * a.k:.0f} tok/s at K = {a.k}; measured {gen / sec:.1f} tok/s "
              f"({100 * gen / sec / (bound_steps * a.k):.0f}% of the bound; prefill included)")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
