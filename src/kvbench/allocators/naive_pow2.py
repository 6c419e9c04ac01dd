"""Orca (Pow2): the output length is over-guessed by at most 2x."""

from __future__ import annotations

from kvbench.allocators.buddy import next_power_of_two
from kvbench.allocators.contiguous import ContiguousAllocator
from kvbench.core.request import Request


def output_guess_tokens(output_tokens: int) -> int:
    """The output length Orca (Pow2) reserves: the next power of two (25 -> 32, 0 -> 0)."""
    return next_power_of_two(output_tokens) if output_tokens > 0 else 0


class NaivePow2Allocator(ContiguousAllocator):
    """Reserves prompt + ``output_guess_tokens(output)`` slots, capped at ``max_model_len``."""

    name = "naive_pow2"

    def _requested_slots(self, request: Request) -> int:
        guess_tokens = request.prompt_tokens + output_guess_tokens(request.output_tokens)
        return min(guess_tokens, self.max_model_len)
