"""A transformers attention function for a packed batch whose K/V live in a ``KVMemory``.

The model runs on one packed row of tokens (``[1, num_tokens]``: every sequence's new tokens back
to back, as vLLM flattens a batch) without a transformers cache, so each layer hands this
function the new tokens' Q/K/V only. It writes their K/V into the pools at the slots the
allocator's tables give, then attends:

- the leading ``num_paged_decode`` tokens, one per decoding sequence, through the block tables
  with kvbench's ``paged_decode_attention`` (all of them in one kernel call);
- every ``Segment`` after them (a prefill, or in ``gather`` mode a decode step too) on its
  sequence's K/V gathered from the pools, with the stock SDPA.

What a forward needs arrives as the ``kvbench_batch`` keyword, which transformers passes from the
model's ``forward`` down to every attention call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from kvbench.executors.kv_memory import KVMemory
from kvbench.kernels import paged_decode_attention

ATTENTION_NAME = "kvbench_batch"
# transformers' attention kwargs of variants kvbench's kernels do not compute (Mistral's and
# Gemma's sliding windows, Gemma 2's soft-capping, gpt-oss's sinks).
UNSUPPORTED_KWARGS = ("sliding_window", "softcap", "s_aux")


@dataclass(frozen=True)
class Segment:
    """One sequence's tokens attended with SDPA on its gathered K/V.

    Attributes:
        start: index of its first new token in the packed row.
        num_tokens: its new tokens.
        context_slots: int64 [context_len], the pool slots of all its tokens (earlier and new).
    """

    start: int
    num_tokens: int
    context_slots: torch.Tensor


@dataclass(frozen=True)
class BatchLayout:
    """Where a packed forward's K/V go and what each token attends to.

    Attributes:
        memory: the pools.
        slots: int64 [num_tokens], where each new token's K/V go (-1: already in a shared block).
        num_paged_decode: leading tokens read through the paged kernel, one per sequence.
        decode_tables: int32 [num_paged_decode, max_blocks], their block tables (0-padded).
        decode_context_lens: int32 [num_paged_decode], their tokens including the new one.
        max_decode_context: the largest of ``decode_context_lens`` (plans the kernel's tiles).
        segments: the other sequences, in packed order after the decode tokens.
        backend: the paged kernel's backend.
    """

    memory: KVMemory
    slots: torch.Tensor
    num_paged_decode: int
    decode_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    max_decode_context: int
    segments: tuple[Segment, ...]
    backend: str = "torch"


def batch_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    kvbench_batch: BatchLayout | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one layer for a packed batch (signature of transformers' attention functions).

    Args:
        query: [1, num_q_heads, num_tokens, head_dim], after RoPE.
        key, value: [1, num_kv_heads, num_tokens, head_dim], the new tokens only.
        attention_mask: ignored: each sequence's causality follows from its positions.
    Returns:
        output [1, num_tokens, num_q_heads, head_dim] and no attention weights.
    """
    if kvbench_batch is None:
        raise ValueError(f"attention {ATTENTION_NAME!r} needs the kvbench_batch=BatchLayout kwarg")
    # Attention variants the paged kernels do not compute: running them as full attention would
    # give other tokens without a word.
    unsupported = [name for name in UNSUPPORTED_KWARGS if kwargs.get(name) is not None]
    if unsupported:
        raise NotImplementedError(
            f"layer {module.layer_idx} asks for {', '.join(unsupported)}: executor=real computes "
            "plain full attention only; use a model without sliding windows, logit soft-capping "
            "or attention sinks (Llama, SmolLM2, Qwen2 without sliding_window)"
        )
    layout = kvbench_batch
    # transformers' attention modules carry their index as an int (torch types it Tensor|Module).
    layer = cast(int, module.layer_idx)
    token_key = key[0].transpose(0, 1).contiguous()  # [num_tokens, num_kv_heads, head_dim]
    token_value = value[0].transpose(0, 1).contiguous()  # [num_tokens, num_kv_heads, head_dim]
    layout.memory.write(layer, token_key, token_value, layout.slots)
    outputs = []  # each [1, tokens, num_q_heads, head_dim], in packed order
    num_decode = layout.num_paged_decode
    if num_decode:
        decode_query = query[0, :, :num_decode].transpose(0, 1).contiguous()  # [D, Hq, d]
        k_scale, v_scale = layout.memory.scales[layer]  # 1 unless the pools hold fp8
        decoded = paged_decode_attention(
            decode_query,
            layout.memory.keys[layer],
            layout.memory.values[layer],
            layout.decode_tables,
            layout.decode_context_lens,
            scale=scaling,
            backend=layout.backend,
            max_context_len=layout.max_decode_context,
            k_scale=k_scale,
            v_scale=v_scale,
        )  # [D, Hq, d]
        outputs.append(decoded.unsqueeze(0))
    for segment in layout.segments:
        outputs.append(_segment_attention(module, layout.memory, layer, query, segment, scaling))
    return torch.cat(outputs, dim=1), None


def _segment_attention(
    module: torch.nn.Module,
    memory: KVMemory,
    layer: int,
    query: torch.Tensor,
    segment: Segment,
    scaling: float | None,
) -> torch.Tensor:
    """SDPA of one sequence's new tokens over its gathered K/V: [1, num_new, Hq, d]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    key, value = memory.gather(layer, segment.context_slots)  # each [1, Hkv, context_len, d]
    end = segment.start + segment.num_tokens
    segment_query = query[:, :, segment.start : end].contiguous()  # [1, Hq, num_new, d]
    context_len = segment.context_slots.shape[0]
    # A prefill after a prefix-cache hit has fewer queries than keys: the offset causal mask.
    # Otherwise the stock code's own choice (None: causal prefill, full decode).
    needs_offset = 1 < segment.num_tokens < context_len
    mask = (offset_causal_mask(segment.num_tokens, context_len, query.device) if needs_offset
            else None)  # fmt: skip
    output, _ = sdpa_attention_forward(
        module, segment_query, key, value, mask, scaling=scaling
    )  # [1, num_new, Hq, d]
    return output


def offset_causal_mask(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """Bool [1, 1, num_queries, num_keys] on ``device``: query i (position num_keys -
    num_queries + i) sees keys up to its own position."""
    positions = torch.arange(num_keys - num_queries, num_keys, device=device)  # [num_queries]
    return (torch.arange(num_keys, device=device)[None, :] <= positions[:, None])[None, None]


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The model asks its implementation for a mask; this attention builds its own per sequence
    (a packed row's causal mask would cost num_tokens^2)."""
    return None


def register_batch_attention() -> None:
    """Make ``ATTENTION_NAME`` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, batch_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
