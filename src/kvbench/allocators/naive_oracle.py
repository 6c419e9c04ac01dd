"""Orca (Oracle): the true output length is known in advance."""

from __future__ import annotations

from kvbench.allocators.contiguous import ContiguousAllocator
from kvbench.core.request import Request


class NaiveOracleAllocator(ContiguousAllocator):
    """Reserves exactly prompt + true output slots (capped at ``max_model_len``); the buddy's
    power-of-two rounding is its only waste."""

    name = "naive_oracle"

    def _requested_slots(self, request: Request) -> int:
        return min(request.total_tokens, self.max_model_len)
