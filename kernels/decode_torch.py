"""Torch decode attention, batched over sequences, for any device: two algorithms.

``torch_decode`` (the ``torch`` backend) is the Triton kernel's algorithm: the context is walked
``TILE_TOKENS`` at a time with the same online softmax (fp32 running max, sum and accumulator;
probabilities rounded to the storage dtype before the PV product). It is the benchmark's CPU
timing path, so the paged/contiguous comparison there isolates the gather too.

``sdpa_decode`` (the ``sdpa`` backend) loads each group of sequences' whole contexts as one tile
and hands it to torch's fused ``scaled_dot_product_attention``: one gather and one kernel per
group and layer instead of some ten small ops per tile, 1.7-4.3x quicker on a CPU (SmolLM2's heads:
0.47 against 1.76 ms a layer for 16 sequences of about 100 tokens on this repository's 2-core
machine; docs/kernels.md). The real executor's CPU path.

The two layouts differ only in their tile loader: a paged tile gathers its rows through the block
table, a contiguous tile is a slice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .tiling import TILE_TOKENS

# K/V bytes one group of ``sdpa_decode`` gathers: a few MiB stay in a CPU's caches between the
# gather and the attention that reads them. Measured on this repository's 2-core machine
# (SmolLM2's 3 KV heads of 64, fp32, 32 sequences of 768 tokens): the batch in one group took
# 15 ms a layer, in groups of 4 sequences (3.5 MiB) 6-7 ms, one sequence at a time 11 ms.
SDPA_GROUP_BYTES = 4 << 20
# K/V bytes whose gather and attention cost about what one more SDPA call does (its launch, the
# group's index and mask tensors): where padding a group up to a longer sequence would read more
# than this, the longer sequence starts a group of its own. Measured on the same machine and
# heads: 14 sequences of 5-115 tokens took 0.8 ms a layer in one call, 2.8 ms in one call each,
# so a call costs about 0.15 ms; 14 x 60 tokens took 0.46 ms, 0.55 us (1.5 KiB) a token: a call
# is some 300 tokens' K/V.
SDPA_CALL_BYTES = 512 << 10

def fp8_dequantized(rows: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fp8 ``rows`` (any shape) times ``scale``, in ``dtype``: bit for bit
    ``(rows.float() * scale).to(dtype)``, looked up per byte in a table of the 256 values.

    Why a table: torch converts fp8 one element at a time on a CPU, at a cost that depends on
    the bits; on this project's AMD EPYC (2 threads) the cast and its multiply took 1.39 ns an
    element on normal values and 0.73 ns on zeros, the table's gather with its int32 indices 0.71
    and 0.64 ns.
    """
    table = (_fp8_values(rows.device) * scale).to(dtype)  # [256]: each byte's value
    indices = rows.contiguous().view(torch.uint8).flatten().int()  # [numel]
    return table.index_select(0, indices).view(rows.shape)


@functools.cache
def _fp8_values(device: torch.device) -> torch.Tensor:
    """fp32 [256]: the e4m3 value of every byte (NaN at 0x7F and 0xFF), on ``device``."""
    return torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).float()


# (tile_start, tile_end) -> (key, value), each [num_seqs, tile_end - tile_start, num_kv_heads,
# head_dim] in the storage dtype.
TileLoader = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def paged_tile_loader(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor
) -> TileLoader:
    """Tiles gathered from a block pool.

    key_cache/value_cache [num_blocks, block_size, num_kv_heads, head_dim]; block_tables
    [num_seqs, max_blocks_per_seq] (entries past a sequence's last block must be valid ids: they
    are read and masked, as in the Triton kernel).
    """
    num_blocks, block_size = key_cache.shape[:2]
    tables = block_tables.long()  # [num_seqs, max_blocks_per_seq]: index tensors must be int64
    # [num_blocks * block_size, num_kv_heads, head_dim]: one row per pool slot, so a tile is one
    # index_select of whole rows (3x faster on a CPU than indexing blocks and offsets apart).
    key_rows = key_cache.reshape(num_blocks * block_size, *key_cache.shape[2:])
    value_rows = value_cache.reshape(num_blocks * block_size, *value_cache.shape[2:])

    def load(tile_start: int, tile_end: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.arange(tile_start, tile_end, device=tables.device)  # [tile]
        # Positions past the table's end (a tile overhanging the last block) read block column 0.
        columns = torch.where(tokens // block_size < tables.shape[1], tokens // block_size, 0)
        slots = tables[:, columns] * block_size + tokens % block_size  # [num_seqs, tile]
        tile_shape = (*slots.shape, *key_rows.shape[1:])  # [num_seqs, tile, heads, head_dim]
        key = key_rows.index_select(0, slots.view(-1)).view(tile_shape)
        return key, value_rows.index_select(0, slots.view(-1)).view(tile_shape)

    return load


def contiguous_tile_loader(key: torch.Tensor, value: torch.Tensor) -> TileLoader:
    """Tiles sliced from per-sequence extents.

    key/value [num_seqs, max_len, num_kv_heads, head_dim]: sequence ``i``'s token ``t`` is row
    ``[i, t]``.
    """
    max_len = key.shape[1]

    def load(tile_start: int, tile_end: int) -> tuple[torch.Tensor, torch.Tensor]:
        if tile_end <= max_len:
            return key[:, tile_start:tile_end], value[:, tile_start:tile_end]
        # A tile overhanging the extent: pad with zeros (masked out below). fp8 has no pad
        # kernel: pad its bytes (0x00 is +0.0 in e4m3).
        pad = (0, 0, 0, 0, 0, tile_end - max_len)

        def padded(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.element_size() == 1 and tensor.is_floating_point():
                bytes_view = tensor[:, tile_start:].view(torch.uint8)
                return torch.nn.functional.pad(bytes_view, pad).view(tensor.dtype)
            return torch.nn.functional.pad(tensor[:, tile_start:], pad)

        return padded(key), padded(value)

    return load


def sdpa_decode(
    query: torch.Tensor,
    context_lens: torch.Tensor,
    loader_for: Callable[[torch.Tensor], TileLoader],
    num_kv_heads: int,
    max_context_len: int,
    scale: float,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """Decode attention, each group of sequences' whole contexts in one fused SDPA; returns
    [num_seqs, num_q_heads, head_dim].

    Arguments as ``torch_decode``'s (``num_kv_heads``: the K/V's), but the tiles come from
    ``loader_for(seqs)``, a loader of the sequences ``seqs`` (int64 indices into the batch) that
    returns copies: it is called once per group, for the group's whole context, and the rows past
    each sequence's length are zeroed in place. Groups are planned by ``length_groups``.
    """
    head_dim = query.shape[2]
    token_bytes = 2 * num_kv_heads * head_dim * query.element_size()  # K and V of one token
    lens = tuple(min(max_context_len, n) for n in context_lens.tolist())
    output = torch.empty_like(query)  # [num_seqs, num_q_heads, head_dim]
    plan = length_groups(lens, token_bytes, SDPA_GROUP_BYTES, SDPA_CALL_BYTES)
    for members, group_len in plan:
        seqs = torch.tensor(members, dtype=torch.int64, device=query.device)  # [group]
        output[seqs] = _sdpa_group(query[seqs], context_lens[seqs], loader_for(seqs), group_len,
                                   scale, kv_scales)  # fmt: skip
    return output


@functools.lru_cache(maxsize=16)  # every layer of a step plans the same lengths
def length_groups(
    context_lens: tuple[int, ...], token_bytes: int, group_bytes: int, call_bytes: int
) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The sequences of a batch of ``context_lens`` in groups for ``sdpa_decode``: each group's
    member indices and its length (its longest context), every sequence in one group.

    A group's SDPA reads every member to the group's length, so the plan sorts the sequences by
    length and cuts the sorted run into groups: a sequence joins the group before it unless that
    would re-pad the group's members by more than ``call_bytes`` of K/V (``token_bytes`` a
    token), about what one more call costs, or grow the group past ``group_bytes``. Groups in
    batch order cost what their padding does (SmolLM2's heads, one layer,
    ``python -m kvbench.tools.sdpa_groups``): 32 shuffled contexts of 10-246 tokens took 5.0 ms
    so, 2.1 planned by length; 13 x 40 tokens and one of 320, 2.6 and 0.4 ms (docs/kernels.md).
    """
    order = sorted(range(len(context_lens)), key=context_lens.__getitem__)
    call_tokens = call_bytes // token_bytes
    max_group_tokens = group_bytes // token_bytes
    groups: list[tuple[list[int], int]] = []  # (members, length: the last one's, the longest)
    for index in order:
        length = context_lens[index]
        if groups:
            members, group_len = groups[-1]
            repad_tokens = len(members) * (length - group_len)
            if repad_tokens <= call_tokens and (len(members) + 1) * length <= max_group_tokens:
                members.append(index)
                groups[-1] = (members, length)
                continue
        groups.append(([index], length))
    return tuple((tuple(sorted(members)), length) for members, length in groups)


def _sdpa_group(
    query: torch.Tensor,
    context_lens: torch.Tensor,
    load_tile: TileLoader,
    context_len: int,
    scale: float,
    kv_scales: tuple[float, float],
) -> torch.Tensor:
    """One group's decode attention over its first ``context_len`` tokens, in one fused SDPA:
    [num_seqs, num_q_heads, head_dim]."""
    num_seqs = query.shape[0]
    # key, value: [num_seqs, context_len, num_kv_heads, head_dim]
    key, value = load_tile(0, context_len)
    if key.element_size() == 1:  # fp8: dequantize on load, to the query's dtype
        key = fp8_dequantized(key, kv_scales[0], query.dtype)
        value = fp8_dequantized(value, kv_scales[1], query.dtype)
    tokens = torch.arange(context_len, device=query.device)  # [context_len]
    visible = tokens < context_lens.long().view(num_seqs, 1)  # [num_seqs, context_len]
    # Zero K/V past each context: a slot may hold anything, and the fused kernel adds the mask to
    # the scores (NaN + -inf is NaN) and weighs the values by probability 0 (0 x NaN is NaN).
    # Indexing the hidden rows costs what they are; a where over the whole tile cost as much as
    # the attention (SmolLM2's heads, 16 sequences of 64-128 tokens).
    hidden = (~visible).nonzero(as_tuple=True)  # (sequence, token) index pairs
    key[hidden] = 0.0
    value[hidden] = 0.0
    out = torch.nn.functional.scaled_dot_product_attention(
        query.unsqueeze(2),  # [num_seqs, num_q_heads, 1, head_dim]
        key.transpose(1, 2),  # [num_seqs, num_kv_heads, context_len, head_dim]
        value.transpose(1, 2),
        attn_mask=visible.view(num_seqs, 1, 1, -1),  # [num_seqs, 1, 1, context_len]
        scale=scale,
        enable_gqa=True,  # query head h reads KV head h // group, as the kernels do
    )  # [num_seqs, num_q_heads, 1, head_dim]
    return out.squeeze(2)


def torch_decode(
    query: torch.Tensor,
    context_lens: torch.Tensor,
    load_tile: TileLoader,
    max_context_len: int,
    scale: float,
    tile_tokens: int = TILE_TOKENS,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """Tiled online-softmax decode attention; returns [num_seqs, num_q_heads, head_dim].

    query [num_seqs, num_q_heads, head_dim]; context_lens [num_seqs]; ``load_tile`` yields K/V
    tiles of the layout; ``max_context_len`` bounds the tiles walked (>= every context length).
    K/V stored in fp8 are dequantized on load: times ``kv_scales`` (K, V), rounded to the query's
    dtype, as the Triton kernel does.
    """
    num_seqs, num_q_heads, head_dim = query.shape
    storage_dtype = query.dtype
    lens = context_lens.long().view(num_seqs, 1, 1, 1)  # [num_seqs, 1, 1, 1]
    # The online softmax's state, set by the first tile.
    running_max: torch.Tensor | None = None
    running_sum: torch.Tensor | None = None
    acc: torch.Tensor | None = None
    for tile_start in range(0, max_context_len, tile_tokens):
        tile_end = tile_start + tile_tokens
        # key, value: [num_seqs, tile, num_kv_heads, head_dim]
        key, value = load_tile(tile_start, tile_end)
        if key.element_size() == 1:  # fp8: dequantize on load, to the query's dtype
            key = fp8_dequantized(key, kv_scales[0], storage_dtype)
            value = fp8_dequantized(value, kv_scales[1], storage_dtype)
        num_kv_heads = key.shape[2]
        # [num_seqs, num_kv_heads, group, head_dim]: query heads grouped by the KV head they read.
        grouped_query = query.float().view(num_seqs, num_kv_heads, -1, head_dim)
        scores = torch.einsum("shgd,sthd->shgt", grouped_query, key.float()) * scale
        tokens = torch.arange(tile_start, tile_end, device=query.device)  # [tile]
        scores = scores.masked_fill(tokens >= lens, float("-inf"))  # [num_seqs, heads, group, tile]
        tile_max = scores.amax(-1)  # [num_seqs, num_kv_heads, group]
        new_max = tile_max if running_max is None else torch.maximum(running_max, tile_max)
        # A sequence whose context ended before this tile has new_max from earlier tiles (finite);
        # -inf only if it has no token at all, which callers exclude (context_lens >= 1).
        probs = torch.exp(scores - new_max.unsqueeze(-1))  # [num_seqs, heads, group, tile]
        tile_sum = probs.sum(-1)  # [num_seqs, num_kv_heads, group], fp32 as in the kernel
        pv_probs = probs.to(storage_dtype).float()  # the kernel's PV operand precision
        # Zero the values past each context (as the Triton kernel's masked loads do): slots there
        # may hold anything, even NaN, and 0 x NaN would poison the sum.
        valid = (tokens < lens.view(num_seqs, 1)).view(num_seqs, -1, 1, 1)  # [num_seqs, tile, 1, 1]
        value = torch.where(valid, value.float(), 0.0)  # [num_seqs, tile, num_kv_heads, head_dim]
        tile_acc = torch.einsum("shgt,sthd->shgd", pv_probs, value)
        if running_max is None or running_sum is None or acc is None:  # the first tile
            running_sum, acc = tile_sum, tile_acc
        else:
            rescale = torch.exp(running_max - new_max)  # [num_seqs, num_kv_heads, group]
            running_sum = running_sum * rescale + tile_sum
            acc = acc * rescale.unsqueeze(-1) + tile_acc
        running_max = new_max
    if running_sum is None or acc is None:
        raise ValueError(f"max_context_len={max_context_len}: must be >= 1 (no tile to read)")
    out = acc / running_sum.unsqueeze(-1)  # [num_seqs, num_kv_heads, group, head_dim]
    return out.reshape(num_seqs, num_q_heads, head_dim).to(storage_dtype)
