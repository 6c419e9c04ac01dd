"""What the engine asks of a cost model: the time of an iteration of a given shape, and of a swap.

``IterationShape`` is what an iteration computes, in tokens (``iteration_shape`` builds it from the
sequences it runs); ``CostModel`` is the protocol every cost model implements (the roofline of
``kvbench.engine.roofline``, and later ones fitted to measured times). The engine knows no more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from kvbench.engine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class IterationShape:
    """What one iteration computes, in tokens.

    Attributes:
        num_prefill_tokens: prompt tokens processed (including recomputed ones).
        prefill_attention_pairs: sum over prefill tokens of the context each attends to.
        num_decode_tokens: sequences decoding one token each.
        decode_context_tokens: sum of the decode sequences' context lengths (KV read).
        decode_context_lens: per decode sequence context length, only when a measured attention
            hook needs it (else empty).
        num_prefill_seqs: sequences prefilled (a profiled model prices each sequence).
        prefill_spans: per prefilled sequence, (its KV tokens, those found cached): what a
            sliding-window layer's attention needs to count its pairs exactly (the roofline's
            window term); empty where the shape was built from sums only.
    """

    num_prefill_tokens: int
    prefill_attention_pairs: int
    num_decode_tokens: int
    decode_context_tokens: int
    decode_context_lens: tuple[int, ...] = ()
    num_prefill_seqs: int = 0
    # A detail behind the sums above, not part of what a shape is: shapes equal by their sums
    # compare (and hash) equal, as the profile's grid points expect.
    prefill_spans: tuple[tuple[int, int], ...] = field(default=(), compare=False)


# Seconds of a decode-only iteration as a function of its sequences' summed context (tokens).
DecodeTimeFn = Callable[[int], float]


class CostModel(Protocol):
    """Prices iterations and swaps; ``simulate`` and its fast path take any implementation."""

    def iteration_time_s(self, shape: IterationShape) -> float:
        """Seconds one iteration of this shape takes (0.0 for an empty one)."""
        ...

    def swap_time_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens of KV between GPU and CPU (one direction)."""
        ...

    def wake_time_s(self, idle_s: float) -> float:
        """Seconds the first iteration after an idle wait of ``idle_s`` seconds (nothing to run
        until a request arrived) takes beyond its shape's price: a device whose caches, memory
        or clocks went cold while it waited (0.0 for a model that does not price it)."""
        ...

    def decode_time_fn(self, num_decode_tokens: int) -> DecodeTimeFn:
        """``iteration_time_s`` of decode-only iterations of ``num_decode_tokens`` sequences, as
        a function of their summed context, giving identical floats. The engine's fast path calls
        it once per iteration, so a model hoists what does not depend on the context; one with
        nothing to hoist returns ``decode_time_by_shape(self, num_decode_tokens)``."""
        ...


def decode_time_by_shape(cost_model: CostModel, num_decode_tokens: int) -> DecodeTimeFn:
    """``CostModel.decode_time_fn`` through ``iteration_time_s`` of the decode-only shape."""

    def decode_time_s(decode_context_tokens: int) -> float:
        shape = IterationShape(0, 0, num_decode_tokens, decode_context_tokens)
        return cost_model.iteration_time_s(shape)

    return decode_time_s


def iteration_shape(
    prefill: Iterable[Sequence], num_decode_tokens: int, decode_context_tokens: int
) -> IterationShape:
    """The shape of an iteration that prefills ``prefill`` and decodes ``num_decode_tokens``
    sequences holding ``decode_context_tokens`` tokens in all."""
    num_prefill_tokens = 0
    prefill_attention_pairs = 0
    num_prefill_seqs = 0
    prefill_spans = []
    for seq in prefill:
        num_prefill_seqs += 1
        length = seq.num_kv_tokens
        cached = seq.num_reused_tokens
        prefill_spans.append((length, cached))
        num_prefill_tokens += length - cached
        # Causal attention: token i sees i tokens; cached tokens are not recomputed.
        prefill_attention_pairs += length * (length + 1) // 2 - cached * (cached + 1) // 2
    return IterationShape(
        num_prefill_tokens=num_prefill_tokens,
        prefill_attention_pairs=prefill_attention_pairs,
        num_decode_tokens=num_decode_tokens,
        decode_context_tokens=decode_context_tokens,
        num_prefill_seqs=num_prefill_seqs,
        prefill_spans=tuple(prefill_spans),
    )
