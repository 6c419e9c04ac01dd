"""KV-cache allocators: the naive contiguous baselines (Orca) and the paged ones (vLLM).

``make_allocator(name, ...)`` builds one by its registry name; ``ALLOCATOR_NAMES`` lists them in
the order reports show them.
"""

from __future__ import annotations

from collections.abc import Callable

from kvbench.allocators.base import Allocator, CohortAllocator, MemoryUsage
from kvbench.allocators.naive_max import NaiveMaxAllocator
from kvbench.allocators.naive_oracle import NaiveOracleAllocator
from kvbench.allocators.naive_pow2 import NaivePow2Allocator
from kvbench.allocators.paged import PagedAllocator
from kvbench.allocators.paged_prefix import PagedPrefixAllocator

# name -> factory(num_slots, block_size, max_model_len); contiguous allocators ignore block_size.
_FACTORIES: dict[str, Callable[[int, int, int], Allocator]] = {
    NaiveMaxAllocator.name: lambda slots, _, max_len: NaiveMaxAllocator(slots, max_len),
    NaivePow2Allocator.name: lambda slots, _, max_len: NaivePow2Allocator(slots, max_len),
    NaiveOracleAllocator.name: lambda slots, _, max_len: NaiveOracleAllocator(slots, max_len),
    PagedAllocator.name: PagedAllocator,
    PagedPrefixAllocator.name: PagedPrefixAllocator,
}

ALLOCATOR_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def make_allocator(name: str, num_slots: int, block_size: int, max_model_len: int) -> Allocator:
    """A fresh allocator of kind ``name`` over ``num_slots`` token slots.

    ``block_size`` (tokens per block) applies to the paged allocators; the contiguous ones always
    use 1. ValueError names the allowed names when ``name`` is unknown.
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown allocator {name!r}; allowed: {', '.join(ALLOCATOR_NAMES)}")
    return factory(num_slots, block_size, max_model_len)


__all__ = [
    "ALLOCATOR_NAMES",
    "Allocator",
    "CohortAllocator",
    "MemoryUsage",
    "NaiveMaxAllocator",
    "NaiveOracleAllocator",
    "NaivePow2Allocator",
    "PagedAllocator",
    "PagedPrefixAllocator",
    "make_allocator",
]
