"""Float64 reference decode attention: one sequence at a time, plain softmax, no tiling.

Deliberately the most obvious code: the tests and the GPU check compare every kernel against it.
"""

from __future__ import annotations

import math

import torch


def gather_paged_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: list[int], context_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's K/V, in token order, from a block pool.

    key_cache/value_cache [num_blocks, block_size, num_kv_heads, head_dim]; returns two
    [context_len, num_kv_heads, head_dim] tensors.
    """
    block_size = key_cache.shape[1]
    num_blocks = -(-context_len // block_size)
    blocks = torch.tensor(block_table[:num_blocks], dtype=torch.long, device=key_cache.device)
    keys = key_cache[blocks].flatten(0, 1)[:context_len]  # [context_len, num_kv_heads, head_dim]
    values = value_cache[blocks].flatten(0, 1)[:context_len]
    return keys, values


def reference_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """softmax(q K^T * scale) V in float64 for one sequence.

    query [num_q_heads, head_dim]; keys/values [context_len, num_kv_heads, head_dim];
    returns [num_q_heads, head_dim] float64.
    """
    num_q_heads, head_dim = query.shape
    group_size = num_q_heads // keys.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    keys = keys.double().repeat_interleave(group_size, dim=1)  # [context_len, num_q_heads, dim]
    values = values.double().repeat_interleave(group_size, dim=1)
    scores = torch.einsum("hd,thd->ht", query.double(), keys) * scale  # [num_q_heads, context]
    return torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), values)


def reference_paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """``paged_decode_attention`` in float64, sequence by sequence: [num_seqs, num_q_heads, dim]."""
    outputs = []
    for seq, context_len in enumerate(context_lens.tolist()):
        table = block_tables[seq].tolist()
        keys, values = gather_paged_kv(key_cache, value_cache, table, context_len)
        outputs.append(reference_attention(query[seq], keys, values, scale))
    return torch.stack(outputs)


def reference_contiguous_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """``contiguous_decode_attention`` in float64: [num_seqs, num_q_heads, head_dim]."""
    outputs = [
        reference_attention(query[seq], key[seq, :length], value[seq, :length], scale)
        for seq, length in enumerate(context_lens.tolist())
    ]
    return torch.stack(outputs)
