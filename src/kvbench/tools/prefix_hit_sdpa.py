"""``python -m kvbench.tools.prefix_hit_sdpa``: how often a prefill after a prefix-cache hit
(an SDPA call over the new tokens with an offset causal mask) differs bit for bit from the same
rows of the stock model's causal call over the whole prompt, on this machine's torch.

Not a test: it prints figures measured in one run (docs/metrics.md, "logit equivalence"). Random
fp32 Q/K/V at SmolLM2's attention width (9 heads of 64), one call pair per (new tokens, keys).
"""

from __future__ import annotations

import argparse

import torch

from kvbench.executors.attention import offset_causal_mask
from kvbench.tools import count_at_least

NUM_HEADS, HEAD_DIM = 9, 64


def row_difference(num_new: int, num_keys: int, generator: torch.Generator) -> float:
    """Largest abs difference between the last ``num_new`` rows of a causal SDPA call over
    ``num_keys`` positions and an offset-masked call of those rows alone (0.0: bit-identical)."""
    query, key, value = (torch.randn(1, NUM_HEADS, num_keys, HEAD_DIM, generator=generator)
                         for _ in range(3))  # fmt: skip  # each [1, heads, num_keys, head_dim]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    stock = sdpa(query, key, value, is_causal=True)[:, :, -num_new:]  # [1, heads, num_new, dim]
    mask = offset_causal_mask(num_new, num_keys, query.device)  # [1, 1, num_new, num_keys]
    hit = sdpa(query[:, :, -num_new:], key, value, attn_mask=mask)  # [1, heads, num_new, dim]
    return (stock - hit).abs().max().item()


def shapes(max_keys: int) -> list[tuple[int, int]]:
    """(new tokens, keys) pairs: keys 9 to ``max_keys`` in steps of 7, new tokens 2 to keys - 1
    in steps of 5 (one new token is a decode step: the same call either way)."""
    return [(num_new, num_keys) for num_keys in range(9, max_keys + 1, 7)
            for num_new in range(2, num_keys, 5)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-keys", type=count_at_least(9), default=198)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    differences = [row_difference(num_new, num_keys, generator)
                   for num_new, num_keys in shapes(args.max_keys)]  # fmt: skip
    num_differing = sum(difference > 0 for difference in differences)
    print(f"{num_differing} of {len(differences)} (new tokens, keys) shapes differ, worst "
          f"{max(differences):.2g}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
