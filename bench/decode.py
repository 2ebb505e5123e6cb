"""Decode steps in the stored weight layout against the rollout's decode layout, side by side in one run
(``latentsift.states.decode``; ``latentsift rollout`` samples in ``decode_layout_for(policy)``):

    nice .venv/bin/python bench/decode.py [--models smollm2,qwen0.5b,qwen1.5b] [--steps 8] [--rounds 5]

For each model: K rows (the run's samples: 16, or 8 for the 1.5B policy) after a prompt of ``--prompt``
tokens; one measurement = ``--steps`` decode steps (the decoder stack on one token per row and the
language-model head on the last hidden vectors, as ``OnlineBatch`` runs them), the cache cut back to the
prompt after each. The layouts (stored; ``in-out``; the rollout's, ``decode_layout_for``: ``mkl-packed``
where torch has MKL) alternate ``--rounds`` times; printed: each layout's
median CPU seconds per step, the GFLOP/s of the step's linear products, and the median of the
per-round ratios (stored / layout: above 1 = faster than the stored layout). ``smollm2`` is the packaged GGUF's
real weights; the Qwen2.5-Coder-0.5B and 1.5B shapes get random weights (not downloaded here). The
logits of the two layouts are compared too (largest absolute difference: their last bits differ).

Times are the process's CPU seconds at one torch thread, so another process on a shared machine
slows neither layout by taking its core (they still share the memory bandwidth); alternating the
layouts spreads what remains over both.
"""
from __future__ import annotations

import argparse
import statistics
import time

QWEN = {   # Qwen2.5-Coder-{0.5B,1.5B}-Instruct's config.json (tied embeddings, biased q/k/v)
    "qwen0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, k=16),
    "qwen1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                     num_key_value_heads=2, k=8),
}


def load(name: str):
    """(policy, K) of one bench model."""
    import torch

    from latentsift.states.model import Policy, load_policy

    if name == "smollm2":
        return load_policy(dtype="float32", device="cpu"), 16
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = dict(QWEN[name])
    k = spec.pop("k")
    cfg = Qwen2Config(vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True, **spec)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    return Policy(model=model, tokenizer=None, fingerprint=None, path=name), k


def linear_flops(policy, k: int) -> int:
    """Floating-point operations of one decode step's linear products at ``k`` rows (head included)."""
    import torch

    n = sum(m.weight.numel() for m in policy.base.modules() if isinstance(m, torch.nn.Linear))
    return 2 * k * (n + policy.model.get_output_embeddings().weight.numel())


def steps(policy, cache, k: int, prompt: int, n: int, gen):
    """CPU seconds of ``n`` decode steps after the cached prompt, and the last step's logits."""
    import torch

    mask = torch.ones(k, prompt, dtype=torch.long)
    vocab = policy.model.config.vocab_size
    t0 = time.process_time()
    for i in range(n):
        feed = torch.randint(vocab, (k, 1), generator=gen)
        mask = torch.cat([mask, torch.ones(k, 1, dtype=torch.long)], 1)
        pos = torch.full((k, 1), prompt + i, dtype=torch.long)
        out = policy.base(input_ids=feed, attention_mask=mask, position_ids=pos, past_key_values=cache,
                          use_cache=True)
        logits = policy.model.lm_head(out.last_hidden_state[:, -1]).float()
    seconds = time.process_time() - t0
    cache.crop(-n)   # back to the prompt
    return seconds, logits


def bench(name: str, a) -> None:
    import torch
    from transformers import DynamicCache

    from latentsift.states.decode import IN_OUT_LAYOUT, STORED_LAYOUT, decode_layout_for, decode_weights

    policy, k = load(name)
    layout = decode_layout_for(policy)
    layouts = list(dict.fromkeys((STORED_LAYOUT, IN_OUT_LAYOUT, layout)))
    vocab = policy.model.config.vocab_size
    ids = torch.randint(vocab, (1, a.prompt), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        cache = DynamicCache(config=policy.model.config)
        policy.base(input_ids=ids, use_cache=True, past_key_values=cache)
        for layer in cache.layers:
            layer.batch_repeat_interleave(k)
        times: dict[str, list[float]] = {lay: [] for lay in layouts}
        logits = {}
        for _ in range(a.rounds):
            for lay in layouts:
                with decode_weights(policy, lay, k):
                    sec, logits[lay] = steps(policy, cache, k, a.prompt, a.steps, torch.Generator().manual_seed(2))
                times[lay].append(sec / a.steps)
    flops = linear_flops(policy, k)
    cfg = policy.model.config
    print(f"\n{name}: d_model {cfg.hidden_size}, d_ff {cfg.intermediate_size}, {cfg.num_hidden_layers} layers, "
          f"vocab {vocab}; K = {k} rows, prompt {a.prompt}, {a.steps} steps x {a.rounds} rounds")
    for lay in layouts:
        med = statistics.median(times[lay])
        print(f"  {lay:26s} {1e3 * med:8.1f} ms/step  linears {flops / med / 1e9:6.1f} GFLOP/s  "
              f"(rounds: {', '.join(f'{1e3 * t:.0f}' for t in times[lay])} ms)")
    for lay in layouts[1:]:
        ratios = [o / n for o, n in zip(times[STORED_LAYOUT], times[lay])]
        diff = (logits[STORED_LAYOUT] - logits[lay]).abs().max().item()
        tag = " (the rollout's)" if lay == layout else ""
        print(f"  ratio stored / {lay}{tag}: median "
              f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); "
              f"logits max |diff| {diff:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,qwen0.5b,qwen1.5b")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=256)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, MKL {torch._C.has_mkl}, 1 thread")
    for name in a.models.split(","):
        bench(name.strip(), a)


if __name__ == "__main__":
    main()
