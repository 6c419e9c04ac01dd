"""Orca (Max): every request reserves the model's maximum length."""

from __future__ import annotations

from kvbench.allocators.contiguous import ContiguousAllocator
from kvbench.core.request import Request


class NaiveMaxAllocator(ContiguousAllocator):
    """Reserves ``max_model_len`` contiguous slots per request, whatever its true length."""

    name = "naive_max"

    def _requested_slots(self, request: Request) -> int:
        return self.max_model_len

    def _smallest_request_slots(self) -> int:
        # Every request asks for max_model_len, so smaller top-level blocks are never usable.
        return self.max_model_len
