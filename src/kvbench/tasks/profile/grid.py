"""The shapes ``task=profile`` times: decode batches, prefills, mixed iterations, wake-ups,
swap copies.

Each point is one iteration the real executor runs. Decode batches span batch sizes, contexts
(spread around their mean, as a real batch's are) and the kernel's block sizes (1: a contiguous
allocator's arena); prefills span prompt lengths and counts; wake-ups are a prefill timed after
idle waits of several lengths; swaps span sizes and block sizes. What each spans is the config's
``profile_grid`` (``conf/profile_grid/``: ``cpu``, a few minutes on two CPU cores, or ``gpu``, a
GPU's batches and contexts; docs/sim_to_real.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvbench.core.request import Request
from kvbench.engine.cost_model import IterationShape, iteration_shape
from kvbench.engine.records import RequestRecord
from kvbench.engine.sequence import Sequence

if TYPE_CHECKING:
    from kvbench.config import ProfileGridConfig

OUTPUT_TOKENS = 8  # every timed sequence's output length (its reservation under naive_oracle)
WAKE_PROMPT_TOKENS = 64  # the prefill timed after each idle wait
WAKE_BLOCK_SIZE = 16
# The shape features a profile prices (engine.profiled), each a step column too: a step above
# every step a profile was fitted on in one of them is priced by extrapolation.
RANGE_FEATURES = ("num_prefill_tokens", "prefill_attention_pairs", "num_decode_tokens",
                  "decode_context_tokens")  # fmt: skip
GIB = 1 << 30


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

    @property
    def num_slots(self) -> int:
        """Slots its pool holds: the tokens' blocks, twice (copied out of one, back into
        others)."""
        return 2 * -(-self.num_tokens // self.block_size) * self.block_size


def spread_contexts(num_seqs: int, mean_context: int) -> tuple[int, ...]:
    """``num_seqs`` contexts evenly spread over [mean / 2, 3 mean / 2] (mean ``mean_context``)."""
    if num_seqs == 1:
        return (mean_context,)
    low, high = mean_context // 2, mean_context * 3 // 2
    return tuple(low + (high - low) * i // (num_seqs - 1) for i in range(num_seqs))


def iteration_grid(grid: ProfileGridConfig, token_bytes: int) -> list[IterationPoint]:
    """Every iteration point of ``grid``, in the order they are tabled, less those whose pool
    (``token_bytes`` of K/V a slot) would pass ``grid.max_pool_gib``."""
    points = [
        IterationPoint(block_size, decode_contexts=spread_contexts(num_seqs, context))
        for block_size in grid.block_sizes
        for num_seqs in grid.decode_batches
        for context in grid.decode_mean_contexts
    ]
    points += [
        IterationPoint(block_size, prefill_prompts=(prompt,) * count)
        for block_size in grid.prefill_block_sizes
        for prompt in grid.prefill_prompts
        for count in grid.prefill_counts
    ]
    points += [  # prefill and decode in one iteration, as continuous batching runs them
        IterationPoint(block_size, spread_contexts(grid.mixed_decodes, grid.mixed_mean_context),
                       (prompt,))
        for block_size in grid.prefill_block_sizes
        for prompt in grid.mixed_prompts
    ]  # fmt: skip
    points += [IterationPoint(WAKE_BLOCK_SIZE, prefill_prompts=(WAKE_PROMPT_TOKENS,), wait_s=wait_s)
               for wait_s in grid.wake_waits_s]  # fmt: skip
    return [point for point in points
            if _fits(grid, point.num_slots(OUTPUT_TOKENS) * token_bytes)]  # fmt: skip


def swap_grid(grid: ProfileGridConfig, token_bytes: int) -> list[SwapPoint]:
    """Every swap point of ``grid`` whose pool (``SwapPoint.num_slots``) fits."""
    points = [SwapPoint(block_size, tokens) for block_size in grid.block_sizes
              for tokens in grid.swap_tokens]  # fmt: skip
    return [point for point in points if _fits(grid, point.num_slots * token_bytes)]


def longest_sequence_tokens(grid: ProfileGridConfig) -> int:
    """The most tokens one sequence of ``grid`` holds when timed (its context or prompt)."""
    contexts = [*(max(spread_contexts(num_seqs, mean)) for mean in grid.decode_mean_contexts
                  for num_seqs in grid.decode_batches),
                max(spread_contexts(grid.mixed_decodes, grid.mixed_mean_context))]  # fmt: skip
    return max(*contexts, longest_prompt_tokens(grid))


def point_sequences(point: IterationPoint) -> tuple[list[Sequence], list[Sequence]]:
    """The decode and prefill sequences ``point`` runs, none of them cached: a decode sequence
    of context c holds c - 1 computed tokens and feeds its c-th."""
    decode = [_sequence(i, context - 1, 1) for i, context in enumerate(point.decode_contexts)]
    prefill = [_sequence(len(decode) + i, prompt, 0)
               for i, prompt in enumerate(point.prefill_prompts)]  # fmt: skip
    return decode, prefill


def point_shape(point: IterationPoint) -> IterationShape:
    """The shape ``measure.iteration_runs`` times for ``point`` (of ``point_sequences``)."""
    decode, prefill = point_sequences(point)
    return iteration_shape(prefill, len(decode), sum(seq.num_kv_tokens for seq in decode))


def _sequence(seq_id: int, prompt_tokens: int, num_generated: int) -> Sequence:
    request = Request(request_id=seq_id, arrival_s=0.0, prompt_tokens=prompt_tokens,
                      output_tokens=OUTPUT_TOKENS)  # fmt: skip
    record = RequestRecord(seq_id, 0.0, prompt_tokens, OUTPUT_TOKENS, OUTPUT_TOKENS)
    return Sequence(request=request, record=record, seq_id=seq_id, num_generated=num_generated)


def grid_shapes(grid: ProfileGridConfig, token_bytes: int) -> list[IterationShape]:
    """The shape of every iteration point of ``grid`` that ``iteration_grid`` keeps."""
    return [point_shape(point) for point in iteration_grid(grid, token_bytes)]


def longest_prompt_tokens(grid: ProfileGridConfig) -> int:
    """The longest prompt ``grid`` prefills in one piece (alone, beside decodes, or on waking)."""
    return max(*grid.prefill_prompts, *grid.mixed_prompts, WAKE_PROMPT_TOKENS)


def beyond_grid(prompt_tokens: SequenceOf[int], output_tokens: SequenceOf[int],
                grid: ProfileGridConfig) -> np.ndarray:  # fmt: skip
    """Per request (``prompt_tokens`` and ``output_tokens`` of each): whether it is longer than
    any sequence ``grid`` timed: a prompt past ``longest_prompt_tokens`` (its prefill's tokens and
    attention pairs past every timed prefill's) or a context past ``longest_sequence_tokens``
    (its decode steps read more K/V a sequence than any timed one). A profile of ``grid``
    prices such a request's steps by extrapolating its fitted terms. bool [num_requests]."""
    prompts = np.asarray(prompt_tokens, dtype=np.int64)  # [num_requests]
    contexts = prompts + np.asarray(output_tokens, dtype=np.int64)  # [num_requests]
    return (prompts > longest_prompt_tokens(grid)) | (contexts > longest_sequence_tokens(grid))


def range_bounds(shapes: SequenceOf[IterationShape]) -> dict[str, int]:
    """The largest value of each of ``RANGE_FEATURES`` over ``shapes`` (the steps a profile was
    fitted on: ``grid_shapes`` of its grid, or a served run's)."""
    return {name: max(getattr(shape, name) for shape in shapes) for name in RANGE_FEATURES}


def steps_beyond(columns: Mapping[str, SequenceOf[int] | np.ndarray],
                 bounds: Mapping[str, int]) -> np.ndarray:  # fmt: skip
    """Per step (``columns``: the step columns, or a chunk of them): whether it is above
    ``bounds`` (``range_bounds``) in any of ``RANGE_FEATURES``, so a profile of those bounds
    prices it by extrapolating its fitted terms. bool [num_steps]."""
    features = np.array([np.asarray(columns[name], dtype=np.int64)
                         for name in RANGE_FEATURES])  # [num_features, num_steps]
    limits = np.array([bounds[name] for name in RANGE_FEATURES], dtype=np.int64)
    return np.asarray((features > limits[:, None]).any(axis=0))  # [num_steps]


def _fits(grid: ProfileGridConfig, pool_bytes: int) -> bool:
    return grid.max_pool_gib is None or pool_bytes <= grid.max_pool_gib * GIB
