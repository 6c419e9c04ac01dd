"""vLLM v1's scheduling policy, step by step, over vLLM's KV-cache manager (``engine.kv_cache_v1``).

``scheduler=vllm_v1`` (issue 15): a pure model of one ``schedule()`` of vLLM 0.32's
``vllm.v1.core.sched.scheduler.Scheduler`` and of the model runner's answer, refereed step for
step by the real scheduler (``kvbench.referee``, tests/test_scheduler_v1_referee.py), with prefix
caching (``paged_prefix``) or without (``paged``), and over vLLM's hybrid manager for a model with
sliding-window layers (``paged_hybrid``, ``paged_hybrid_prefix``: ``HybridV1Memory``).

One step, as vLLM does it:

1. Running requests first, in order: each gets ``min(tokens it has not computed, budget left)``
   (chunked prefill, or one decode token). While the allocator cannot grow it by that much, the
   last running request is preempted (its blocks freed, its computed tokens dropped, back at the
   front of the waiting queue: recompute); if that was the request itself, the loop stops.
2. Only if nothing was preempted: waiting requests, first come first served, while the budget
   lasts and fewer than ``max_num_seqs`` run. Each looks up its prefix-cache hit (whole blocks,
   at most its input less one token); it is admitted only if its whole input (prompt, plus the
   tokens it generated before a preemption) fits in the free blocks beside its hit, though it
   computes only what the budget leaves; the first that does not fit stops admission.
3. The model runner: a request whose input is fully computed after the step samples a token; one
   with ``output_tokens`` tokens finishes and frees its blocks.

With ``async_scheduling`` (vLLM's default on a GPU, its ``AsyncScheduler`` driven by the engine's
two-deep batch queue) step N is scheduled before step N-1's tokens are taken in: a request counts
the token in flight as a placeholder (it decodes on), is not scheduled once its last token is in
flight, and finishes, freeing its blocks and seat, when that token is taken in, at the end of the
next step. A request preempted with a token in flight still receives it (and finishes if it was
its last); prefix caching catches up on the blocks a taken-in token fills.

``max_num_batched_tokens`` is the token budget and ``max_num_seqs`` the batch limit; the pool is
the allocator's (``kvbench.core.kv_capacity.pool_slots``: vLLM's ``num_gpu_blocks`` less its null
block), managed as vLLM manages it (``V1KVCache``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, cast

from kvbench.allocators.base import Allocator, CohortAllocator, CohortRounds, MemoryUsage
from kvbench.allocators.hybrid_prefix import HybridHit
from kvbench.allocators.paged_hybrid import PagedHybridAllocator
from kvbench.core.request import Request
from kvbench.engine.cpu_tier_v1 import CopyClock, CopyDone, CpuOffloadTier
from kvbench.engine.decoders_v1 import LazyDecoders
from kvbench.engine.kv_cache_v1 import LOADED, LOADING, NOT_LOADING, V1KVCache, V1Sequence

_AllocatorT = TypeVar("_AllocatorT", Allocator, PagedHybridAllocator)


@dataclass(frozen=True)
class V1Limits:
    """The limits of one vLLM v1 engine (vLLM's names).

    Attributes:
        max_num_seqs: most requests running at once.
        max_num_batched_tokens: token budget of one step.
        max_model_len: longest prompt + output, in tokens.
        async_scheduling: schedule a step before the previous step's tokens are taken in
            (vLLM's default on a GPU; off on its CPU platform).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    async_scheduling: bool = False


@dataclass(frozen=True)
class V1Step:
    """What one step scheduled (the fields the referee's ``RefereeStep`` compares).

    Attributes:
        step_index: 0 for the first step.
        scheduled_tokens: (request id, tokens computed this step): running requests first, in
            order, then the ones admitted this step.
        num_blocks_in_use: blocks the allocator holds for requests after scheduling.
        preempted_request_ids: requests preempted in this step, sorted.
        finished_request_ids: requests whose last token was taken in (and memory freed) in this
            step, sorted: produced in this step, or in the step before under async scheduling.
        num_running: requests running after the step.
        num_waiting: requests waiting (new or preempted) after the step.
        prefix_query_tokens: input tokens looked up in the prefix cache by requests admitted for
            the first time in this step (0 without prefix caching).
        prefix_hit_tokens: of those, tokens found cached.
        resumed_query_tokens: tokens looked up by preempted requests resuming in this step.
        resumed_hit_tokens: of those, tokens found cached.
        cpu_hit_tokens: tokens requests admitted in this step load from the CPU tier.
        num_cpu_blocks: chunks (of ``blocks_per_chunk`` blocks) the CPU tier holds after the
            step's scheduling (0 without one).
        num_lazy_decodes: decode tokens of the first running requests, left out of
            ``scheduled_tokens`` (a lazy scheduler's; 0 otherwise).
    """

    step_index: int
    scheduled_tokens: tuple[tuple[int, int], ...]
    num_blocks_in_use: int
    preempted_request_ids: tuple[int, ...]
    finished_request_ids: tuple[int, ...]
    num_running: int
    num_waiting: int
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    resumed_query_tokens: int = 0
    resumed_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    num_cpu_blocks: int = 0
    num_lazy_decodes: int = 0


class V1Memory(Protocol):
    """What the v1 policy asks of the KV memory: ``V1KVCache`` (vLLM's own, ``paged`` and
    ``paged_prefix``), ``HybridV1Memory`` (its hybrid manager, ``paged_hybrid``) or
    ``ReservingV1Memory`` (the naive contiguous allocators)."""

    block_size: int
    enable_caching: bool

    @property
    def num_blocks_in_use(self) -> int:
        """Blocks (slots for a contiguous allocator) held by requests."""
        ...

    def find_hit(self, seq: V1Sequence) -> list[int]:
        """The cached blocks the sequence's input starts with (none without a prefix cache)."""
        ...

    def can_admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """Whether the sequence's whole input fits now, beside its hits, and its first
        ``num_new_tokens`` past them can be allocated (vLLM's ``allocate_slots`` checks both)."""
        ...

    def admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> None:
        """Give a waiting sequence its hits and room for ``num_new_tokens`` more tokens."""
        ...

    def can_grow(self, seq: V1Sequence, num_new_tokens: int) -> bool:
        """Whether a running sequence can take ``num_new_tokens`` more tokens now."""
        ...

    def grow(self, seq: V1Sequence, num_new_tokens: int) -> None:
        """Make room for ``num_new_tokens`` more tokens of a running sequence."""
        ...

    def cache_computed(self, seq: V1Sequence, num_tokens: int) -> None:
        """Offer the full blocks of the first ``num_tokens`` tokens to the prefix cache."""
        ...

    def free(self, seq: V1Sequence) -> None:
        """Release everything the sequence holds."""
        ...

    def held_slots(self, seq: V1Sequence) -> int:
        """Slots the sequence holds now (shared ones included)."""
        ...

    def usage(self, sequences: list[V1Sequence]) -> MemoryUsage:
        """The pool in the paper's categories; ``sequences`` are those holding memory."""
        ...


class _AllocatorV1Memory(Generic[_AllocatorT]):
    """What a ``V1Memory`` over one of kvbench's allocators hands straight to it: freeing a
    sequence, its held slots, the pool's usage."""

    _allocator: _AllocatorT

    def free(self, seq: V1Sequence) -> None:
        self._allocator.free(seq.request_id)

    def held_slots(self, seq: V1Sequence) -> int:
        return self._allocator.held_slots(seq.request_id)

    def usage(self, sequences: list[V1Sequence]) -> MemoryUsage:
        return self._allocator.usage()


class ReservingV1Memory(_AllocatorV1Memory[Allocator]):
    """A naive contiguous allocator under vLLM v1's policy: a request reserves its whole span at
    admission (the allocator's policy: the model's maximum length, a power-of-two guess, or its
    true length), so v1's whole-input check becomes "the reservation succeeds" and a chunk or a
    decode token only fills what is reserved. No prefix cache."""

    enable_caching = False
    block_size = 1  # slots: the contiguous allocators have no blocks

    def __init__(self, allocator: Allocator, max_model_len: int) -> None:
        self._allocator = allocator
        self._max_model_len = max_model_len
        # Whether its requests can decode lazily (an allocator with cohort rounds, which
        # take no blocks: a round fills reserved slots).
        self._has_cohort = (isinstance(allocator, CohortAllocator)
                            and not allocator.cohort_next_round_blocks())  # fmt: skip

    @property
    def num_blocks_in_use(self) -> int:
        usage = self._allocator.usage()
        return usage.token_states + usage.reservation + usage.internal_frag

    def find_hit(self, seq: V1Sequence) -> list[int]:
        return []

    def can_admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> bool:
        whole_input = min(seq.num_tokens, self._max_model_len)
        return self._allocator.can_admit(seq.request, whole_input)

    def admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> None:
        seq.num_computed_tokens = 0
        if not self._allocator.admit(seq.request_id, seq.request, num_new_tokens):
            raise RuntimeError("the reservation failed: check can_admit first")

    def can_grow(self, seq: V1Sequence, num_new_tokens: int) -> bool:
        return self._allocator.can_append(seq.request_id, num_new_tokens)

    def grow(self, seq: V1Sequence, num_new_tokens: int) -> None:
        if not self._allocator.append(seq.request_id, num_new_tokens):
            raise RuntimeError("the reservation is full: check can_grow first")

    def cache_computed(self, seq: V1Sequence, num_tokens: int) -> None:
        pass  # no prefix cache

    def join_decoders(self, seqs: list[V1Sequence]) -> bool:
        """Take ``seqs`` into the allocator's cohort (``DecodingMemory``), if each reserved at
        least what it will finally hold: every round then turns one reserved slot of each into
        a token state, and nothing else in the pool's usage moves. False (nothing changes)
        otherwise, or for an allocator without cohort rounds."""
        if not self._has_cohort:
            return False
        return cast(CohortAllocator, self._allocator).join_cohort([seq.request_id
                                                                  for seq in seqs])  # fmt: skip

    def next_round_blocks(self) -> int:
        """0: a round fills reserved slots."""
        return 0

    @property
    def num_free_blocks(self) -> int:
        """Free slots."""
        return cast(CohortAllocator, self._allocator).num_free_blocks()

    def decode_rounds(self) -> CohortRounds:
        """Rounds take no blocks and add no internal fragmentation."""
        return CohortRounds(new_blocks=(0,), first_round=0, internal_frag_slots={})

    def advance_decoders(self, num_rounds: int) -> None:
        """Grow every member by ``num_rounds`` tokens."""
        cast(CohortAllocator, self._allocator).advance_cohort(num_rounds)

    def leave_decoders(self, seqs: list[V1Sequence]) -> None:
        """Take ``seqs`` out of the cohort."""
        cast(CohortAllocator, self._allocator).leave_cohort([seq.request_id for seq in seqs])


class HybridV1Memory(_AllocatorV1Memory[PagedHybridAllocator]):
    """``paged_hybrid`` (and ``paged_hybrid_prefix``) under vLLM v1's policy: vLLM's hybrid
    KV-cache manager (a ``FullAttentionManager`` per full group, a ``SlidingWindowManager`` per
    sliding one, over one block pool), which ``PagedHybridAllocator`` is: before a running
    request grows, each sliding group frees the blocks wholly behind its window
    (``remove_skipped_blocks``, which vLLM runs even when the growth then fails: ``can_grow``
    frees them, so a preemption that follows frees the rest after them in the free queue).

    What v1 adds is its admission check (``full_sequence_must_fit``): a sliding group needs no
    more blocks for a request's whole input than its window and the tokens in flight can hold,
    ``ceil(min(w - 1 + in-flight tokens, max_model_len) / block_size) + 1`` (vLLM's
    ``SlidingWindowSpec.max_admission_blocks_per_request``; one step's token budget in flight,
    two under async scheduling), so a long prompt is admitted on its windows' blocks, not its
    length's. Chunked prefill then holds a sliding group to about its window plus one chunk.

    With prefix caching (the allocator's ``HybridPrefixCache``) a sequence's blocks are named as
    ``V1KVCache`` names them (``V1Sequence.block_hashes``: its known prompt prefix, then blocks
    of its own), so a resumed request finds its own blocks: a full group caches every full
    block, generated ones included; a sliding group the tails vLLM 0.32 retains
    (``hybrid_prefix``). A block is cached once the tokens that fill it are known (under async
    scheduling, when a token in flight is taken in: ``cache_computed``). The admission check
    counts a hit's blocks against the whole input's in every group, plus the hit blocks that
    wait in the free queue.
    """

    def __init__(self, allocator: PagedHybridAllocator, limits: V1Limits) -> None:
        self.enable_caching = allocator.prefix_cache is not None
        self._allocator = allocator
        self._max_model_len = limits.max_model_len
        self.block_size = block_size = allocator.block_size
        max_in_flight_tokens = limits.max_num_batched_tokens * (2 if limits.async_scheduling else 1)
        # A decoding request's tokens in flight: its window is placed before them.
        self._num_in_flight_tokens = 1 if limits.async_scheduling else 0
        # Per group, the most blocks the admission check asks for (None: the whole input's).
        self._admission_caps = [
            None if group.window_tokens is None
            else -(-min(group.window_tokens - 1 + max_in_flight_tokens, limits.max_model_len)
                   // block_size) + 1
            for group in allocator.layout.groups
        ]  # fmt: skip
        # The hit find_hit found per waiting sequence: the scheduler sees its length only.
        self._hits: dict[int, HybridHit] = {}

    @property
    def num_blocks_in_use(self) -> int:
        return self._allocator.num_held_blocks()

    def find_hit(self, seq: V1Sequence) -> list[int]:
        cache = self._allocator.prefix_cache
        if cache is None:
            return []
        max_hit_blocks = (seq.num_tokens - 1) // self.block_size
        hit = cache.lookup(seq.request, seq.num_tokens,
                           seq.block_hashes(max_hit_blocks, self.block_size))  # fmt: skip
        self._hits[seq.request_id] = hit
        return list(range(hit.num_blocks))  # stands for the hit: its length is what counts

    def can_admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """vLLM's two checks: the whole input (a sliding group's blocks capped), then the first
        chunk. A hit longer than a sliding group's cap satisfies the first in that group, not
        the second, which needs the chunk's own blocks."""
        block_size = self.block_size
        num_hit_blocks = len(hits)
        num_blocks = -(-min(seq.num_tokens, self._max_model_len) // block_size)
        num_whole = sum(max((num_blocks if cap is None else min(num_blocks, cap))
                            - num_hit_blocks, 0)
                        for cap in self._admission_caps)  # fmt: skip
        num_chunk_blocks = -(-(num_hit_blocks * block_size + num_new_tokens) // block_size)
        num_chunk = (num_chunk_blocks - num_hit_blocks) * len(self._admission_caps)
        if num_hit_blocks:  # a hit on a free cached block takes it off the free queue
            allocator = self._allocator
            num_free_hits = sum(
                1
                for group_blocks in self._hits[seq.request_id].group_blocks
                for block_id in group_blocks
                if block_id is not None and allocator.ref_count(block_id) == 0
            )
            num_whole += num_free_hits
            num_chunk += num_free_hits
        return max(num_whole, num_chunk) <= self._allocator.num_free_blocks()

    def admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> None:
        hit = self._hits.pop(seq.request_id, None)
        num_hit_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = num_hit_tokens
        num_tokens = num_hit_tokens + num_new_tokens
        hashes = None
        if self.enable_caching:
            hashes = seq.block_hashes(num_tokens // self.block_size, self.block_size)
        if not self._allocator.admit(seq.request_id, seq.request, num_tokens, hit=hit,
                                     hashes=hashes):  # fmt: skip
            raise RuntimeError("the first chunk does not fit: check can_admit first")

    def can_grow(self, seq: V1Sequence, num_new_tokens: int) -> bool:
        """Free the blocks behind each window first, as vLLM does whether or not the growth
        then fits: a preemption that follows frees the rest after them."""
        num_processed_tokens = _processed_tokens(seq)
        self._allocator.free_behind_windows(seq.request_id,
                                            num_processed_tokens=num_processed_tokens)  # fmt: skip
        return self._allocator.can_append(seq.request_id, num_new_tokens,
                                          num_processed_tokens=num_processed_tokens)  # fmt: skip

    def grow(self, seq: V1Sequence, num_new_tokens: int) -> None:
        if self.enable_caching:  # name the blocks the new tokens fill before they are cached
            seq.block_hashes((seq.num_computed_tokens + num_new_tokens) // self.block_size,
                             self.block_size)  # fmt: skip
        # vLLM caches what the known tokens fill: a token in flight waits for cache_computed.
        if not self._allocator.append(seq.request_id, num_new_tokens,
                                      num_processed_tokens=_processed_tokens(seq),
                                      num_cacheable_tokens=seq.num_tokens):  # fmt: skip
            raise RuntimeError("too few free blocks: check can_grow first")

    def cache_computed(self, seq: V1Sequence, num_tokens: int) -> None:
        if self.enable_caching:
            seq.block_hashes(num_tokens // self.block_size, self.block_size)
            self._allocator.cache_blocks(seq.request_id, num_tokens)

    def join_decoders(self, seqs: list[V1Sequence]) -> bool:
        """Take ``seqs`` into the allocator's decode cohort (``DecodingMemory``: their windows
        placed after the tokens whose step has returned, as ``can_grow`` places them); False
        (nothing changes) with prefix caching."""
        return self._allocator.join_decoders(
            [seq.request_id for seq in seqs], num_unprocessed_tokens=self._num_in_flight_tokens
        )

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue."""
        return self._allocator.num_free_blocks()

    def next_round_blocks(self) -> int:
        """Free blocks the next round needs (its new blocks beyond what its frees give back)."""
        return self._allocator.cohort_next_round_blocks()

    def decode_rounds(self) -> None:
        """None: rounds also free blocks (behind the windows), so no stretch runs."""
        return None

    def advance_decoders(self, num_rounds: int) -> None:
        """Grow every member by ``num_rounds`` tokens."""
        self._allocator.advance_cohort(num_rounds)

    def leave_decoders(self, seqs: list[V1Sequence]) -> None:
        """Take ``seqs`` out of the cohort, their counts written back."""
        self._allocator.leave_cohort([seq.request_id for seq in seqs])


def _processed_tokens(seq: V1Sequence) -> int:
    """Tokens whose step has returned: a window is placed after them (vLLM frees on this basis,
    as a step in flight may still read the blocks behind the optimistic one)."""
    return max(0, seq.num_computed_tokens - seq.num_in_flight_tokens)


@dataclass(frozen=True)
class DecodeStretch:
    """The next steps while each only decodes the running batch (``V1StepScheduler.
    decode_stretch``): every running request computes one token and samples it, none finishes,
    nothing is admitted or preempted, the memory only takes the blocks the tokens start.

    Attributes:
        max_steps: most such steps (the one after them finishes a request).
        num_seqs: requests decoding in each.
        context_tokens: the first step's decode context (each request's tokens after it); each
            step adds ``num_seqs``.
        memory_blocked: the first waiting request is tried in each step and does not fit.
        admits_arrivals: nothing waits, and a request arriving would be tried for admission: the
            stretch ends before the step it arrives for.
        rounds: the blocks each step takes and the internal fragmentation it adds (the
            members' rounds, ``LazyDecoders``); a step the free blocks cannot hold would
            preempt, and ends the stretch before it.
    """

    max_steps: int
    num_seqs: int
    context_tokens: int
    memory_blocked: bool
    admits_arrivals: bool
    rounds: CohortRounds


@dataclass
class V1Batch:
    """What the last step did, for the engine's records (``engine.simulate_v1``).

    Attributes:
        scheduled: (sequence, tokens computed before the step, tokens scheduled), in order.
        admitted: (sequence, prefix-hit tokens) of the sequences admitted in the step (to
            compute, or to load from the CPU tier first: their hits include the loaded tokens).
        loaded: (sequence, tokens) of the sequences admitted in the step to load from the CPU
            tier.
        preempted: the sequences preempted in the step.
        sampled: the sequences that produced a token (their prompt is computed), but for the
            lazily decoding ones.
        finished: (sequence, slots it held) of those whose last token was taken in: produced in
            this step, or in the step before under async scheduling (0 slots when it was
            preempted meanwhile).
        memory_blocked: a waiting request did not fit the free memory.
        usage: the memory right after scheduling (before finished requests free theirs), when
            the scheduler records it (``record_usage``).
        num_lazy_decodes: the lazily decoding requests (the first running ones), each
            computing one token, not in ``scheduled``.
        lazy_context_tokens: their decode tokens' context (each request's tokens after it).
    """

    scheduled: list[tuple[V1Sequence, int, int]] = field(default_factory=list)
    admitted: list[tuple[V1Sequence, int]] = field(default_factory=list)
    loaded: list[tuple[V1Sequence, int]] = field(default_factory=list)
    preempted: list[V1Sequence] = field(default_factory=list)
    sampled: list[V1Sequence] = field(default_factory=list)
    finished: list[tuple[V1Sequence, int]] = field(default_factory=list)
    memory_blocked: bool = False
    usage: MemoryUsage | None = None
    num_lazy_decodes: int = 0
    lazy_context_tokens: int = 0


class V1StepScheduler:
    """vLLM v1's policy over its KV-cache manager (``V1KVCache``), one step per call."""

    def __init__(
        self,
        kv_cache: V1Memory,
        limits: V1Limits,
        *,
        record_usage: bool = False,
        fast: bool = True,
        lazy: bool = False,
    ) -> None:
        """``record_usage``: keep each step's memory usage (``last_batch.usage``) for the
        records; ``fast``: skip the KV manager for decode tokens that neither start nor fill one
        of its blocks (identical steps; False is the reference, every token through it);
        ``lazy`` (with ``fast``, over a reserving allocator, vLLM's manager without a CPU tier,
        or its hybrid manager without prefix caching): the running requests that only decode
        advance lazily (``LazyDecoders``), and ``decode_stretch`` runs decode-only steps (but
        over the hybrid manager, whose rounds free blocks behind windows); a step's
        ``scheduled_tokens`` then leaves out their decode tokens (``num_lazy_decodes``), and
        ``last_batch`` and their counts leave them out too until they finish or ``step`` needs
        them (the engine's fast path)."""
        self._kv_cache = kv_cache
        # A decode token that neither starts nor fills a block of vLLM's manager changes nothing
        # in it: the fast path skips the calls (this runs for every running request of every
        # step).
        self._fast_decodes = fast and isinstance(kv_cache, V1KVCache)
        # A decode token changes nothing but counts and the blocks it starts (and, in the hybrid
        # manager, frees behind windows): over a reserving allocator, vLLM's manager without a
        # CPU tier or its hybrid manager without prefix caching, decoding requests advance
        # lazily (``LazyDecoders``), and the engine runs decode-only steps in stretches
        # (``decode_stretch``).
        self._decoders = None
        if fast and lazy and (
            isinstance(kv_cache, ReservingV1Memory)
            or (isinstance(kv_cache, V1KVCache) and kv_cache.cpu_tier is None)
            or (isinstance(kv_cache, HybridV1Memory) and not kv_cache.enable_caching)
        ):
            self._decoders = LazyDecoders(kv_cache)
        self._num_prefix = 0  # running[:_num_prefix]: the members, and the leavers below
        # Async, in a step: members whose last token is in flight, to take in.
        self._leavers: list[V1Sequence] = []
        self._record_usage = record_usage
        self.last_batch = V1Batch()
        self._limits = limits
        self._running: list[V1Sequence] = []
        self._queued: deque[V1Sequence] = deque()  # waiting: new, and preempted at the front
        # vLLM's CPU offloading (a V1KVCache's tier): requests loading from it, or loaded and not
        # yet scheduled, wait apart (vLLM's kv_holding_waiting), served before the others; the
        # requests still prefilling keep the blocks they lack from a load's admission.
        self._tiered_cache = kv_cache if isinstance(kv_cache, V1KVCache) else None
        self._cpu_tier = kv_cache.cpu_tier if isinstance(kv_cache, V1KVCache) else None
        self._holding: deque[V1Sequence] = deque()
        self._prefilling: dict[V1Sequence, None] = {}
        # vLLM defers freeing a request's blocks while a step in flight may write them, when a
        # KV connector could load into them (``Scheduler.defer_block_free``).
        self._defers_frees = self._cpu_tier is not None and limits.async_scheduling
        # Async scheduling: the sequences whose token of the last step is not taken in yet, and
        # what the last step scheduled (its tokens are in flight until then).
        self._in_flight: list[V1Sequence] = []
        self._in_flight_scheduled: list[tuple[V1Sequence, int]] = []
        self._num_steps = 0

    @property
    def limits(self) -> V1Limits:
        """The engine's limits."""
        return self._limits

    @property
    def kv_cache(self) -> V1Memory:
        """The KV-cache manager the scheduler allocates from."""
        return self._kv_cache

    @property
    def running(self) -> list[V1Sequence]:
        """The running sequences, in vLLM's order (read only; under ``lazy``, the first ones'
        counts are stale: ``LazyDecoders``)."""
        return self._running

    @property
    def num_waiting(self) -> int:
        """Sequences waiting: never admitted, or preempted, or loading from the CPU tier."""
        return len(self._queued) + len(self._holding)

    def add(self, request: Request) -> V1Sequence:
        """Queue a request (vLLM's ``add_request``): it waits behind those queued before."""
        seq = V1Sequence(request)
        self._queued.append(seq)
        return seq

    def drop_first_waiting(self) -> V1Sequence:
        """Take the first waiting request out for good (one that can never fit: the caller
        rejects it), with the blocks it holds (one loaded from the CPU tier)."""
        if not self._holding:
            return self._queued.popleft()
        seq = self._holding.popleft()
        self._prefilling.pop(seq, None)
        self._kv_cache.free(seq)
        return seq

    @property
    def awaits_cpu_tier(self) -> bool:
        """Whether a waiting request may wait on the CPU tier alone: a load in flight or to
        take in, or a store in flight (a step that ran nothing then is not stuck)."""
        if self._cpu_tier is None:
            return False
        return self._cpu_tier.has_copies_in_flight or any(
            seq.load_state != NOT_LOADING for seq in self._holding
        )

    @property
    def has_unfinished(self) -> bool:
        """Whether any request runs or waits."""
        return bool(self._running or self._queued or self._holding)

    def step(self, copy_done: CopyDone | None = None) -> V1Step:
        """Schedule one step and apply the model runner's answer to it. With a CPU tier, the
        answers to the steps before it come first: a copy for which ``copy_done(job id)`` is
        False (still running, on the caller's ``CopyClock``) waits for a later answer; None:
        every copy is shorter than a step (the referee's worker)."""
        scheduled: list[tuple[V1Sequence, int]] = []
        preempted: list[int] = []
        lookups = _Lookups()
        self.last_batch = batch = V1Batch()
        tier = self._cpu_tier
        if tier is not None:
            self._take_in_copies(tier, copy_done)
            assert self._tiered_cache is not None
            self._tiered_cache.step_allocated_blocks.clear()
        budget = self._limits.max_num_batched_tokens
        decoders = self._decoders
        num_lazy = self._advance_decoders()
        if num_lazy:
            assert decoders is not None
            batch.num_lazy_decodes = num_lazy
            batch.lazy_context_tokens = decoders.computed_tokens
            budget -= num_lazy
        budget = self._schedule_running(scheduled, preempted, budget, self._num_prefix)
        if not preempted:
            self._schedule_waiting(scheduled, budget, lookups)
        num_blocks_in_use = self._kv_cache.num_blocks_in_use
        batch_scheduled = batch.scheduled
        scheduled_tokens = []
        computed_inputs = []  # the sequences whose whole input is computed: they sample
        for seq, num_tokens in scheduled:
            request = seq.request
            computed = seq.num_computed_tokens
            batch_scheduled.append((seq, computed, num_tokens))
            scheduled_tokens.append((request.request_id, num_tokens))
            computed += num_tokens
            seq.num_computed_tokens = computed
            generated = seq.num_output_tokens + seq.num_output_placeholders
            if computed >= request.prompt_tokens + generated:
                computed_inputs.append(seq)
        if self._record_usage:
            batch.usage = self.usage()
        batch.sampled = computed_inputs
        if tier is not None:
            self._offload(tier)
        if self._limits.async_scheduling:
            for seq in computed_inputs:
                seq.num_output_placeholders += 1
            for seq, num_tokens in scheduled:
                seq.num_in_flight_tokens += num_tokens
            for seq, num_tokens in self._in_flight_scheduled:  # the last step returns
                seq.num_in_flight_tokens -= num_tokens
            self._in_flight_scheduled = scheduled
            finished = self._take_in(self._in_flight)
            self._in_flight = computed_inputs
        else:
            finished = []
            if num_lazy:
                assert decoders is not None
                finished = self._take_in(decoders.take_finishers(pending_take_in=True))
            finished += self._take_in(computed_inputs)
        if decoders is not None:
            self._join_decoders()
        step = V1Step(
            step_index=self._num_steps,
            scheduled_tokens=tuple(scheduled_tokens),
            num_blocks_in_use=num_blocks_in_use,
            preempted_request_ids=tuple(sorted(preempted)),
            finished_request_ids=tuple(sorted(finished)),
            num_running=len(self._running),
            num_waiting=self.num_waiting,
            prefix_query_tokens=lookups.query_tokens,
            prefix_hit_tokens=lookups.hit_tokens,
            resumed_query_tokens=lookups.resumed_query_tokens,
            resumed_hit_tokens=lookups.resumed_hit_tokens,
            cpu_hit_tokens=sum(num_tokens for _, num_tokens in batch.loaded),
            num_cpu_blocks=tier.num_held_chunks if tier is not None else 0,
            num_lazy_decodes=num_lazy,
        )
        self._num_steps += 1
        return step

    def usage(self) -> MemoryUsage:
        """The memory now, in the paper's categories."""
        holders = self._running[self._num_prefix:] if self._num_prefix else self._running
        if self._leavers or self._holding:
            holders = holders + self._leavers + list(self._holding)
        return self._kv_cache.usage(holders)

    def _advance_decoders(self) -> int:
        """Run the lazily decoding requests' round of this step; how many decode in it.

        Under async scheduling, the members whose last token is in flight leave first: the
        step does not schedule them and takes that token in. 0 when the memory cannot grow
        every member: their counts are written back, and the step runs them as the reference
        does (it preempts). The members' tokens in flight, when written back, join the lists
        the step takes in from, at their head, in running order."""
        decoders = self._decoders
        if decoders is None:
            return 0
        self._num_prefix = num_prefix = len(decoders)
        if not num_prefix:
            return 0
        in_flight: list[V1Sequence] = []
        if self._limits.async_scheduling:
            in_flight = self._leavers = decoders.take_finishers(pending_take_in=False)
        memory = decoders.memory
        num_new_blocks = memory.next_round_blocks()
        if num_new_blocks and num_new_blocks > memory.num_free_blocks:
            decoders.leave_all()
            self._leavers = []
            self._num_prefix = 0
            in_flight = self._running[:num_prefix]
        if in_flight and self._limits.async_scheduling:
            self._in_flight = in_flight + self._in_flight
            self._in_flight_scheduled = [(seq, 1) for seq in in_flight] + self._in_flight_scheduled
        num_lazy = len(decoders)
        if num_lazy:
            # The running requests a step schedules never outnumber the token budget (a step
            # admits only while budget is left), and every member was scheduled in the last.
            assert num_lazy <= self._limits.max_num_batched_tokens
            decoders.advance(1)
        return num_lazy

    def _join_decoders(self) -> None:
        """Make the running requests after the members that decode members, in running order:
        their prompt computed, each sampled token but the last; under async scheduling, with
        exactly the last step's decode token in flight, not their last, which then leaves the
        lists the next step takes in from (they head them)."""
        decoders = self._decoders
        assert decoders is not None
        self._leavers = []
        running = self._running
        num_members = len(decoders)
        num_in_flight = 1 if self._limits.async_scheduling else 0
        num_joined = 0
        while num_members < len(running):
            seq = running[num_members]
            num_generated = seq.num_output_tokens + seq.num_output_placeholders
            if (not num_generated or num_generated >= seq.request.output_tokens
                    or seq.num_computed_tokens != seq.request.prompt_tokens + num_generated - 1
                    or seq.num_output_placeholders != num_in_flight
                    or seq.num_in_flight_tokens != num_in_flight
                    or not decoders.join([seq])):  # fmt: skip
                break
            num_members += 1
            num_joined += 1
        self._num_prefix = num_members
        if num_in_flight and num_joined:
            joined = running[num_members - num_joined:num_members]
            assert self._in_flight[:num_joined] == joined
            assert self._in_flight_scheduled[:num_joined] == [(seq, 1) for seq in joined]
            # New lists: the step's records share the old ones (``last_batch.sampled``).
            self._in_flight = self._in_flight[num_joined:]
            self._in_flight_scheduled = self._in_flight_scheduled[num_joined:]

    def step_on(self, clock: CopyClock | None, now_s: float) -> tuple[V1Step, float]:
        """``step`` at ``now_s`` with the CPU tier's copies on ``clock``: the answers before it
        taken in as of ``now_s``, its own copies submitted; (the step, when it starts computing:
        later than ``now_s`` when it waits for stores it flushes). No clock: ``step()``."""
        if clock is None or self._cpu_tier is None:
            return self.step(), now_s
        clock.before_step(now_s)
        step = self.step(clock.done)
        return step, clock.submit(self._cpu_tier.last_copies, now_s)

    def decode_stretch(self) -> DecodeStretch | None:
        """Begin a stretch of decode-only steps (``DecodeStretch``), if the next step is one and
        the memory can grow the batch lazily; end it with ``end_decode_stretch``. None: the next
        step goes through ``step``.

        Only when every running request decodes lazily (``LazyDecoders``: over a reserving
        allocator or vLLM's manager without a CPU tier; not the hybrid manager, whose rounds
        free blocks: ``DecodingMemory.decode_rounds``). A waiting request that does not fit
        now will not while the batch only decodes: nothing is freed, and the blocks the steps
        take can only evict cached blocks it would hit, each of which it then needs as a new
        block instead.
        """
        decoders = self._decoders
        num_seqs = len(self._running)
        if decoders is None or not num_seqs or len(decoders) < num_seqs:
            return None
        memory = decoders.memory
        rounds = memory.decode_rounds()
        if rounds is None:
            return None
        limits = self._limits
        budget = limits.max_num_batched_tokens - num_seqs
        tries_waiting = budget > 0 and num_seqs < limits.max_num_seqs
        kv_cache = self._kv_cache
        memory_blocked = False
        if tries_waiting and self._queued:  # as _schedule_waiting tries its head
            head = self._queued[0]
            hits = kv_cache.find_hit(head)
            num_tokens = self._chunk(head, budget, len(hits) * kv_cache.block_size)
            if kv_cache.can_admit(head, hits, num_tokens):
                return None
            memory_blocked = True
        # Async, a member's last token in flight is taken in a step later than synchronously.
        max_steps = decoders.rounds_before_finish() + (1 if limits.async_scheduling else 0)
        if max_steps < 1 or memory.next_round_blocks() > memory.num_free_blocks:
            return None  # a member finishes, or cannot grow: the step preempts
        return DecodeStretch(
            max_steps=max_steps,
            num_seqs=num_seqs,
            context_tokens=decoders.computed_tokens + num_seqs,
            memory_blocked=memory_blocked,
            admits_arrivals=tries_waiting and not self._queued,
            rounds=rounds,
        )

    def end_decode_stretch(self, num_steps: int) -> None:
        """Run ``num_steps`` steps of the stretch ``decode_stretch`` began (its first
        ``max_steps`` at most, each held by the free blocks): each running request computes and
        takes in that many tokens (lazily)."""
        assert self._decoders is not None
        self._decoders.advance(num_steps)
        self._num_steps += num_steps

    def _offload(self, tier: CpuOffloadTier) -> None:
        """After scheduling (vLLM's ``build_connector_meta``), the CPU tier stores the prompt
        blocks the step's tokens complete (their copies are answered before the next step)."""
        for seq, computed_before, num_tokens in self.last_batch.scheduled:
            tier.offer(seq, computed_before + num_tokens, len(seq.blocks))
            if seq.num_computed_tokens >= seq.num_tokens + seq.num_output_placeholders:
                self._prefilling.pop(seq, None)
        assert self._tiered_cache is not None
        tier.end_schedule(self._tiered_cache.step_allocated_blocks)

    def _take_in_copies(self, tier: CpuOffloadTier, copy_done: CopyDone | None) -> None:
        """The worker's answers to the last step (async: the one before it, whose output is
        taken in after the last was scheduled): a loaded request computes from this step."""
        loaded = set(tier.complete_step(1 if self._limits.async_scheduling else 0, copy_done))
        for seq in self._holding:
            if seq.request_id in loaded:
                seq.load_state = LOADED

    def _schedule_running(
        self, scheduled: list[tuple[V1Sequence, int]], preempted: list[int], budget: int,
        first_index: int,
    ) -> int:
        """Schedule the running requests from ``first_index`` on (those before it decode
        lazily); the budget left. A request that cannot grow preempts the last running ones,
        never one before it."""
        kv_cache = self._kv_cache
        running = self._running
        fast_decodes = self._fast_decodes
        block_size = kv_cache.block_size
        last_decode_position = self._limits.max_model_len - 2
        index = first_index
        while index < len(running) and budget > 0:
            seq = running[index]
            computed = seq.num_computed_tokens
            placeholders = seq.num_output_placeholders
            if placeholders and computed + 2 - placeholders >= seq.request.total_tokens:
                index += 1  # async: its last token is in flight, no step is left to run
                continue
            if (
                fast_decodes
                and seq.request.prompt_tokens + seq.num_output_tokens + placeholders - computed == 1
                and computed <= last_decode_position
                and computed % block_size
                and (computed + 1) % block_size
            ):
                scheduled.append((seq, 1))
                budget -= 1
                index += 1
                continue
            num_tokens = self._chunk(seq, budget, seq.num_computed_tokens)
            while not kv_cache.can_grow(seq, num_tokens):
                if self._defers_frees and self._in_flight_step_holds(running[-1]):
                    # vLLM with a connector, async: the step in flight may still write the
                    # victim's blocks, so freeing them waits for its answer; no preemption now.
                    return budget
                victim = running.pop()  # the last running request: recompute it later
                self._preempt(victim)
                self.last_batch.preempted.append(victim)
                preempted.append(victim.request_id)
                if victim is seq:
                    return budget
            kv_cache.grow(seq, num_tokens)
            scheduled.append((seq, num_tokens))
            budget -= num_tokens
            index += 1
        return budget

    def _in_flight_step_holds(self, seq: V1Sequence) -> bool:
        """Whether the step in flight (async) computes tokens of ``seq``."""
        return any(other is seq for other, _ in self._in_flight_scheduled)

    def _schedule_waiting(
        self, scheduled: list[tuple[V1Sequence, int]], budget: int, lookups: _Lookups
    ) -> None:
        kv_cache = self._kv_cache
        tier = self._cpu_tier
        # Requests skipped for this step (a load in flight, a hit still being copied) keep
        # their places at the front of their queues, as vLLM's are.
        skipped_holding: list[V1Sequence] = []
        skipped_waiting: list[V1Sequence] = []
        while budget > 0 and len(self._running) < self._limits.max_num_seqs:
            queue = self._holding or self._queued
            if not queue:
                break
            seq = queue[0]
            if seq.load_state == LOADING:
                skipped_holding.append(queue.popleft())
                continue
            if seq.load_state == LOADED:
                self._take_in_load(seq)
            # A loaded request holds its blocks and looks nothing up. (vLLM looks up again one
            # whose computed tokens are 0: a 1-token prompt loaded whole, with blocks of 1
            # token, then loads again every step, forever; docs/referee.md.)
            loaded = bool(seq.blocks)
            hits: list[int] = []
            if not loaded:
                hits = kv_cache.find_hit(seq)
            if tier is not None and not loaded:
                num_load_blocks = tier.lookup(seq, len(hits))
                if num_load_blocks is None:
                    skipped_waiting.append(queue.popleft())
                    continue
                if num_load_blocks:
                    if not self._admit_to_load(seq, hits, num_load_blocks, tier, lookups):
                        break
                    skipped_holding.append(queue.popleft())
                    continue
            num_computed = seq.num_computed_tokens if loaded else len(hits) * kv_cache.block_size
            num_tokens = self._chunk(seq, budget, num_computed)
            # vLLM 0.32 (scheduler_reserve_full_isl): the whole input must fit, not just a chunk.
            if not kv_cache.can_admit(seq, hits, num_tokens):
                self.last_batch.memory_blocked = True
                break
            queue.popleft()
            if loaded:
                # Scheduled at last, it reaches vLLM's connector as a new (or resumed) request
                # with all its blocks: a store in flight on one of them is flushed.
                assert self._tiered_cache is not None
                self._tiered_cache.step_allocated_blocks.update(seq.blocks)
                kv_cache.grow(seq, num_tokens)
            else:
                kv_cache.admit(seq, hits, num_tokens)
                if kv_cache.enable_caching:
                    lookups.record(seq, len(hits) * kv_cache.block_size)
                self.last_batch.admitted.append((seq, len(hits) * kv_cache.block_size))
            self._running.append(seq)
            scheduled.append((seq, num_tokens))
            budget -= num_tokens
            if tier is not None and seq.num_computed_tokens + num_tokens < seq.num_tokens:
                self._prefilling[seq] = None
        self._holding.extendleft(reversed(skipped_holding))
        self._queued.extendleft(reversed(skipped_waiting))

    def _admit_to_load(
        self,
        seq: V1Sequence,
        hits: list[int],
        num_load_blocks: int,
        tier: CpuOffloadTier,
        lookups: _Lookups,
    ) -> bool:
        """Admit a waiting request to load ``num_load_blocks`` blocks from the CPU tier past its
        hits (it waits outside the batch meanwhile); False when its blocks do not fit."""
        kv_cache = self._tiered_cache
        assert kv_cache is not None
        reserved = sum(kv_cache.remaining_blocks(other) for other in self._prefilling)
        if not kv_cache.can_load(seq, hits, num_load_blocks, reserved):
            self.last_batch.memory_blocked = True
            return False
        kv_cache.admit_to_load(seq, hits, num_load_blocks)
        tier.start_load(seq, len(hits), num_load_blocks)
        seq.load_state = LOADING
        block_size = kv_cache.block_size
        lookups.record(seq, len(hits) * block_size)
        self.last_batch.admitted.append((seq, seq.num_computed_tokens))
        self.last_batch.loaded.append((seq, num_load_blocks * block_size))
        self._prefilling[seq] = None
        return True

    def _take_in_load(self, seq: V1Sequence) -> None:
        """A loaded request's blocks join the prefix cache; a load of its whole input leaves
        its last token to compute, to sample from (vLLM's ``_update_waiting_for_remote_kv``)."""
        self._kv_cache.cache_computed(seq, seq.num_computed_tokens)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.num_computed_tokens -= 1
        seq.load_state = NOT_LOADING

    def _chunk(self, seq: V1Sequence, budget: int, num_computed_tokens: int) -> int:
        """Tokens the request computes this step, past its first ``num_computed_tokens``: what
        it lacks, within budget and length."""
        uncomputed = seq.num_tokens + seq.num_output_placeholders - num_computed_tokens
        room = self._limits.max_model_len - num_computed_tokens - 1
        return min(uncomputed, budget, room)

    def _preempt(self, seq: V1Sequence) -> None:
        if self._cpu_tier is not None:
            self._cpu_tier.preempted(seq)
        self._prefilling.pop(seq, None)
        self._kv_cache.free(seq)
        seq.num_computed_tokens = 0
        seq.num_output_placeholders = 0  # a token in flight is still taken in, as stale
        seq.num_preemptions += 1
        self._queued.appendleft(seq)

    def _take_in(self, sequences: list[V1Sequence]) -> list[int]:
        """Take in the token each of ``sequences`` sampled (vLLM's ``update_from_output``); the
        ids of those it finishes, their memory freed. Async, a token reaches a running sequence
        as a placeholder resolved (the blocks it fills are cached), or a sequence preempted since
        as stale (it waits, holding nothing)."""
        finished = []
        kv_cache = self._kv_cache
        for seq in sequences:
            num_output_tokens = seq.num_output_tokens + 1
            seq.num_output_tokens = num_output_tokens
            is_running = True
            if self._limits.async_scheduling:
                is_running = seq.num_output_placeholders > 0  # zeroed by a preemption
                if is_running:
                    placeholders = seq.num_output_placeholders - 1
                    seq.num_output_placeholders = placeholders
                    kv_cache.cache_computed(seq, seq.num_computed_tokens - placeholders)
            if num_output_tokens >= seq.request.output_tokens:
                if is_running:
                    self.last_batch.finished.append((seq, kv_cache.held_slots(seq)))
                    self._running.remove(seq)
                    if self._cpu_tier is not None:
                        self._cpu_tier.finished(seq)
                        self._prefilling.pop(seq, None)
                    kv_cache.free(seq)
                else:
                    self.last_batch.finished.append((seq, 0))
                    self._queued.remove(seq)
                finished.append(seq.request_id)
        return finished


class _Lookups:
    """A step's prefix-cache lookups of admitted requests, new and resumed apart (vLLM's
    ``PrefixCacheStats``: the whole input is the query, recorded at admission)."""

    __slots__ = ("hit_tokens", "query_tokens", "resumed_hit_tokens", "resumed_query_tokens")

    def __init__(self) -> None:
        self.query_tokens = 0
        self.hit_tokens = 0
        self.resumed_query_tokens = 0
        self.resumed_hit_tokens = 0

    def record(self, seq: V1Sequence, num_hit_tokens: int) -> None:
        if seq.num_preemptions:
            self.resumed_query_tokens += seq.num_tokens
            self.resumed_hit_tokens += num_hit_tokens
        else:
            self.query_tokens += seq.num_tokens
            self.hit_tokens += num_hit_tokens


def is_stuck(step: V1Step) -> bool:
    """Whether the step changed nothing while requests wait and none runs: the pool never fits
    the first waiting request (an async step that only took in finishing tokens did change, as
    did one that preempted the last running request beside one loaded from the CPU tier, or
    admitted a request to load from it)."""
    return (not step.scheduled_tokens and not step.num_lazy_decodes
            and not step.finished_request_ids
            and not step.num_running and not step.cpu_hit_tokens
            and not step.preempted_request_ids and bool(step.num_waiting))  # fmt: skip


def run_v1_steps(
    requests: SequenceOf[Request],
    memory: V1Memory,
    limits: V1Limits,
    arrival_steps: SequenceOf[int] | None = None,
    *,
    fast: bool = True,
    copy_steps_per_block: float = 0.0,
) -> list[V1Step]:
    """Step until every request finishes over ``memory``, as the referee does
    (``referee.run_referee``); ``tasks.simulate.experiment.v1_memory`` builds the memory for an
    allocator.

    ``arrival_steps[i]`` is the step before which request ``i`` is queued (all at step 0 when
    None): the referee's clock, in steps. ``fast``: as ``V1StepScheduler``.
    ``copy_steps_per_block`` > 0: the CPU tier's copies take that many steps per block, on a
    ``CopyClock`` whose every step lasts 1 (flush waits delay its start); 0: every copy is
    shorter than a step. ValueError when a step can run nothing although requests wait (the
    pool never fits the first of them).
    """
    arrivals = [0] * len(requests) if arrival_steps is None else list(arrival_steps)
    if len(arrivals) != len(requests):
        raise ValueError(f"{len(arrivals)} arrival steps for {len(requests)} requests")
    # Popped from the end: earliest arrival first, ties in request order.
    pending = sorted(range(len(requests)), key=lambda i: (arrivals[i], i), reverse=True)
    scheduler = V1StepScheduler(memory, limits, fast=fast)
    tier = memory.cpu_tier if isinstance(memory, V1KVCache) else None
    clock = None
    if tier is not None and copy_steps_per_block > 0:
        block_size = tier.block_size
        clock = CopyClock(lambda tokens: tokens / block_size * copy_steps_per_block,
                          limits.async_scheduling)  # fmt: skip
    now = 0.0
    steps: list[V1Step] = []
    while pending or scheduler.has_unfinished:
        while pending and arrivals[pending[-1]] <= len(steps):
            scheduler.add(requests[pending.pop()])
        step, start = scheduler.step_on(clock, now)
        now = start + 1.0
        steps.append(step)
        if is_stuck(step) and not scheduler.awaits_cpu_tier:
            raise ValueError(f"step {step.step_index}: no waiting request fits the pool")
    return steps
