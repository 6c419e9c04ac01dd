"""The shapes ``task=profile`` times: decode batches, prefills, mixed iterations, wake-ups,
swap copies.

Each point is one iteration the real executor runs. Decode batches span batch sizes, contexts
(spread around their mean, as a real batch's are) and the kernel's block sizes (1: a contiguous
allocator's arena); prefills span prompt lengths and counts; wake-ups are a prefill timed after
idle waits of several lengths; swaps span sizes and block sizes. Sized to take a few minutes on
two CPU cores (docs/sim_to_real.md).
"""

from __future__ import annotations

from dataclasses import dataclass

# Kernel block sizes: 1 (the contiguous allocators' arena), and paged blocks.
BLOCK_SIZES = (1, 16, 64)
# 1-4 and 6: the steps of a matmul library's kernel choice by rows (the stair terms).
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 16, 32)
DECODE_MEAN_CONTEXTS = (64, 256, 768)
PREFILL_PROMPTS = (16, 64, 256)
PREFILL_COUNTS = (1, 2)
SWAP_TOKENS = (256, 2048)
# Idle waits (s) before a timed 64-token prefill: what the wake terms are fitted on.
WAKE_WAITS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class IterationPoint:
    """One iteration to time.

    Attributes:
        block_size: the kernel's block size (1: a contiguous allocator).
        decode_contexts: each decoding sequence's context, the new token included.
        prefill_prompts: each prefilled sequence's prompt tokens.
        wait_s: seconds the executor idles before each run of it (a wake-up point).
    """

    block_size: int
    decode_contexts: tuple[int, ...] = ()
    prefill_prompts: tuple[int, ...] = ()
    wait_s: float = 0.0

    def num_slots(self, output_tokens: int) -> int:
        """Slots a pool needs to hold the point: every sequence with room for ``output_tokens``
        (a ``naive_oracle`` reservation), in whole blocks (a buddy arena's power-of-two extents
        for block size 1), plus the executor's warm-up."""
        tokens = [n + output_tokens + 1 for n in (*self.decode_contexts, *self.prefill_prompts)]
        if self.block_size == 1:  # a buddy arena: extents of powers of two, twice the room
            return 2 * sum(1 << (n - 1).bit_length() for n in [*tokens, 17])
        return sum(-(-n // self.block_size) * self.block_size for n in [*tokens, 17])


@dataclass(frozen=True)
class SwapPoint:
    """A swap of ``num_tokens`` tokens out to swap space and back, blocks of ``block_size``."""

    block_size: int
    num_tokens: int


def spread_contexts(num_seqs: int, mean_context: int) -> tuple[int, ...]:
    """``num_seqs`` contexts evenly spread over [mean / 2, 3 mean / 2] (mean ``mean_context``)."""
    if num_seqs == 1:
        return (mean_context,)
    low, high = mean_context // 2, mean_context * 3 // 2
    return tuple(low + (high - low) * i // (num_seqs - 1) for i in range(num_seqs))


def iteration_grid() -> list[IterationPoint]:
    """Every iteration point, in the order they are timed."""
    points = [
        IterationPoint(block_size, decode_contexts=spread_contexts(num_seqs, context))
        for block_size in BLOCK_SIZES
        for num_seqs in DECODE_BATCHES
        for context in DECODE_MEAN_CONTEXTS
    ]
    points += [
        IterationPoint(block_size, prefill_prompts=(prompt,) * count)
        for block_size in (1, 16)
        for prompt in PREFILL_PROMPTS
        for count in PREFILL_COUNTS
    ]
    points += [  # prefill and decode in one iteration, as continuous batching runs them
        IterationPoint(block_size, spread_contexts(8, 256), (prompt,))
        for block_size in (1, 16)
        for prompt in (32, 128)
    ]
    points += [IterationPoint(16, prefill_prompts=(64,), wait_s=wait_s) for wait_s in WAKE_WAITS_S]
    return points


def swap_grid() -> list[SwapPoint]:
    """Every swap point."""
    return [SwapPoint(block_size, tokens) for block_size in BLOCK_SIZES for tokens in SWAP_TOKENS]
