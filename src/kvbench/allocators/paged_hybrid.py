"""vLLM v1's hybrid KV-cache manager: one block table per KV-cache group over one shared pool.

A model whose layers differ in attention (sliding windows beside full attention) is split into
KV-cache groups of ``group_size`` layers each (``core.kv_groups``); every block holds
``block_size`` tokens of one group's layers, so all blocks have one size and every group draws
from the same ``BlockPool``. A sequence holds one table per group. A full-attention group keeps
every block until the sequence ends, like ``paged``; a sliding-window group of window ``w`` frees,
before each append, the blocks that lie wholly before its window: with ``n`` tokens computed, the
first ``(n - w + 1) // block_size`` blocks (vLLM's ``SlidingWindowManager.remove_skipped_blocks``;
their table entries then point at vLLM's null block, None here). A sliding group therefore holds
at most ``ceil((w - 1) / block_size) + 2`` blocks of a long sequence, where ``paged`` on the same
model (every layer keeps every token) holds them all.

Units. The pool's blocks are counted by vLLM's rule from the KV memory
(``kv_capacity.hybrid_pool``); the usage breakdown is in the token slots of every other
allocator (one slot: the K and V of one token in all the model's layers), so a block held by a
group is worth ``block_size x group_size / num_layers`` slots. Categories are added up in
layer-slots (one token of one layer) and turned into slots once, rounding their running sums, so
they still add up to the pool: token states are the tokens a group's real layers hold; vLLM's
padding layers are internal fragmentation (held, never written); memory beyond the last whole
block is external fragmentation.

Without a layout (the registry's default), the allocator is one group of full attention: plain
paging (``paged`` without the fast path), which the registry's property tests check.

Prefix caching (``enable_prefix_caching``, the registry's ``paged_hybrid_prefix``, as
``paged_prefix`` is ``paged`` with it): a ``HybridPrefixCache`` caches a full group's full prompt
blocks and a sliding group's blocks before the points a later request can resume at (vLLM 0.32's
sparse retention), and an admission takes the longest prefix that every group serves (vLLM's
hybrid coordinator, ``hybrid_prefix``): a full group references its hit blocks, a sliding group
only the last ``ceil((w - 1) / block_size)`` of them (null entries before). Blocks freed behind a
window stay cached in the free queue until the pool reuses them; freed blocks join the queue as
vLLM's do, those it holds no hash for at the head. Shared blocks count in the
breakdown's ``shared_slots`` and ``saved_slots`` like forks' do.

Without a prefix cache, the running sequences that only decode can grow lazily, a round at a
time for all of them (``join_cohort``, ``advance_cohort``: ``hybrid_cohort``), as the engines'
fast paths do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.allocators.base import MemoryUsage, check_token_count
from kvbench.allocators.block_pool import BlockPool
from kvbench.allocators.hybrid_cohort import HybridDecodeCohort
from kvbench.allocators.hybrid_prefix import HybridHit, HybridPrefixCache
from kvbench.core.kv_groups import KvCacheGroup, KvGroupLayout
from kvbench.core.request import Request

# The layout without one: a single full-attention layer, so that a slot is a layer-slot.
_UNIFORM = KvGroupLayout((KvCacheGroup(None, 1),), group_size=1, num_model_layers=1)


@dataclass(slots=True, eq=False)
class _HybridSequence:
    """One sequence: its token count and, per group, its block table (None where a sliding group
    freed a block behind its window: vLLM's null block)."""

    request: Request
    final_tokens: int  # the request's true final length, capped at max_model_len
    num_tokens: int
    tables: list[list[int | None]]
    first_live: list[int]  # per group: entries before it are None


@dataclass(frozen=True, slots=True)
class _AppendPlan:
    """What an append takes and gives back, per group, before anything changes."""

    freed: tuple[tuple[int, int], ...]  # per group: table entries [first_live, end) to free
    num_new_blocks: tuple[int, ...]
    copies: tuple[bool, ...]  # the shared partial last block is copied first
    num_blocks_released: int  # of the freed entries, blocks nobody else references

    @property
    def num_blocks_needed(self) -> int:
        return sum(self.num_new_blocks) + sum(self.copies)


class PagedHybridAllocator:
    """Per-group block tables over one ``BlockPool`` of ``num_blocks`` blocks (module doc).

    Args:
        num_slots: the pool in token slots of the whole model (its memory).
        block_size: tokens per block.
        max_model_len: the longest sequence.
        layout: the model's KV-cache groups; None: one group of full attention.
        num_blocks: blocks in the pool (vLLM's count); None: as many as ``num_slots`` holds.
        enable_prefix_caching: share prompt prefixes across requests where every group hits
            (``prefix_cache``, a ``HybridPrefixCache``; None without).
        generated_slot_ahead: a sequence holds a slot for the token its last step sampled,
            whose K/V the next step computes (kvbench's vLLM-v0 engine: an admission holds the
            prompt and its first token). A growth then places the windows after all held tokens
            but the last, the ones computed before that step; by default after all of them, as
            vLLM v1 grows a sequence (every held token computed).
    """

    name = "paged_hybrid"
    forks_share_blocks = True  # a fork references the parent's blocks in every group

    def __init__(
        self,
        num_slots: int,
        block_size: int,
        max_model_len: int,
        *,
        layout: KvGroupLayout | None = None,
        num_blocks: int | None = None,
        enable_prefix_caching: bool = False,
        generated_slot_ahead: bool = False,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size}: must be >= 1")
        if num_slots < 0:
            raise ValueError(f"num_slots={num_slots}: must be >= 0")
        self.layout = layout or _UNIFORM
        self.num_slots = num_slots
        self.block_size = block_size
        self.max_model_len = max_model_len
        self._num_layers = self.layout.num_model_layers
        self._block_layer_slots = block_size * self.layout.group_size
        pool_layer_slots = num_slots * self._num_layers
        if num_blocks is None:
            num_blocks = pool_layer_slots // self._block_layer_slots
        if num_blocks * self._block_layer_slots > pool_layer_slots:
            raise ValueError(
                f"num_blocks={num_blocks} blocks of {block_size} tokens x "
                f"{self.layout.group_size} layers exceed the {num_slots}-slot pool"
            )
        self.num_copy_on_writes = 0
        self._num_uncomputed_tokens = 1 if generated_slot_ahead else 0
        # A prefix hit revives a cached free block: only then does the pool need the queue that
        # blocks can leave from the middle.
        self._pool = BlockPool(num_blocks, revivable=enable_prefix_caching)
        self._windows = [group.window_tokens for group in self.layout.groups]
        self.name = "paged_hybrid_prefix" if enable_prefix_caching else "paged_hybrid"
        self.prefix_cache = (
            HybridPrefixCache(block_size, self._windows) if enable_prefix_caching else None
        )
        # One group per window: groups of one window free the same entries at the same time.
        first_group_of_window: dict[int, int] = {}
        for group, window in enumerate(self._windows):
            if window is not None:
                first_group_of_window.setdefault(window, group)
        self._sliding_groups = [(group, window) for window, group in first_group_of_window.items()]
        self._group_layers = [group.num_layers for group in self.layout.groups]
        self._held_blocks = [0] * len(self._windows)  # per group: blocks with a reference
        self._sequences: dict[int, _HybridSequence] = {}
        self._copies: list[tuple[int, int]] = []
        self._num_logical_blocks = 0  # live table entries over all sequences and groups
        # Partially filled last blocks: only a table's last block can be partial, and a sequence's
        # last blocks in every group have the same fill and the same sharers (forks with equal
        # token counts: a write copies all of them at once). So one entry per set, keyed by group
        # 0's last block: (filled, usable slots of one layer), weighted by all the real layers.
        self._partial: dict[int, tuple[int, int]] = {}
        # Over the partial blocks, in layer-slots: the blocks' slots, the filled ones, the ones the
        # request will still fill.
        self._partial_layer_slots = 0
        self._partial_filled = 0
        self._partial_usable = 0
        # The running sequences that only decode, grown lazily (``join_cohort``).
        self._decoders: HybridDecodeCohort[_HybridSequence] = HybridDecodeCohort(
            block_size, self._windows, self._free_behind_window, self._start_blocks,
            self._pool.ref_counts,
        )

    # --- the Allocator protocol ----------------------------------------------------------------

    def can_admit(self, request: Request, num_tokens: int) -> bool:
        """Whether ``admit`` would succeed now, without changing anything."""
        check_token_count(num_tokens)
        hit = self._prefix_hit(request, num_tokens)
        return self._admit_blocks(num_tokens, hit) <= self._pool.num_free_blocks

    def admit(
        self,
        seq_id: int,
        request: Request,
        num_tokens: int,
        *,
        hit: HybridHit | None = None,
        hashes: Sequence[int] | None = None,
    ) -> bool:
        """Give a new sequence ``ceil(num_tokens / block_size)`` blocks in every group (its
        prefill writes them all before any of them leaves a window), the prefix cache's hits
        first; False if no room. ``hit``: the hit to take (default: the cache's lookup for
        ``num_tokens``); ``hashes``: the sequence's block hashes, its own included, which the
        caller extends as it grows (default: its known prompt prefix's)."""
        if seq_id in self._sequences:
            raise ValueError(f"sequence {seq_id} is already allocated")
        check_token_count(num_tokens)
        if hit is None:
            hit = self._prefix_hit(request, num_tokens)
        if self._admit_blocks(num_tokens, hit) > self._pool.num_free_blocks:
            return False
        # Reference the hits before allocating, so that allocation cannot evict them.
        for group, leading in enumerate(hit.group_blocks):
            for block_id in leading:
                if block_id is not None:
                    self._reference(block_id, group)
        num_new_blocks = self._blocks_for(num_tokens) - hit.num_blocks
        seq = _HybridSequence(
            request=request,
            final_tokens=min(request.total_tokens, self.max_model_len),
            num_tokens=num_tokens,
            tables=[
                [*leading, *self._allocate(group, num_new_blocks)]
                for group, leading in enumerate(hit.group_blocks)
            ],
            first_live=[
                sum(1 for block_id in leading if block_id is None) for leading in hit.group_blocks
            ],
        )
        self._sequences[seq_id] = seq
        self._num_logical_blocks += len(self._live_blocks(seq))
        self._track_last_blocks(seq)
        if self.prefix_cache is not None:
            self.prefix_cache.admitted(seq_id, request, hit, seq.tables, num_tokens, hashes)
        return True

    def can_append(
        self, seq_id: int, num_tokens: int = 1, *, num_processed_tokens: int | None = None
    ) -> bool:
        """Whether ``append`` would succeed now, without changing anything."""
        check_token_count(num_tokens)
        plan = self._append_plan(self._sequences[seq_id], num_tokens, num_processed_tokens)
        return plan.num_blocks_needed <= self._pool.num_free_blocks + plan.num_blocks_released

    def append(
        self,
        seq_id: int,
        num_tokens: int = 1,
        *,
        num_processed_tokens: int | None = None,
        num_cacheable_tokens: int | None = None,
    ) -> bool:
        """Free each sliding group's blocks behind its window, then grow every group's table,
        copying a shared partial last block first. False if no room (no change).

        The window is placed after ``num_processed_tokens`` tokens: by default every held token
        (all are computed; all but the last with ``generated_slot_ahead``); fewer while a step
        that computes the rest is still in flight (vLLM's async scheduling frees on the
        processed-token basis). With a prefix cache, the full blocks of the first
        ``num_cacheable_tokens`` tokens are cached (default: every held token; under async
        scheduling, a token in flight is not known yet: ``cache_blocks`` catches up)."""
        check_token_count(num_tokens)
        self._check_not_in_cohort(seq_id)
        seq = self._sequences[seq_id]
        default_processed = self._computed_tokens(seq)
        if num_processed_tokens is None:
            num_processed_tokens = default_processed
        if (num_tokens == 1 and num_processed_tokens == default_processed
                and self._append_within_last_blocks(seq, num_processed_tokens)):  # fmt: skip
            return True
        plan = self._append_plan(seq, num_tokens, num_processed_tokens)
        if plan.num_blocks_needed > self._pool.num_free_blocks + plan.num_blocks_released:
            return False
        if num_tokens == 0:
            return True
        for group, (first, end) in enumerate(plan.freed):
            self._free_behind_window(seq, group, first, end)
        if seq.num_tokens % self.block_size and not plan.copies[0]:
            self._untrack_partial(seq.tables[0][-1])  # it is about to fill further
        for group, table in enumerate(seq.tables):
            if plan.copies[group]:
                self._copy_last_block(table, group)
            table += self._allocate(group, plan.num_new_blocks[group])
        self._num_logical_blocks += sum(plan.num_new_blocks)
        seq.num_tokens += num_tokens
        self._track_last_blocks(seq)
        if self.prefix_cache is not None:
            self.cache_blocks(seq_id, seq.num_tokens if num_cacheable_tokens is None
                              else num_cacheable_tokens)  # fmt: skip
        return True

    def cache_blocks(self, seq_id: int, num_tokens: int) -> None:
        """Cache the sequence's full blocks of its first ``num_tokens`` tokens that are not yet
        (vLLM's ``cache_blocks``; no-op without a prefix cache)."""
        if self.prefix_cache is not None:
            seq = self._sequences[seq_id]
            end_block = min(num_tokens, seq.num_tokens) // self.block_size
            self.prefix_cache.cache_through(seq_id, seq.tables, end_block)

    def free_behind_windows(self, seq_id: int, *, num_processed_tokens: int | None = None) -> None:
        """Free each sliding group's blocks wholly behind its window now, the window placed as
        ``append`` places it. vLLM's ``allocate_slots`` does this before it tries to allocate,
        so the freed blocks join the free queue even when the allocation then fails (and the
        sequence is preempted): with a prefix cache, that order decides what is evicted first."""
        seq = self._sequences[seq_id]
        if num_processed_tokens is None:
            num_processed_tokens = self._computed_tokens(seq)
        for group, table in enumerate(seq.tables):
            end = self._skipped_blocks(group, num_processed_tokens, len(table))
            if seq.first_live[group] < end:
                self._free_behind_window(seq, group, seq.first_live[group], end)

    def try_append_round(self, seq_ids: list[int]) -> bool:
        """One ``append(seq_id, 1)`` for each of ``seq_ids`` in order, in one call, if none of
        them copies a shared last block and the free blocks cover every new block without
        counting the ones the round frees; False (nothing changes) otherwise. The single appends
        themselves, so the same blocks land in the same places."""
        sequences = self._sequences
        plans = [self._append_plan(sequences[seq_id], 1) for seq_id in seq_ids]
        if any(plan.copies[0] for plan in plans):
            return False
        if sum(plan.num_blocks_needed for plan in plans) > self._pool.num_free_blocks:
            return False
        for seq_id in seq_ids:
            appended = self.append(seq_id, 1)
            assert appended  # covered by the free blocks alone
        return True

    # --- the decoding requests, grown lazily (``RoundsAllocator``; ``hybrid_cohort``) --------

    def join_cohort(self, seq_ids: list[int]) -> bool:
        """``join_decoders`` with the windows placed as ``append`` places them by default."""
        return self.join_decoders(seq_ids, num_unprocessed_tokens=self._num_uncomputed_tokens)

    def join_decoders(self, seq_ids: list[int], *, num_unprocessed_tokens: int) -> bool:
        """Make the sequences (after the members, in running order) members of the decode
        cohort: from now on each ``advance_cohort`` round appends one token to each, in join
        order, as ``append(seq_id, 1, num_processed_tokens=num_tokens -
        num_unprocessed_tokens)`` would, until it leaves (``leave_cohort``, ``free``). False
        (nothing changes) with a prefix cache (rounds would cache blocks), a shared last block
        (a round would copy it) or a sequence past its final length (one that outputs no
        token)."""
        if self.prefix_cache is not None:
            return False
        sequences = self._sequences
        ref_counts = self._pool.ref_counts
        for seq_id in seq_ids:
            seq = sequences[seq_id]
            last_block = seq.tables[0][-1]
            assert last_block is not None  # a table's last block is never freed
            if seq.num_tokens > seq.final_tokens or ref_counts[last_block] > 1:
                return False
        for seq_id in seq_ids:
            seq = sequences[seq_id]
            self._untrack_partial(seq.tables[0][-1])  # the cohort counts its partial last block
            self._decoders.join(seq_id, seq, num_unprocessed_tokens)
        return True

    def cohort_next_round_blocks(self) -> int:
        """Free blocks the cohort's next round needs (``HybridDecodeCohort.round_need``)."""
        return self._decoders.round_need()

    def advance_cohort(self, num_rounds: int) -> None:
        """Run ``num_rounds`` rounds of the cohort (each checked with
        ``cohort_next_round_blocks``)."""
        self._decoders.advance(num_rounds)

    def leave_cohort(self, seq_ids: list[int]) -> None:
        """Take the sequences out of the cohort, their token counts written back."""
        for seq_id in seq_ids:
            self._track_last_blocks(self._decoders.leave(seq_id))

    def fork(self, parent_id: int, child_id: int) -> bool:
        """Make ``child_id`` share every live block of ``parent_id`` (always succeeds)."""
        if child_id in self._sequences:
            raise ValueError(f"sequence {child_id} is already allocated")
        self._check_not_in_cohort(parent_id)
        parent = self._sequences[parent_id]
        for block_id in self._live_blocks(parent):
            self._pool.incref(block_id)
        self._sequences[child_id] = _HybridSequence(
            request=parent.request,
            final_tokens=parent.final_tokens,
            num_tokens=parent.num_tokens,
            tables=[list(table) for table in parent.tables],
            first_live=list(parent.first_live),
        )
        self._num_logical_blocks += len(self._live_blocks(parent))
        if self.prefix_cache is not None:
            self.prefix_cache.forked(parent_id, child_id)
        return True

    def free(self, seq_id: int) -> None:
        """Drop the sequence's references, each group's tail first (vLLM frees in reverse)."""
        if seq_id in self._decoders:
            self.leave_cohort([seq_id])
        seq = self._sequences.pop(seq_id)
        for group, table in enumerate(seq.tables):
            live = [block_id for block_id in table[seq.first_live[group] :] if block_id is not None]
            self._num_logical_blocks -= len(live)
            self._release(live[::-1], group)
        key = seq.tables[0][-1] if seq.tables[0] else None
        if key is not None and self._pool.ref_count(key) == 0:
            self._untrack_partial(key)
        if self.prefix_cache is not None:
            self.prefix_cache.freed(seq_id)

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence currently holds (computed, or being computed)."""
        if seq_id in self._decoders:
            return self._decoders.num_tokens(seq_id)
        return self._sequences[seq_id].num_tokens

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Every block the sequence references, group by group, in table order (freed entries
        left out). One group (no layout): exactly its block table."""
        return tuple(self._live_blocks(self._sequences[seq_id]))

    def group_tables(self, seq_id: int) -> tuple[tuple[int | None, ...], ...]:
        """The sequence's block table in each group (None: freed behind the window)."""
        return tuple(tuple(table) for table in self._sequences[seq_id].tables)

    def group_held_tokens(self, seq_id: int) -> tuple[int, ...]:
        """Per group, the token slots of one layer the sequence's live blocks hold."""
        seq = self._sequences[seq_id]
        return tuple(
            sum(1 for block_id in table[first:] if block_id is not None) * self.block_size
            for table, first in zip(seq.tables, seq.first_live, strict=True)
        )

    def held_slots(self, seq_id: int) -> int:
        """Slots of the sequence's live blocks (padding layers included), rounded up."""
        num_live_blocks = len(self._live_blocks(self._sequences[seq_id]))
        return -(-num_live_blocks * self._block_layer_slots // self._num_layers)

    def ref_count(self, block_id: int) -> int:
        """Number of table entries that point at ``block_id``."""
        return self._pool.ref_count(block_id)

    def num_free_blocks(self) -> int:
        """Blocks free for new allocations."""
        return self._pool.num_free_blocks

    def num_held_blocks(self) -> int:
        """Blocks some sequence references (vLLM's pool less its free queue and null block)."""
        return self._pool.num_held_blocks

    def free_blocks(self) -> tuple[int, ...]:
        """The free block ids in the order they will be reused, head first (least recently
        freed first; with a prefix cache, the blocks vLLM holds no hash for before the others)."""
        return self._pool.free_queue()

    def take_copy_on_writes(self) -> list[tuple[int, int]]:
        """(src_block, dst_block) copies made since the last call, for the executor to perform."""
        copies, self._copies = self._copies, []
        return copies

    def usage(self) -> MemoryUsage:
        """The pool split into the paper's categories, in slots (module doc: the units)."""
        block_size = self.block_size
        group_size = self.layout.group_size
        held = self._held_blocks
        full_layer_slots = sum(
            num_layers * block_size * num_held
            for num_layers, num_held in zip(self._group_layers, held, strict=True)
        )
        padding_layer_slots = sum(
            (group_size - num_layers) * block_size * num_held
            for num_layers, num_held in zip(self._group_layers, held, strict=True)
        )
        # The decode cohort's partly filled last blocks, beside the other sequences'.
        decoders = self._decoders
        num_layers = self._num_layers
        partial_layer_slots = (self._partial_layer_slots
                               + num_layers * block_size * decoders.num_partial)  # fmt: skip
        partial_filled = self._partial_filled + num_layers * decoders.partial_filled_slots
        partial_usable = self._partial_usable + num_layers * (
            block_size * decoders.num_partial - decoders.internal_frag_slots
        )
        token_states = full_layer_slots - partial_layer_slots + partial_filled
        reservation = partial_usable - partial_filled
        internal_frag = partial_layer_slots - partial_usable + padding_layer_slots
        pool = self._pool
        free = pool.num_free_blocks * self._block_layer_slots
        external_frag = (
            self.num_slots * self._num_layers - pool.num_blocks * self._block_layer_slots
        )
        token_slots, reserved_slots, internal_slots, external_slots, free_slots = (
            _layer_slots_to_slots(
                [token_states, reservation, internal_frag, external_frag, free], self._num_layers
            )
        )
        return MemoryUsage(
            num_slots=self.num_slots,
            token_states=token_slots,
            reservation=reserved_slots,
            internal_frag=internal_slots,
            external_frag=external_slots,
            free=free_slots,
            shared_slots=pool.num_shared_blocks * self._block_layer_slots // self._num_layers,
            saved_slots=(self._num_logical_blocks - pool.num_held_blocks)
            * self._block_layer_slots
            // self._num_layers,
        )

    def _append_within_last_blocks(self, seq: _HybridSequence, num_processed_tokens: int) -> bool:
        """The common decode step, done in O(1) when it can be: one token into partially filled,
        unshared last blocks, with no block leaving a window placed after
        ``num_processed_tokens``. False (nothing done) otherwise."""
        num_tokens = seq.num_tokens
        block_size = self.block_size
        filled = num_tokens % block_size
        if not filled:
            return False  # the token starts a block in every group
        if self.prefix_cache is not None and filled + 1 == block_size:
            return False  # the blocks fill up: the general path caches them
        key = seq.tables[0][-1]
        assert key is not None
        if self._pool.ref_counts[key] > 1:
            return False  # shared: copy on write
        for group, window in self._sliding_groups:
            if max(0, num_processed_tokens - window + 1) // block_size > seq.first_live[group]:
                return False  # a block leaves this window
        old_filled, old_usable = self._partial[key]
        usable = min(max(seq.final_tokens, num_tokens + 1) - (num_tokens - filled), block_size)
        num_layers = self._num_layers
        if filled + 1 == block_size:  # the blocks fill up: no longer partial
            del self._partial[key]
            self._partial_layer_slots -= num_layers * block_size
            self._partial_filled -= num_layers * old_filled
            self._partial_usable -= num_layers * old_usable
        else:
            self._partial[key] = (old_filled + 1, usable)
            self._partial_filled += num_layers
            self._partial_usable += num_layers * (usable - old_usable)
        seq.num_tokens = num_tokens + 1
        return True

    # --- blocks --------------------------------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _prefix_hit(self, request: Request, num_tokens: int) -> HybridHit:
        """The prefix cache's hit for the sequence (none without a prefix cache)."""
        if self.prefix_cache is None:
            return HybridHit(0, ((),) * len(self._windows))
        return self.prefix_cache.lookup(request, num_tokens)

    def _admit_blocks(self, num_tokens: int, hit: HybridHit) -> int:
        """Free blocks an admission consumes: every group's missing blocks, plus the hits that
        are cached free blocks (reviving one takes it off the free queue too)."""
        num_new_blocks = (self._blocks_for(num_tokens) - hit.num_blocks) * len(self._windows)
        if not hit.num_blocks:
            return num_new_blocks
        ref_counts = self._pool.ref_counts
        num_free_hits = sum(
            1
            for leading in hit.group_blocks
            for block_id in leading
            if block_id is not None and ref_counts[block_id] == 0
        )
        return num_new_blocks + num_free_hits

    def _allocate(self, group: int, num_blocks: int) -> list[int]:
        """Take blocks from the pool (evicting what the prefix cache remembered of them)."""
        block_ids = self._pool.allocate_many(num_blocks)
        self._held_blocks[group] += num_blocks
        if self.prefix_cache is not None:
            self.prefix_cache.evict(block_ids)
        return block_ids

    def _reference(self, block_id: int, group: int) -> None:
        """One more reference to a cached block of ``group`` (reviving it if free)."""
        if self._pool.ref_counts[block_id] == 0:
            self._held_blocks[group] += 1
        self._pool.incref(block_id)

    def _release(self, block_ids: list[int], group: int) -> None:
        """Drop one reference to each block (of ``group``); count those that become free. With
        a prefix cache, in vLLM's free-queue order (hashed blocks last, the others first)."""
        before = self._pool.num_free_blocks
        cache = self.prefix_cache
        self._pool.release(block_ids, None if cache is None else cache.hashed_for_reuse)
        self._held_blocks[group] -= self._pool.num_free_blocks - before

    def _live_blocks(self, seq: _HybridSequence) -> list[int]:
        return [
            block_id
            for table, first in zip(seq.tables, seq.first_live, strict=True)
            for block_id in table[first:]
            if block_id is not None
        ]

    def _skipped_blocks(self, group: int, num_computed_tokens: int, num_table_blocks: int) -> int:
        """Leading blocks wholly behind the window once ``num_computed_tokens`` are computed:
        the next token attends to the last ``window`` tokens, itself included."""
        window = self._windows[group]
        if window is None:
            return 0
        num_skipped_tokens = max(0, num_computed_tokens - window + 1)
        return min(num_skipped_tokens // self.block_size, num_table_blocks)

    def _computed_tokens(self, seq: _HybridSequence) -> int:
        """The sequence's tokens whose K/V is computed when it next grows (class doc)."""
        return max(0, seq.num_tokens - self._num_uncomputed_tokens)

    def _append_plan(
        self, seq: _HybridSequence, num_tokens: int, num_processed_tokens: int | None = None
    ) -> _AppendPlan:
        if num_processed_tokens is None:
            num_processed_tokens = self._computed_tokens(seq)
        freed = []
        num_new_blocks = []
        copies = []
        num_released = 0
        ref_counts = self._pool.ref_counts
        partial = seq.num_tokens % self.block_size != 0
        num_blocks_after = self._blocks_for(seq.num_tokens + num_tokens)
        for group, table in enumerate(seq.tables):
            end = self._skipped_blocks(group, num_processed_tokens, len(table)) if num_tokens else 0
            first = min(seq.first_live[group], end)
            freed.append((first, end))
            num_released += sum(
                1
                for block_id in table[first:end]
                if block_id is not None and ref_counts[block_id] == 1
            )
            num_new_blocks.append(num_blocks_after - len(table))
            last = table[-1] if table else None
            copies.append(num_tokens > 0 and partial and last is not None and ref_counts[last] > 1)
        return _AppendPlan(tuple(freed), tuple(num_new_blocks), tuple(copies), num_released)

    def _free_behind_window(self, seq: _HybridSequence, group: int, first: int, end: int) -> None:
        table = seq.tables[group]
        behind = [block_id for block_id in table[first:end] if block_id is not None]
        for index in range(first, end):
            table[index] = None
        seq.first_live[group] = max(seq.first_live[group], end)
        self._num_logical_blocks -= len(behind)
        self._release(behind[::-1], group)  # the newest first, as vLLM frees the range

    def _check_not_in_cohort(self, seq_id: int) -> None:
        if seq_id in self._decoders:
            raise RuntimeError("the sequence is in the cohort: leave_cohort first")

    def _start_blocks(self, seq: _HybridSequence) -> None:
        """A new block in every group, in group order (a token that starts a block)."""
        for group, table in enumerate(seq.tables):
            table += self._allocate(group, 1)
        self._num_logical_blocks += len(seq.tables)

    def _copy_last_block(self, table: list[int | None], group: int) -> None:
        source_block = table[-1]
        assert source_block is not None  # a table's last block is never freed
        [copy_block] = self._allocate(group, 1)
        self._release([source_block], group)  # the other sharers keep it
        table[-1] = copy_block
        self._copies.append((source_block, copy_block))
        self.num_copy_on_writes += 1

    # --- partial last blocks -------------------------------------------------------------------

    def _track_last_blocks(self, seq: _HybridSequence) -> None:
        filled = seq.num_tokens % self.block_size
        if filled == 0:
            return  # no block, or every last block is full
        first_token = seq.num_tokens - filled
        usable = min(max(seq.final_tokens, seq.num_tokens) - first_token, self.block_size)
        key = seq.tables[0][-1]
        assert key is not None  # a table's last block is never freed
        self._untrack_partial(key)
        num_layers = self._num_layers
        self._partial[key] = (filled, usable)
        self._partial_layer_slots += num_layers * self.block_size
        self._partial_filled += num_layers * filled
        self._partial_usable += num_layers * usable

    def _untrack_partial(self, key: int | None) -> None:
        if key is None or key not in self._partial:
            return
        filled, usable = self._partial.pop(key)
        num_layers = self._num_layers
        self._partial_layer_slots -= num_layers * self.block_size
        self._partial_filled -= num_layers * filled
        self._partial_usable -= num_layers * usable


def _layer_slots_to_slots(parts: list[int], num_layers: int) -> list[int]:
    """Layer-slot counts as slots of ``num_layers`` layers, rounding their running sums down:
    each part is within one slot of its exact share and the parts add up to the total's."""
    slots = []
    running = 0
    rounded_before = 0
    for part in parts:
        running += part
        rounded = running // num_layers
        slots.append(rounded - rounded_before)
        rounded_before = rounded
    return slots
