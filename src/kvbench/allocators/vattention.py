"""vAttention's allocator (Prabhu et al., ASPLOS'25): contiguous virtual spans, physical pages on
demand.

Each running request owns one of ``max_batch_size`` virtual spans of ``max_model_len`` tokens
(vAttention's ``reqId``s, reserved with ``cuMemAddressReserve`` at startup), so attention kernels
read a contiguous K/V tensor with no block table. Physical pages of a fixed size (64 KiB to 2 MiB)
are mapped into the span as the request grows, one per layer and per K/V tensor at a time, so a
"page group" (one page of every layer's K and V on every GPU) holds ``tokens_per_page`` token
slots: it is a block of that many slots, and the pool is counted in them like ``paged``'s blocks.

When a request finishes its span goes idle with its pages still mapped (deferred reclamation): the
next request given that span reuses them without mapping anything. Up to ``retain_pages`` page
groups per span are kept (None: all of them, as vAttention does); they are reclaimed on demand
when an allocation finds no free page (vAttention's ``reclaim_kvblocks_on_demand``), so they never
refuse an admission. In the usage breakdown they count as ``reservation``: memory mapped ahead of
tokens that have not been written yet, exactly what a reservation is, only for a future request
of the span rather than the current one (docs/metrics.md).

Forks copy (no block tables to share): a fork takes a span and pages of its own.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, replace

from kvbench.allocators.base import MemoryUsage
from kvbench.allocators.paged import PagedAllocator
from kvbench.core.request import Request

KIB = 1024
# The page sizes vAttention supports: 2 MiB with the stock CUDA driver (cuMemCreate's smallest
# granularity), 64/128/256 KiB with its modified open-source UVM driver.
PAGE_BYTES_CHOICES = (64 * KIB, 128 * KIB, 256 * KIB, 2048 * KIB)
# Allocator names that fix the page size (``vattention`` alone takes ``allocator.page_bytes``), so
# one run can compare page sizes: vattention_64k, vattention_128k, vattention_256k, vattention_2m.
PAGE_SUFFIXES = {"64k": 64 * KIB, "128k": 128 * KIB, "256k": 256 * KIB, "2m": 2048 * KIB}
VATTENTION_PAGE_NAMES = tuple(f"vattention_{suffix}" for suffix in PAGE_SUFFIXES)


def page_bytes_of(name: str, default_page_bytes: int) -> int | None:
    """The page size the allocator called ``name`` uses: its suffix's, ``default_page_bytes``
    for plain ``vattention``, None for an allocator that is not vAttention."""
    if name == "vattention":
        return default_page_bytes
    prefix, _, suffix = name.partition("_")
    if prefix == "vattention" and suffix in PAGE_SUFFIXES:
        return PAGE_SUFFIXES[suffix]
    return None


@dataclass(frozen=True)
class VAttentionSettings:
    """What a ``vattention`` allocator needs beyond the pool.

    Attributes:
        tokens_per_page: token slots of one page group
            (``Deployment.tokens_per_page(page_bytes)``).
        max_batch_size: virtual spans (requests that can run at once); None: unbounded.
        retain_pages: page groups an idle span keeps mapped for its next request; None: all.
    """

    tokens_per_page: int
    max_batch_size: int | None = None
    retain_pages: int | None = None


class VAttentionAllocator(PagedAllocator):
    """One virtual span per running request over a pool of ``num_slots // tokens_per_page`` page
    groups, mapped on demand (``block_size`` is ``tokens_per_page``; the block table lists the page
    groups mapped under the span, in order)."""

    forks_share_blocks = False  # each span is its own contiguous tensor: a fork copies

    def __init__(
        self,
        num_slots: int,
        max_model_len: int,
        settings: VAttentionSettings,
    ) -> None:
        if settings.tokens_per_page < 1:
            raise ValueError(f"tokens_per_page={settings.tokens_per_page}: must be >= 1")
        for key in ("max_batch_size", "retain_pages"):
            value = getattr(settings, key)
            if value is not None and value < (1 if key == "max_batch_size" else 0):
                raise ValueError(f"{key}={value}: out of range")
        super().__init__(num_slots, settings.tokens_per_page, max_model_len)
        self.name = "vattention"
        self.settings = settings
        # Page groups each idle span keeps mapped, ascending. Idle pages are free pool blocks
        # counted apart: which physical ids they are does not matter, and counting by span sizes
        # alone makes the state independent of the order the engine frees a step's finishes in.
        self._idle_span_pages: list[int] = []
        self._num_retained = 0  # their sum
        self.num_pages_mapped = 0  # page groups mapped so far (each 2 x layers x GPUs pages)

    @property
    def num_retained_pages(self) -> int:
        """Page groups idle spans keep mapped (deferred reclamation)."""
        return self._num_retained

    @property
    def pages_per_span(self) -> int:
        """Page groups one virtual span covers: ``ceil(max_model_len / tokens_per_page)``."""
        return -(-self.max_model_len // self.block_size)

    def virtual_slots(self, max_batch_size: int) -> int:
        """Token slots of virtual address space ``max_batch_size`` spans reserve (whole pages)."""
        return max_batch_size * self.pages_per_span * self.block_size

    def can_admit(self, request: Request, num_tokens: int) -> bool:
        """Whether a span is free and the pool holds the request's pages (an idle span's own
        pages and those the reclaimer can take back included)."""
        return self._has_free_span() and super().can_admit(request, num_tokens)

    def admit(self, seq_id: int, request: Request, num_tokens: int) -> bool:
        """Give the request a span, the idle one with most pages mapped (reusing them), and map
        the rest of its ``ceil(num_tokens / tokens_per_page)`` page groups. False if no span or
        no room: the request waits."""
        if not self.can_admit(request, num_tokens):
            return False
        num_reused = 0
        if self._idle_span_pages:
            span_pages = self._idle_span_pages.pop()
            self._num_retained -= span_pages
            num_reused = min(span_pages, self._blocks_for(num_tokens))
            # Pages beyond the request's need are unmapped (vAttention leaves them for it to grow
            # into: kvbench holds less, never more).
        if not super().admit(seq_id, request, num_tokens):  # can_admit said it fits
            raise RuntimeError(f"sequence {seq_id}: admission failed after can_admit allowed it")
        self.num_pages_mapped -= num_reused  # taken over mapped, not mapped anew
        return True

    def fork(self, parent_id: int, child_id: int) -> bool:
        """Give ``child_id`` a span of its own with a copy of the parent's pages (one (src, dst)
        page-group pair each in ``take_copy_on_writes``). False if no span or no room."""
        parent = self._sequences[parent_id]
        self._check_not_in_cohort(parent)
        if not self.admit(child_id, parent.request, parent.num_tokens):
            return False
        child = self._sequences[child_id]
        self._copies.extend(zip(parent.blocks, child.blocks, strict=True))
        return True

    def free(self, seq_id: int) -> None:
        """Release the request's span; up to ``retain_pages`` of its page groups stay mapped for
        the span's next request (reclaimable), the rest are unmapped."""
        num_blocks = len(self._sequences[seq_id].blocks)
        retain = self.settings.retain_pages
        num_kept = num_blocks if retain is None else min(num_blocks, retain)
        super().free(seq_id)
        if num_kept:
            insort(self._idle_span_pages, num_kept)
            self._num_retained += num_kept

    def usage(self) -> MemoryUsage:
        """``paged``'s breakdown of the pages mapped under running spans, with the idle spans'
        pages moved from free to reservation (mapped, holding no token yet)."""
        usage = super().usage()
        retained_slots = self._num_retained * self.block_size
        return replace(
            usage,
            reservation=usage.reservation + retained_slots,
            free=usage.free - retained_slots,
        )

    def num_free_blocks(self) -> int:
        """Free page groups no idle span holds (what a cohort round may take without a reclaim:
        the fast path leaves reclaiming to single appends, whose usage is recounted)."""
        return self._pool.num_free_blocks - self._num_retained

    def _has_free_span(self) -> bool:
        max_batch_size = self.settings.max_batch_size
        return max_batch_size is None or len(self._sequences) < max_batch_size

    def _allocate_blocks(self, num_blocks: int) -> list[int]:
        """Map ``num_blocks`` page groups from the free pool, reclaiming idle spans' pages (the
        smallest span first) when the unmapped free ones run short."""
        num_short = num_blocks - (self._pool.num_free_blocks - self._num_retained)
        if num_short > 0:
            self._reclaim(num_short)
        self.num_pages_mapped += num_blocks
        return self._pool.allocate_many(num_blocks)

    def _reclaim(self, num_pages: int) -> None:
        """Unmap ``num_pages`` page groups of idle spans, emptying the smallest spans first."""
        spans = self._idle_span_pages
        self._num_retained -= num_pages
        while num_pages:
            taken = min(spans[0], num_pages)
            num_pages -= taken
            if taken == spans[0]:
                spans.pop(0)
            else:
                spans[0] -= taken
