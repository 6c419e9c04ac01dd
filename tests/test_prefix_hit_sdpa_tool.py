"""python -m kvbench.tools.prefix_hit_sdpa: a prefix hit's offset-masked SDPA call is compared with
the stock causal call's rows, and the tool prints how many shapes differ."""

from __future__ import annotations

import re

import torch

from kvbench.tools import prefix_hit_sdpa


def test_rows_a_hit_computes_are_the_stock_rows_within_float_rounding():
    generator = torch.Generator().manual_seed(0)
    for num_new, num_keys in prefix_hit_sdpa.shapes(60):
        assert 1 < num_new < num_keys  # a hit leaves at least two new tokens and one cached
        assert prefix_hit_sdpa.row_difference(num_new, num_keys, generator) < 1e-5


def test_a_wrong_mask_would_show_as_a_difference():
    # One key fewer than the hit's rows see: the comparison is not blind to the mask.
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 9, 20, 64, generator=generator) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    stock = sdpa(query, key, value, is_causal=True)[:, :, -5:]
    shifted = prefix_hit_sdpa.offset_causal_mask(5, 20, query.device).roll(1, dims=-1)
    assert (stock - sdpa(query[:, :, -5:], key, value, attn_mask=shifted)).abs().max() > 1e-3


def test_the_tool_prints_its_count(capsys):
    assert prefix_hit_sdpa.main(["--max-keys", "30"]) == 0
    line = capsys.readouterr().out
    match = re.match(r"(\d+) of (\d+) \(new tokens, keys\) shapes differ", line)
    assert match and int(match[2]) == len(prefix_hit_sdpa.shapes(30))
    assert int(match[1]) <= int(match[2])

