"""Triton decode attention: one kernel for both KV layouts, split over the context, then merged.

A program handles one (sequence, KV head, split): every query head of that KV head's group (GQA)
attends to the split's tokens, ``TILE_TOKENS`` at a time, with an online softmax in fp32. The
paged and the contiguous layout run the very same code; the ``PAGED`` switch changes only how a
tile's token rows are addressed (through the block table, or at a fixed stride), so a timing
difference between the two is the cost of the indirection and nothing else.

Imported only by the ``triton`` backend, so ``import kvbench.kernels`` never imports triton (tests
set ``TRITON_INTERPRET=1`` before the first kernel is compiled). Only long-stable ``tl`` APIs are
used (Triton 3.0 through 3.7).
"""

# The @triton.jit kernels take device pointers, strides and tl.constexpr parameters, unannotated
# as Triton's own kernels are (Triton reads parameter annotations to specialize a kernel).
# mypy: allow-untyped-defs, allow-incomplete-defs

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiling import TILE_TOKENS, SplitPlan

# Programs wanted per streaming multiprocessor: two keep the memory system busy while one waits.
PROGRAMS_PER_SM = 2
NUM_WARPS = 4
NUM_STAGES = 2


@triton.jit
def _dot(a, b, FP32: tl.constexpr):
    """a @ b with fp32 accumulation; fp32 pinned to IEEE (NVIDIA would otherwise use TF32)."""
    if FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _decode_split_kernel(
    query_ptr,  # [num_seqs, num_q_heads, head_dim]
    # paged: [num_blocks, block_size, num_kv_heads, head_dim]; contiguous: [num_seqs, max_len, ...]
    key_ptr,
    value_ptr,  # same shape and strides as key
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32 (read only when PAGED)
    context_lens_ptr,  # [num_seqs] int32
    out_ptr,  # [num_seqs, num_q_heads, num_splits, head_dim]: fp32 partials, or the output
    lse_ptr,  # [num_seqs, num_q_heads, num_splits] fp32: log-sum-exp of each split's scores
    scale,
    k_scale,  # fp8 K/V: dequantization scales (read only when KV_FP8)
    v_scale,
    split_tokens,
    stride_q_seq,
    stride_q_head,
    stride_kv_outer,  # per block (paged) or per sequence (contiguous)
    stride_kv_token,
    stride_kv_head,
    stride_table_seq,
    stride_out_seq,
    stride_out_head,
    stride_out_split,
    stride_lse_seq,
    stride_lse_head,
    QUERY_GROUP_SIZE: tl.constexpr,
    PADDED_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PADDED_HEAD_DIM: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
    DOT_FP32: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    split_start = split * split_tokens
    split_end = tl.minimum(split_start + split_tokens, context_len)

    group = tl.arange(0, PADDED_GROUP)  # [PADDED_GROUP]: the query heads of this KV head
    dims = tl.arange(0, PADDED_HEAD_DIM)  # [PADDED_HEAD_DIM]
    group_mask = group < QUERY_GROUP_SIZE
    dim_mask = dims < HEAD_DIM
    q_heads = kv_head * QUERY_GROUP_SIZE + group  # [PADDED_GROUP]
    q_offsets = seq * stride_q_seq + q_heads[:, None] * stride_q_head + dims[None, :]
    q_mask = group_mask[:, None] & dim_mask[None, :]
    # [PADDED_GROUP, PADDED_HEAD_DIM]
    query = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)

    running_max = tl.full([PADDED_GROUP], float("-inf"), tl.float32)  # [PADDED_GROUP]
    running_sum = tl.zeros([PADDED_GROUP], tl.float32)  # [PADDED_GROUP]
    acc = tl.zeros([PADDED_GROUP, PADDED_HEAD_DIM], tl.float32)  # [PADDED_GROUP, PADDED_HEAD_DIM]
    for tile_start in range(split_start, split_end, TILE):
        tokens = tile_start + tl.arange(0, TILE)  # [TILE]
        token_mask = tokens < split_end
        if PAGED:
            block_ids = tl.load(
                block_tables_ptr + seq * stride_table_seq + tokens // BLOCK_SIZE,
                mask=token_mask,
                other=0,
            )  # [TILE]
            # int64: a large pool's offsets pass 2**31 elements.
            slots = tokens % BLOCK_SIZE  # [TILE]
            rows = block_ids.to(tl.int64) * stride_kv_outer + slots * stride_kv_token  # [TILE]
        else:
            rows = seq.to(tl.int64) * stride_kv_outer + tokens.to(tl.int64) * stride_kv_token
        # [TILE, PADDED_HEAD_DIM]
        kv_offsets = rows[:, None] + kv_head * stride_kv_head + dims[None, :]
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        key = tl.load(key_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [TILE, PADDED_HEAD_DIM]
        value = tl.load(value_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [TILE, PADDED_HEAD_DIM]
        if KV_FP8:  # dequantize on load: one byte per element in memory, the query's dtype after
            key = (key.to(tl.float32) * k_scale).to(query.dtype)
            value = (value.to(tl.float32) * v_scale).to(query.dtype)

        scores = _dot(query, tl.trans(key), DOT_FP32) * scale  # [PADDED_GROUP, TILE]
        scores = tl.where(token_mask[None, :], scores, float("-inf"))
        # Every tile holds at least one token (tile_start < split_end), so new_max is finite.
        new_max = tl.maximum(running_max, tl.max(scores, 1))  # [PADDED_GROUP]
        rescale = tl.exp(running_max - new_max)  # [PADDED_GROUP]; 0 on the first tile
        probs = tl.exp(scores - new_max[:, None])  # [PADDED_GROUP, TILE]
        running_sum = running_sum * rescale + tl.sum(probs, 1)
        # The PV product takes probabilities in the storage dtype (tensor cores), as FlashAttention.
        acc = acc * rescale[:, None] + _dot(probs.to(value.dtype), value, DOT_FP32)
        running_max = new_max

    # An empty split (past the end of a short context) leaves sum 0: output 0 and weight 0.
    has_tokens = running_sum > 0.0  # [PADDED_GROUP]
    safe_sum = tl.where(has_tokens, running_sum, 1.0)
    out = acc / safe_sum[:, None]  # [PADDED_GROUP, PADDED_HEAD_DIM]
    lse = tl.where(has_tokens, running_max + tl.log(safe_sum), float("-inf"))  # [PADDED_GROUP]
    out_offsets = (
        seq * stride_out_seq
        + q_heads[:, None] * stride_out_head
        + split * stride_out_split
        + dims[None, :]
    )
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    lse_offsets = seq * stride_lse_seq + q_heads * stride_lse_head + split
    tl.store(lse_ptr + lse_offsets, lse, mask=group_mask)


@triton.jit
def _merge_splits_kernel(
    partial_ptr,  # [num_seqs, num_q_heads, num_splits, head_dim] fp32
    lse_ptr,  # [num_seqs, num_q_heads, num_splits] fp32
    out_ptr,  # [num_seqs, num_q_heads, head_dim]
    num_splits,
    stride_partial_seq,
    stride_partial_head,
    stride_partial_split,
    stride_lse_seq,
    stride_lse_head,
    stride_out_seq,
    stride_out_head,
    PADDED_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PADDED_HEAD_DIM: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, PADDED_SPLITS)  # [PADDED_SPLITS]
    dims = tl.arange(0, PADDED_HEAD_DIM)  # [PADDED_HEAD_DIM]
    split_mask = splits < num_splits
    dim_mask = dims < HEAD_DIM
    lse = tl.load(
        lse_ptr + seq * stride_lse_seq + head * stride_lse_head + splits,
        mask=split_mask,
        other=float("-inf"),
    )  # [PADDED_SPLITS]
    # Split 0 always holds a token, so the max is finite; empty splits get weight exp(-inf) = 0.
    weights = tl.exp(lse - tl.max(lse, 0))  # [PADDED_SPLITS]
    offsets = (
        seq * stride_partial_seq
        + head * stride_partial_head
        + splits[:, None] * stride_partial_split
        + dims[None, :]
    )
    partials = tl.load(
        partial_ptr + offsets, mask=split_mask[:, None] & dim_mask[None, :], other=0.0
    )  # [PADDED_SPLITS, PADDED_HEAD_DIM]
    out = tl.sum(weights[:, None] * partials, 0) / tl.sum(weights, 0)  # [PADDED_HEAD_DIM]
    out_offsets = seq * stride_out_seq + head * stride_out_head + dims
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=dim_mask)


def _padded(size: int, minimum: int) -> int:
    """The power of two >= size and >= minimum (tl.arange and tl.dot need powers of two >= 16)."""
    return max(minimum, triton.next_power_of_2(size))


def num_programs_wanted(device: torch.device) -> int:
    """How many programs fill ``device``: a few per SM on a GPU, 1 under the interpreter."""
    if device.type != "cuda":
        return 1
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def triton_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_tables: torch.Tensor | None,
    context_lens: torch.Tensor,
    scale: float,
    plan: SplitPlan,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """Decode attention over a paged (``block_tables`` given) or contiguous K/V; see the module.

    query [num_seqs, num_q_heads, head_dim]; key/value [num_blocks, block_size, num_kv_heads,
    head_dim] (paged) or [num_seqs, max_len, num_kv_heads, head_dim]; returns
    [num_seqs, num_q_heads, head_dim] in the query's dtype.
    """
    # The kernel steps the query's, the output's and the tables' last dims with stride 1.
    query = query.contiguous()
    block_tables = None if block_tables is None else block_tables.contiguous()
    num_seqs, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[2]
    group_size = num_q_heads // num_kv_heads
    out = torch.empty_like(query)  # [num_seqs, num_q_heads, head_dim], contiguous
    if plan.num_splits == 1:
        # One split: the kernel writes the final output directly (no merge, no fp32 partials).
        partial = out.unsqueeze(2)  # [num_seqs, num_q_heads, 1, head_dim]
    else:
        partial = torch.empty(
            (num_seqs, num_q_heads, plan.num_splits, head_dim), dtype=torch.float32,
            device=query.device,
        )  # fmt: skip
    lse = torch.empty(
        (num_seqs, num_q_heads, plan.num_splits), dtype=torch.float32, device=query.device
    )  # [num_seqs, num_q_heads, num_splits]
    paged = block_tables is not None
    # unread when contiguous
    tables = block_tables if block_tables is not None else context_lens.view(num_seqs, 1)
    padded_head_dim = _padded(head_dim, 16)
    # bf16 tl.dot is wrong under the CPU interpreter (it multiplies the raw bits): compute in fp32
    # there. On a GPU, fp16/bf16 operands go to tensor cores with fp32 accumulation.
    dot_fp32 = query.dtype == torch.float32 or query.device.type == "cpu"
    _decode_split_kernel[(num_seqs, num_kv_heads, plan.num_splits)](
        query, key, value, tables, context_lens, partial, lse,
        scale, kv_scales[0], kv_scales[1], plan.split_tokens,
        query.stride(0), query.stride(1),
        key.stride(0), key.stride(1), key.stride(2),
        tables.stride(0),
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        QUERY_GROUP_SIZE=group_size,
        PADDED_GROUP=_padded(group_size, 16),
        HEAD_DIM=head_dim,
        PADDED_HEAD_DIM=padded_head_dim,
        TILE=TILE_TOKENS,
        BLOCK_SIZE=key.shape[1] if paged else 1,
        PAGED=paged,
        DOT_FP32=dot_fp32,
        KV_FP8=key.element_size() == 1,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )  # fmt: skip
    if plan.num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_q_heads)](
            partial, lse, out, plan.num_splits,
            partial.stride(0), partial.stride(1), partial.stride(2),
            lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            PADDED_SPLITS=_padded(plan.num_splits, 2),
            HEAD_DIM=head_dim,
            PADDED_HEAD_DIM=padded_head_dim,
        )  # fmt: skip
    return out
