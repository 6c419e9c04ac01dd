"""A transformers attention function whose K/V live in kvbench's block pool.

Registered under ``ATTENTION_NAME`` through transformers' ``AttentionInterface``; the model runs
without a transformers cache (``use_cache=False``), so each layer hands this function only the
new tokens' K/V, and the pool is the only cache. What a forward needs (pool, block table,
slots, mode) arrives as the ``kvbench_paged`` keyword argument, which transformers passes from
the model's ``forward`` down to every attention call.

Modes:
- ``paged``: decode steps read K/V through the block table with ``paged_decode_attention``.
- ``gather``: K/V are gathered back through the block table into a contiguous cache and the
  stock SDPA attention runs on it, as with transformers' own cache (bit-identical logits).
Prefill (more than one query token) always runs the stock SDPA on the gathered K/V.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from kvbench.executors.attention import offset_causal_mask
from kvbench.executors.forward import slots_of
from kvbench.executors.kv_memory import KVMemory
from kvbench.kernels import paged_decode_attention

ATTENTION_NAME = "kvbench_paged"
MODES = ("paged", "gather")


@dataclass(frozen=True)
class PagedStep:
    """One sequence's forward over the pool.

    Attributes:
        pool: the per-layer block pools.
        block_table: int32 [1, num_blocks_of_seq], the sequence's physical blocks.
        context_len: tokens of the sequence after this forward (cached + new).
        slots: int64 [num_new_tokens], where the new tokens' K/V go (-1: already in the pool).
        mode: ``paged`` or ``gather`` (module docstring).
        backend: the paged kernel's backend (``torch``, or ``triton`` under the interpreter).
    """

    pool: KVMemory
    block_table: torch.Tensor
    context_len: int
    slots: torch.Tensor
    mode: str = "paged"
    backend: str = "torch"


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    kvbench_paged: PagedStep | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one layer over the pool (signature of transformers' attention functions).

    Args:
        query: [1, num_q_heads, num_new_tokens, head_dim], after RoPE.
        key, value: [1, num_kv_heads, num_new_tokens, head_dim], the new tokens only.
        attention_mask: ignored: causality follows from the positions in the pool.
    Returns:
        output [1, num_new_tokens, num_q_heads, head_dim] and no attention weights.
    """
    if kvbench_paged is None:
        raise ValueError(f"attention {ATTENTION_NAME!r} needs the kvbench_paged=PagedStep kwarg")
    step = kvbench_paged
    # transformers' attention modules carry their index as an int; torch types any attribute of a
    # Module as Tensor | Module.
    layer = cast(int, module.layer_idx)
    # [1, heads, new, dim] -> [new, heads, dim], the pools' row layout
    step.pool.write(layer, key[0].transpose(0, 1).contiguous(),
                    value[0].transpose(0, 1).contiguous(), step.slots)  # fmt: skip
    if query.shape[2] == 1 and step.mode == "paged":
        return _paged_decode(step, layer, query, scaling), None
    return _stock_on_gathered(module, step, layer, query, scaling), None


def _paged_decode(
    step: PagedStep, layer: int, query: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    context_lens = torch.tensor([step.context_len], dtype=torch.int32)  # [1]
    k_scale, v_scale = step.pool.scales[layer]
    output = paged_decode_attention(
        query[:, :, 0].contiguous(),  # [1, num_q_heads, head_dim]
        step.pool.keys[layer],
        step.pool.values[layer],
        step.block_table,
        context_lens,
        scale=scaling,
        backend=step.backend,
        k_scale=k_scale,
        v_scale=v_scale,
    )  # [1, num_q_heads, head_dim]
    return output.unsqueeze(1)  # [1, 1, num_q_heads, head_dim]


def _stock_on_gathered(
    module: torch.nn.Module,
    step: PagedStep,
    layer: int,
    query: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    context_slots = slots_of(step.block_table[0].tolist(), 0, step.context_len,
                             step.pool.block_size)  # [context_len]  # fmt: skip
    # [1, kv_heads, context_len, head_dim] each: an fp8 pool's K/V times its layer's scales, a
    # float pool's unchanged (the bit-identity check needs that).
    key, value = step.pool.gather(layer, context_slots)
    num_new = query.shape[2]
    # [1, 1, num_new, context_len] or None. A prefill after a prefix-cache hit has fewer queries
    # than keys and needs the offset causal mask; otherwise the stock code's own choice (None:
    # causal prefill, full decode) keeps the same SDPA call as transformers' cache makes.
    needs_offset = 1 < num_new < step.context_len
    mask = offset_causal_mask(num_new, step.context_len, query.device) if needs_offset else None
    output, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)
    return output  # [1, num_new, num_q_heads, head_dim]


def register_paged_attention() -> None:
    """Make ``ATTENTION_NAME`` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    # The model builds a mask for any implementation; this function ignores it.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
