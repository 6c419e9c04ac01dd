"""The shape of an iteration (what the cost model prices) from the sequences it runs."""

from __future__ import annotations

from collections.abc import Iterable

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.sequence import Sequence


def iteration_shape(
    prefill: Iterable[Sequence], num_decode_tokens: int, decode_context_tokens: int
) -> IterationShape:
    """The shape of an iteration that prefills ``prefill`` and decodes ``num_decode_tokens``
    sequences holding ``decode_context_tokens`` tokens in all."""
    num_prefill_tokens = 0
    prefill_attention_pairs = 0
    for seq in prefill:
        length = seq.num_kv_tokens
        cached = seq.num_cached_tokens
        num_prefill_tokens += length - cached
        # Causal attention: token i sees i tokens; cached tokens are not recomputed.
        prefill_attention_pairs += length * (length + 1) // 2 - cached * (cached + 1) // 2
    return IterationShape(
        num_prefill_tokens=num_prefill_tokens,
        prefill_attention_pairs=prefill_attention_pairs,
        num_decode_tokens=num_decode_tokens,
        decode_context_tokens=decode_context_tokens,
    )
