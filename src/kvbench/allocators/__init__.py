"""KV-cache allocators: the naive contiguous baselines (Orca) and the paged ones (vLLM).

``base`` holds the contract (the ``Allocator`` protocol, the optional abilities an allocator
declares, ``MemoryUsage``); ``contiguous`` the Orca baselines over a ``buddy`` arena; ``paged``
the block tables over a ``block_pool``, advanced lazily by a ``cohort``, and optionally given a
``prefix_cache`` (keyed by ``prefix_hashes``); ``radix`` SGLang's radix tree of prefixes;
``vattention`` the virtual spans of vAttention, paged underneath in page groups.

``make_allocator(name, ...)`` builds one by its registry name; ``ALLOCATOR_NAMES`` lists them in
the order reports show them. ``paged_prefix`` is the ``paged`` allocator with a prefix cache,
``paged_hybrid_prefix`` the ``paged_hybrid`` one with a ``hybrid_prefix`` cache.
A new allocator satisfies ``Allocator``, declares its abilities, and gets a registry entry here.
"""

from __future__ import annotations

from collections.abc import Callable

from kvbench.allocators.base import (
    Allocator,
    CohortAllocator,
    CopyOnWriteCounter,
    MemoryUsage,
    RoundsAllocator,
)
from kvbench.allocators.contiguous import (
    NaiveMaxAllocator,
    NaiveOracleAllocator,
    NaivePow2Allocator,
)
from kvbench.allocators.paged import PagedAllocator
from kvbench.allocators.paged_hybrid import PagedHybridAllocator
from kvbench.allocators.prefix_cache import PrefixCache
from kvbench.allocators.radix import RadixAllocator
from kvbench.allocators.vattention import (
    VATTENTION_PAGE_NAMES,
    VAttentionAllocator,
    VAttentionSettings,
)
from kvbench.core.kv_capacity import HybridPool

# name -> factory(num_slots, block_size, max_model_len); contiguous allocators ignore block_size.
_FACTORIES: dict[str, Callable[[int, int, int], Allocator]] = {
    NaiveMaxAllocator.name: lambda slots, _, max_len: NaiveMaxAllocator(slots, max_len),
    NaivePow2Allocator.name: lambda slots, _, max_len: NaivePow2Allocator(slots, max_len),
    NaiveOracleAllocator.name: lambda slots, _, max_len: NaiveOracleAllocator(slots, max_len),
    "paged": PagedAllocator,
    # vLLM's automatic prefix caching: the paged allocator given a prefix cache.
    "paged_prefix": lambda slots, block_size, max_len: PagedAllocator(
        slots, block_size, max_len, enable_prefix_caching=True
    ),
    # SGLang's RadixAttention cache (its page size is radix_page_tokens, not block_size).
    RadixAllocator.name: lambda slots, _, max_len: RadixAllocator(slots, max_len),
    # vLLM v1's hybrid KV-cache manager; without a model's groups (make_allocator's hybrid_pool)
    # one group of full attention.
    PagedHybridAllocator.name: PagedHybridAllocator,
    # ... with prefix caching, a hit only where every group hits (vLLM's hybrid coordinator).
    "paged_hybrid_prefix": lambda slots, block_size, max_len: PagedHybridAllocator(
        slots, block_size, max_len, enable_prefix_caching=True
    ),
    # vAttention: virtual spans with pages mapped on demand. By default a page holds block_size
    # tokens, spans are unbounded and a finished request's pages are unmapped at once (the
    # registry-wide tests recount it as paged); make_allocator's `vattention` settings give the
    # run's pages, spans and deferred reclamation.
    "vattention": lambda slots, block_size, max_len: VAttentionAllocator(
        slots, max_len, VAttentionSettings(tokens_per_page=block_size, retain_pages=0)
    ),
}

ALLOCATOR_NAMES: tuple[str, ...] = tuple(_FACTORIES)
_HYBRID_NAMES = (PagedHybridAllocator.name, "paged_hybrid_prefix")  # given a model's groups
# Names a run may also list: vattention with its page size fixed (vattention_64k, ..., _2m).
ALLOCATOR_VARIANTS: tuple[str, ...] = VATTENTION_PAGE_NAMES


def make_allocator(
    name: str,
    num_slots: int,
    block_size: int,
    max_model_len: int,
    *,
    radix_page_tokens: int = 1,
    cpu_cache_slots: int = 0,
    hybrid_pool: HybridPool | None = None,
    generated_slot_ahead: bool = False,
    vattention: VAttentionSettings | None = None,
) -> Allocator:
    """A fresh allocator of kind ``name`` over ``num_slots`` token slots.

    ``block_size`` (tokens per block) applies to the paged allocators; the contiguous ones always
    use 1; ``radix`` uses ``radix_page_tokens``. ``cpu_cache_slots`` > 0 gives the
    prefix-caching allocators (``paged_prefix``, ``radix``) a CPU tier of that many token slots
    (whole blocks or pages); the others have no cache to offload. ``hybrid_pool``
    (``core.kv_capacity.hybrid_pool``) gives ``paged_hybrid`` and ``paged_hybrid_prefix`` the
    model's KV-cache groups and vLLM's block count, and its slots replace ``num_slots``; the
    other allocators ignore it, and ``generated_slot_ahead`` (``PagedHybridAllocator``: True
    under kvbench's vLLM-v0 engine, whose sequences hold a slot for the token their last step
    sampled).
    ``vattention`` sets the ``vattention`` allocator's pages and spans (ignored by the others).
    ValueError names the allowed names when ``name`` is unknown.
    """
    if name.startswith("vattention") and vattention is not None:
        return VAttentionAllocator(num_slots, max_model_len, vattention)
    if name in ALLOCATOR_VARIANTS:
        name = "vattention"  # without settings, pages of block_size tokens like plain vattention
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown allocator {name!r}; allowed: {', '.join(ALLOCATOR_NAMES)}")
    if name == RadixAllocator.name:
        return RadixAllocator(num_slots, max_model_len, page_tokens=radix_page_tokens,
                              cpu_cache_pages=cpu_cache_slots // radix_page_tokens)  # fmt: skip
    if name == "paged_prefix" and cpu_cache_slots:
        return PagedAllocator(num_slots, block_size, max_model_len, enable_prefix_caching=True,
                              cpu_cache_blocks=cpu_cache_slots // block_size)  # fmt: skip
    if name in _HYBRID_NAMES and hybrid_pool is not None:
        return PagedHybridAllocator(
            hybrid_pool.num_slots, block_size, max_model_len,
            layout=hybrid_pool.layout, num_blocks=hybrid_pool.num_blocks,
            enable_prefix_caching=name == "paged_hybrid_prefix",
            generated_slot_ahead=generated_slot_ahead,
        )  # fmt: skip
    return factory(num_slots, block_size, max_model_len)


__all__ = [
    "ALLOCATOR_NAMES",
    "ALLOCATOR_VARIANTS",
    "Allocator",
    "CohortAllocator",
    "CopyOnWriteCounter",
    "MemoryUsage",
    "NaiveMaxAllocator",
    "NaiveOracleAllocator",
    "NaivePow2Allocator",
    "PagedAllocator",
    "PagedHybridAllocator",
    "PrefixCache",
    "RadixAllocator",
    "RoundsAllocator",
    "VAttentionAllocator",
    "VAttentionSettings",
    "make_allocator",
]
