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
           + per_mixed_step_s     x (1 if it prefills and decodes)  # both attention paths
           + stair_K_tokens_s     x (1 if it computes >= K tokens), K = 2, 3, ..., 8, 16
           + per_token_past_K_s   x max(0, tokens - K), K = 64, 256, 1024  # compute-bound rows
    swap_s = swap_per_token_s x tokens + swap_per_block_s x tokens / block_size
    wake_time_s = wake_per_sqrt_idle_s x sqrt(idle seconds)  # the first iteration after a wait
                + wake_per_idle_s      x idle seconds

The wake terms price a device gone cold while the engine waited for a request (on a CPU, the
model's memory leaving the caches). The cost rises fast over the first fraction of a second and
slowly after (measured on this project's CPU on two days: +1 ms after 0.05 s, +3-7 ms after
0.1 s, +10-27 ms after 0.25-0.5 s, +17-52 ms after 1-4 s), and is 0 at no wait: a square root
and a line through the origin follow that, where a constant and a line overprice short waits.
``per_mixed_step_s`` prices a step that runs the decode kernel and the prefill attention side by
side (each layer launches both). The stairs price the matmul library's choice of kernel by the
number of rows (the step's tokens), which follows no line and need not even rise: on this
project's Intel Xeon, MKL ran SmolLM2's linear layers in the same 20 ms for 1-3 rows and in 30 ms
from 4; on its AMD EPYC (2026-12-06) in 34, 53, 65, 51, 47, 46, 56 and 47 ms for 1-8 rows, and
a decode step of ``experiment=sim_to_real`` took 44, 72, 87-90, 66-68 and 65 ms for 1-5
sequences; on 2026-12-07 the linears took 1.3-1.5x their neighbours' time on 7 and on 11 rows
(``docs/sim_to_real_measured.md``). So every count of 2-16 tokens has a stair (the level from
that count on against the count below): a level per count to 15, the line from 16 on. Each is
fitted with either sign; a stair whose band of counts no fitted point computes is not fitted (0:
its counts cost what the count below does; ``tasks.profile.fit``).
The hinges bend the per-token line up past ``HINGE_TOKENS`` tokens: the dense layers cost
little per token while reading the weights bounds them and a full token's FLOPs once compute
does (a GPU's roofline knee, some hundreds of rows for a 7-8B model; on an AMD EPYC, MKL's 211
linears of SmolLM2 took 93 ms on 16 rows and 284 on 64); each slope is non-negative, so the
line only steepens, as a roofline does.
These came after the first profiles were written: a profile without them prices them 0
(``OPTIONAL_TERMS``); one with a term this model does not have (an earlier wake form's
``wake_s``) is refused, not priced in part.

The block size is the kernel's: the allocator's for the paged ones, 1 for the contiguous ones
(their tables list slots). Pure: the coefficients are given (the profile file is read at the edge,
``kvbench.tasks.profile``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvbench.engine.cost_model import DecodeTimeFn, IterationShape

# Tokens a step computes from which a stair term prices it (the rows of its matmuls); a stair
# is signed: the level may fall from one count to the next.
STAIR_TOKENS = tuple(range(2, 17))
STAIR_TERMS = tuple(f"stair_{tokens}_tokens_s" for tokens in STAIR_TOKENS)
# Tokens a step computes past which a hinge term adds to the per-token slope.
HINGE_TOKENS = (64, 256, 1024)
HINGE_TERMS = tuple(f"per_token_past_{tokens}_s" for tokens in HINGE_TOKENS)
# The iteration terms, in the order of a profile's coefficients.
PROFILE_TERMS = (
    "fixed_s",
    "per_seq_s",
    "per_token_s",
    "per_prefill_pair_s",
    "per_context_token_s",
    "per_context_block_s",
    "per_mean_context_s",
    "per_mixed_step_s",
    *STAIR_TERMS,
    *HINGE_TERMS,
)
SWAP_TERMS = ("swap_per_token_s", "swap_per_block_s")
WAKE_TERMS = ("wake_per_sqrt_idle_s", "wake_per_idle_s")
# Terms a profile may lack (written before they were priced): 0.
OPTIONAL_TERMS = ("per_mixed_step_s", *STAIR_TERMS, *HINGE_TERMS, *WAKE_TERMS)


def signed_terms(terms: Sequence[str]) -> list[bool]:
    """Per term of ``terms``: whether a fit may price it below 0 (the stairs)."""
    return [term in STAIR_TERMS for term in terms]


def missing_terms(coefficients: Mapping[str, float]) -> list[str]:
    """The terms a profile must price that ``coefficients`` lacks."""
    return [t for t in (*PROFILE_TERMS, *SWAP_TERMS)
            if t not in coefficients and t not in OPTIONAL_TERMS]  # fmt: skip


def unknown_terms(coefficients: Mapping[str, float]) -> list[str]:
    """The coefficients of ``coefficients`` that price no term of this model (a profile of
    another kvbench version's terms, whose costs would be silently dropped)."""
    known = {*PROFILE_TERMS, *SWAP_TERMS, *WAKE_TERMS}
    return [name for name in coefficients if name not in known]


def iteration_features(shape: IterationShape, block_size: int) -> tuple[float, ...]:
    """What each of ``PROFILE_TERMS`` multiplies in an iteration of ``shape`` (its first is 1):
    the one place the model's features are defined, for the fit and the prediction alike."""
    num_seqs = shape.num_decode_tokens + shape.num_prefill_seqs
    num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
    context = shape.decode_context_tokens
    mean_context = context / shape.num_decode_tokens if shape.num_decode_tokens else 0.0
    return (
        1.0,
        float(num_seqs),
        float(num_tokens),
        float(shape.prefill_attention_pairs),
        float(context),
        context / block_size,
        mean_context,
        1.0 if shape.num_prefill_tokens and shape.num_decode_tokens else 0.0,
        *(1.0 if num_tokens >= stair else 0.0 for stair in STAIR_TOKENS),
        *(float(max(0, num_tokens - knee)) for knee in HINGE_TOKENS),
    )


def wake_features(idle_s: float) -> tuple[float, float]:
    """What each of ``WAKE_TERMS`` multiplies in the iteration after an idle wait of ``idle_s``
    seconds (0, 0 without a wait)."""
    return (math.sqrt(idle_s), idle_s) if idle_s > 0 else (0.0, 0.0)


def swap_features(num_tokens: int, block_size: int) -> tuple[float, float]:
    """What each of ``SWAP_TERMS`` multiplies in a swap of ``num_tokens`` tokens."""
    return float(num_tokens), num_tokens / block_size


@dataclass(frozen=True)
class ProfiledCostModel:
    """Prices iterations and swaps with fitted coefficients (a ``CostModel``).

    Args:
        coefficients: seconds per unit of every term of ``PROFILE_TERMS`` and ``SWAP_TERMS``,
            and of ``WAKE_TERMS`` where measured (a missing one is 0).
        block_size: the attention kernel's block size for this run's allocator.
    """

    coefficients: Mapping[str, float]
    block_size: int
    # Each term group's coefficients in its terms' order (a missing optional one 0), read once:
    # the engine prices every iteration through them.
    _iteration_s: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _wake_s: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        missing = missing_terms(self.coefficients)
        if missing:
            raise ValueError(f"profile coefficients miss {', '.join(missing)}")
        unknown = unknown_terms(self.coefficients)
        if unknown:
            raise ValueError(f"profile coefficients {', '.join(unknown)} price no term of this "
                             "model")  # fmt: skip
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size}: must be >= 1")
        for name, terms in (("_iteration_s", PROFILE_TERMS), ("_wake_s", WAKE_TERMS)):
            object.__setattr__(self, name, tuple(self.coefficients.get(t, 0.0) for t in terms))

    def iteration_time_s(self, shape: IterationShape) -> float:
        """Seconds one iteration of this shape takes (0.0 for an empty one)."""
        if shape.num_prefill_tokens + shape.num_decode_tokens == 0:
            return 0.0
        features = iteration_features(shape, self.block_size)
        return sum(c * f for c, f in zip(self._iteration_s, features, strict=True))

    def swap_time_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens of KV to swap space or back (one direction)."""
        features = swap_features(num_tokens, self.block_size)
        return sum(self.coefficients[t] * f for t, f in zip(SWAP_TERMS, features, strict=True))

    def wake_time_s(self, idle_s: float) -> float:
        """Seconds the first iteration after an idle wait of ``idle_s`` seconds takes beyond its
        shape's price (0.0 without a wait or without wake terms)."""
        return sum(c * f for c, f in zip(self._wake_s, wake_features(idle_s), strict=True))

    def decode_time_fn(self, num_decode_tokens: int) -> DecodeTimeFn:
        """``iteration_time_s`` of decode-only iterations of ``num_decode_tokens`` sequences,
        as a function of their summed context (the same float operations)."""

        def decode_time_s(decode_context_tokens: int) -> float:
            shape = IterationShape(0, 0, num_decode_tokens, decode_context_tokens)
            return self.iteration_time_s(shape)

        return decode_time_s
