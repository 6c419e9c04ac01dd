"""How decode attention walks a context: tiles of tokens, and splits of the context across programs.

Both layouts (paged and contiguous) and both backends use these numbers, so a paged/contiguous
comparison differs only in how a tile's K/V rows are addressed.
"""

from __future__ import annotations

from dataclasses import dataclass

# Tokens of K/V one loop iteration loads: 32 rows x head_dim keeps a tile of K and one of V (fp16,
# head_dim 128: 8 KiB each) in registers with room for double buffering, and is >= 16, the
# smallest N tl.dot accepts.
TILE_TOKENS = 32
# A split covers at least this many tokens: below it the cost of merging partial results
# outweighs the extra parallelism.
MIN_SPLIT_TOKENS = 256
# Most splits of one context (flash-decoding): enough to fill a GPU with one long sequence.
MAX_SPLITS = 16


@dataclass(frozen=True)
class SplitPlan:
    """How one decode call cuts every context into splits run by separate programs.

    Attributes:
        num_splits: splits per (sequence, KV head); split ``s`` covers tokens
            ``[s * split_tokens, (s + 1) * split_tokens)`` of each context (empty past its end).
        split_tokens: tokens per split, a multiple of ``TILE_TOKENS``.
    """

    num_splits: int
    split_tokens: int


def _cdiv(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def plan_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_context_len: int,
    num_programs_wanted: int,
    num_splits: int | None = None,
) -> SplitPlan:
    """Splits that give about ``num_programs_wanted`` programs (or exactly ``num_splits``).

    One program per (sequence, KV head) leaves a GPU idle when the batch is small; splitting the
    context (flash-decoding) adds programs at the price of a merge. ``max_context_len`` is the
    longest context the call may see (an upper bound is fine: extra splits are empty).
    """
    num_tiles = max(1, _cdiv(max_context_len, TILE_TOKENS))
    if num_splits is None:
        num_base_programs = max(1, num_seqs * num_kv_heads)
        most_splits = max(1, min(MAX_SPLITS, max_context_len // MIN_SPLIT_TOKENS))
        num_splits = min(most_splits, _cdiv(num_programs_wanted, num_base_programs))
    if num_splits < 1:
        raise ValueError(f"num_splits={num_splits}: must be >= 1")
    num_splits = min(num_splits, num_tiles)  # no split without a tile
    tiles_per_split = _cdiv(num_tiles, num_splits)
    return SplitPlan(num_splits=num_splits, split_tokens=tiles_per_split * TILE_TOKENS)
