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
from kvbench.kernels import paged_decode_attention
from kvbench.tasks.equivalence.kv_pool import KVPool

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

    pool: KVPool
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
    step.pool.write(layer, key, value, step.slots)
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

    key, value = step.pool.gather(layer, step.block_table[0], step.context_len)
    # An fp8 pool is dequantized (times its layer's scales) to the query's dtype before SDPA; a
    # float pool's scales are 1 and its K/V pass unchanged (the bit-identity check needs that).
    k_scale, v_scale = step.pool.scales[layer]
    key, value = _dequantized(key, k_scale, query.dtype), _dequantized(value, v_scale, query.dtype)
    num_new = query.shape[2]
    # [1, 1, num_new, context_len] or None. A prefill after a prefix-cache hit has fewer queries
    # than keys and needs the offset causal mask; otherwise the stock code's own choice (None:
    # causal prefill, full decode) keeps the same SDPA call as transformers' cache makes.
    needs_offset = 1 < num_new < step.context_len
    mask = offset_causal_mask(num_new, step.context_len, query.device) if needs_offset else None
    output, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)
    return output  # [1, num_new, num_q_heads, head_dim]


def _dequantized(stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Pool K or V (any shape) in ``dtype``: times ``scale`` unless it is 1."""
    return stored.to(dtype) if scale == 1.0 else (stored.float() * scale).to(dtype)


def register_paged_attention() -> None:
    """Make ``ATTENTION_NAME`` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    # The model builds a mask for any implementation; this function ignores it.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
