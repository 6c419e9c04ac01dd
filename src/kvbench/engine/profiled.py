"""Iteration latency from a cost model fitted to times measured on a device (``task=profile``).

Where the roofline derives an iteration's time from peak figures, this model prices it with
coefficients fitted to iterations timed on the device and model at hand, one per term, each
pricing one thing an iteration does (``PROFILE_TERMS``; docs/sim_to_real.md):

    time_s = fixed_s                                   # per iteration: launch, framework, weights
           + per_seq_s            x sequences          # per sequence: its inputs, sampling, tables
           + per_token_s          x new tokens         # dense layers, per token computed
           + per_prefill_pair_s   x prefill pairs      # prefill attention, per causal pair
           + per_context_token_s  x decode context     # decode attention, per KV token read
           + per_context_block_s  x decode context / block_size   # per block-table entry walked
           + per_mean_context_s   x decode context / decode seqs  # the kernel's walk over tiles
    swap_s = swap_per_token_s x tokens + swap_per_block_s x tokens / block_size

The block size is the kernel's: the allocator's for the paged ones, 1 for the contiguous ones
(their tables list slots). Pure: the coefficients are given (the profile file is read at the edge,
``kvbench.tasks.profile``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvbench.engine.cost_model import DecodeTimeFn, IterationShape

# The iteration terms, in the order of a profile's coefficients.
PROFILE_TERMS = (
    "fixed_s",
    "per_seq_s",
    "per_token_s",
    "per_prefill_pair_s",
    "per_context_token_s",
    "per_context_block_s",
    "per_mean_context_s",
)
SWAP_TERMS = ("swap_per_token_s", "swap_per_block_s")


def iteration_features(shape: IterationShape, block_size: int) -> tuple[float, ...]:
    """What each of ``PROFILE_TERMS`` multiplies in an iteration of ``shape`` (its first is 1):
    the one place the model's features are defined, for the fit and the prediction alike."""
    num_seqs = shape.num_decode_tokens + shape.num_prefill_seqs
    context = shape.decode_context_tokens
    mean_context = context / shape.num_decode_tokens if shape.num_decode_tokens else 0.0
    return (
        1.0,
        float(num_seqs),
        float(shape.num_prefill_tokens + shape.num_decode_tokens),
        float(shape.prefill_attention_pairs),
        float(context),
        context / block_size,
        mean_context,
    )


def swap_features(num_tokens: int, block_size: int) -> tuple[float, float]:
    """What each of ``SWAP_TERMS`` multiplies in a swap of ``num_tokens`` tokens."""
    return float(num_tokens), num_tokens / block_size


@dataclass(frozen=True)
class ProfiledCostModel:
    """Prices iterations and swaps with fitted coefficients (a ``CostModel``).

    Args:
        coefficients: seconds per unit of every term of ``PROFILE_TERMS`` and ``SWAP_TERMS``.
        block_size: the attention kernel's block size for this run's allocator.
    """

    coefficients: Mapping[str, float]
    block_size: int

    def __post_init__(self) -> None:
        missing = [t for t in (*PROFILE_TERMS, *SWAP_TERMS) if t not in self.coefficients]
        if missing:
            raise ValueError(f"profile coefficients miss {', '.join(missing)}")
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size}: must be >= 1")

    def iteration_time_s(self, shape: IterationShape) -> float:
        """Seconds one iteration of this shape takes (0.0 for an empty one)."""
        if shape.num_prefill_tokens + shape.num_decode_tokens == 0:
            return 0.0
        features = iteration_features(shape, self.block_size)
        return sum(self.coefficients[t] * f for t, f in zip(PROFILE_TERMS, features, strict=True))

    def swap_time_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens of KV to swap space or back (one direction)."""
        features = swap_features(num_tokens, self.block_size)
        return sum(self.coefficients[t] * f for t, f in zip(SWAP_TERMS, features, strict=True))

    def decode_time_fn(self, num_decode_tokens: int) -> DecodeTimeFn:
        """``iteration_time_s`` of decode-only iterations of ``num_decode_tokens`` sequences,
        as a function of their summed context (the same float operations)."""

        def decode_time_s(decode_context_tokens: int) -> float:
            shape = IterationShape(0, 0, num_decode_tokens, decode_context_tokens)
            return self.iteration_time_s(shape)

        return decode_time_s
