"""PagedAttention's allocator (vLLM): block tables over a pool of fixed-size blocks.

Blocks are allocated on demand, one when the last one fills up, so a sequence wastes at most one
partial block. ``fork`` shares all of the parent's blocks (parallel sampling, beam search); the
first write into a shared, partially filled block copies it (copy-on-write). Given a
``PrefixCache`` (``enable_prefix_caching``, the registry's ``paged_prefix``), it also shares
identical prompt prefixes across requests, as vLLM's automatic prefix caching does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.allocators.base import CohortRounds, MemoryUsage, check_token_count
from kvbench.allocators.block_pool import BlockPool
from kvbench.allocators.cohort import Cohort
from kvbench.allocators.prefix_cache import PrefixCache
from kvbench.core.request import Request


@dataclass(slots=True, eq=False)  # identity: the cohort finds members by it
class _PagedSequence:
    """One sequence's block table and token count (``cohort_offset + round`` while it is in the
    cohort: then ``num_tokens`` is stale)."""

    request: Request
    final_tokens: int  # the request's true final length, capped at max_model_len
    num_tokens: int
    blocks: list[int]
    cohort_offset: int | None = None


class PagedAllocator:
    """Per-sequence block tables over a ``BlockPool`` of ``num_slots // block_size`` blocks.

    ``enable_prefix_caching`` gives it a ``PrefixCache`` (``prefix_cache``; None without): an
    admission then references the pool's blocks of its prompt prefix instead of allocating them,
    and freed prompt blocks stay cached until the pool reuses them; ``cpu_cache_blocks`` > 0
    gives that cache a CPU tier of as many blocks for the blocks the pool evicts.
    """

    forks_share_blocks = True  # a fork references the parent's blocks: no new block, no failure

    def __init__(
        self,
        num_slots: int,
        block_size: int,
        max_model_len: int,
        *,
        enable_prefix_caching: bool = False,
        cpu_cache_blocks: int = 0,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size}: must be >= 1")
        if num_slots < 0:
            raise ValueError(f"num_slots={num_slots}: must be >= 0")
        self.num_slots = num_slots
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.name = "paged_prefix" if enable_prefix_caching else "paged"
        self.num_copy_on_writes = 0
        self.prefix_cache = (
            PrefixCache(block_size, cpu_cache_blocks) if enable_prefix_caching else None
        )
        # A prefix hit revives a cached free block: only then does the pool need the queue that
        # blocks can leave from the middle.
        self._pool = BlockPool(num_slots // block_size, revivable=enable_prefix_caching)
        self._sequences: dict[int, _PagedSequence] = {}
        self._copies: list[tuple[int, int]] = []
        self._num_logical_blocks = 0  # block-table entries over all sequences
        # Only the last block of a sequence can be partially filled; every other held block is
        # all token states. Tracking the partial ones, physical block -> (filled slots, slots the
        # request will fill), makes usage() O(1). Sharers of a partial block are forks of one
        # request with equal token counts, so one entry describes them all.
        self._partial_blocks: dict[int, tuple[int, int]] = {}
        self._partial_filled_slots = 0
        self._partial_usable_slots = 0
        # Sequences the engine advances a token per round lazily (their last blocks untracked).
        self._cohort = Cohort(block_size, self._allocate_blocks)

    def can_admit(self, request: Request, num_tokens: int) -> bool:
        """Whether ``admit`` would succeed now, without changing anything (counting only the
        blocks the prefix cache lacks)."""
        check_token_count(num_tokens)
        hits = self._prefix_hits(request, num_tokens)
        return self._admit_blocks_needed(num_tokens, hits) <= self._pool.num_free_blocks

    def admit(self, seq_id: int, request: Request, num_tokens: int) -> bool:
        """Give a new sequence ``ceil(num_tokens / block_size)`` blocks, the prefix cache's hits
        first; False if no room."""
        self._check_new(seq_id)
        check_token_count(num_tokens)
        hits = self._prefix_hits(request, num_tokens)
        if self._admit_blocks_needed(num_tokens, hits) > self._pool.num_free_blocks:
            return False
        num_cpu_blocks = 0
        if self.prefix_cache is not None:  # the CPU tier's blocks load into fresh blocks
            num_cpu_blocks = self.prefix_cache.cpu_hits(request, num_tokens, len(hits))
            self.prefix_cache.take_from_cpu(request, len(hits), num_cpu_blocks)
        # Reference the hits before allocating, so that allocation cannot evict them.
        for block_id in hits:
            self._pool.incref(block_id)
        seq = self._add_sequence(seq_id, request, num_tokens, hits)
        if self.prefix_cache is not None:
            self.prefix_cache.admitted(
                seq_id, request, hits, seq.blocks, num_tokens, num_cpu_blocks
            )
        return True

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether ``append`` would succeed now, without changing anything."""
        check_token_count(num_tokens)
        num_new_blocks, needs_copy = self._append_plan(self._sequences[seq_id], num_tokens)
        return num_new_blocks + needs_copy <= self._pool.num_free_blocks

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Grow the sequence, copying a shared last block first (the prefix cache, if any,
        caches the prompt blocks it fills). False if no room (no change)."""
        check_token_count(num_tokens)
        seq = self._sequences[seq_id]
        self._check_not_in_cohort(seq)
        num_new_blocks, needs_copy = self._append_plan(seq, num_tokens)
        if num_new_blocks + needs_copy > self._pool.num_free_blocks:
            return False
        if num_tokens == 0:
            return True
        num_full_blocks = seq.num_tokens // self.block_size
        if needs_copy:
            self._copy_last_block(seq)
        elif seq.blocks:
            self._untrack_partial(seq.blocks[-1])  # it is about to fill further
        if num_new_blocks:
            seq.blocks += self._allocate_blocks(num_new_blocks)
        self._num_logical_blocks += num_new_blocks
        seq.num_tokens += num_tokens
        self._track_last_block(seq)
        num_full_blocks_now = seq.num_tokens // self.block_size
        # Only a block that just filled can be cached.
        if self.prefix_cache is not None and num_full_blocks_now > num_full_blocks:
            self.prefix_cache.cache_full_blocks(
                seq_id, seq.blocks, num_full_blocks, num_full_blocks_now
            )
        return True

    def try_append_round(self, seq_ids: list[int]) -> bool:
        """One ``append(seq_id, 1)`` for each of ``seq_ids`` in order, in one call, if none of
        them needs a copy-on-write or could fill a prompt block the prefix cache would hash, and
        the pool has a block for each that starts one; False (nothing changes) otherwise. The same
        blocks in the same places as the single appends."""
        if self.prefix_cache is not None and self._may_fill_hashed_block(seq_ids):
            return False
        block_size = self.block_size
        sequences = self._sequences
        ref_counts = self._pool.ref_counts
        seqs = [sequences[seq_id] for seq_id in seq_ids]
        starters = []  # the sequences whose token starts a block, in order: they take them so
        for seq in seqs:
            if seq.num_tokens % block_size == 0:
                starters.append(seq)
            elif ref_counts[seq.blocks[-1]] > 1:
                return False
        if len(starters) > self._pool.num_free_blocks:
            return False
        # _untrack_partial / _track_last_block, inlined: this runs for every iteration that
        # goes step by step.
        partial_blocks = self._partial_blocks
        filled_total = self._partial_filled_slots
        usable_total = self._partial_usable_slots
        for seq in seqs:
            if seq.num_tokens % block_size:  # only a partial last block is tracked
                filled_slots, usable_slots = partial_blocks.pop(seq.blocks[-1])
                filled_total -= filled_slots
                usable_total -= usable_slots
        if starters:
            for seq, block_id in zip(
                starters, self._allocate_blocks(len(starters)), strict=True
            ):
                seq.blocks.append(block_id)
            self._num_logical_blocks += len(starters)
        for seq in seqs:
            num_tokens = seq.num_tokens + 1
            seq.num_tokens = num_tokens
            filled_slots = num_tokens % block_size
            if filled_slots:
                final_tokens = seq.final_tokens
                if final_tokens < num_tokens:
                    final_tokens = num_tokens
                usable_slots = final_tokens - num_tokens + filled_slots
                if usable_slots > block_size:
                    usable_slots = block_size
                partial_blocks[seq.blocks[-1]] = (filled_slots, usable_slots)
                filled_total += filled_slots
                usable_total += usable_slots
        self._partial_filled_slots = filled_total
        self._partial_usable_slots = usable_total
        return True

    def join_cohort(self, seq_ids: list[int]) -> bool:
        """Let ``advance_cohort`` append a token per round to each of ``seq_ids`` (in this order,
        after the members already in), if none of them is about to copy a shared last block or
        could still fill a prompt block the prefix cache would hash (single appends would cache
        it); False (nothing changes) otherwise. Their token counts are then held lazily. Cohort
        rounds take their blocks through ``_allocate_blocks``, so they evict cached blocks as
        single appends do."""
        if self.prefix_cache is not None and self._may_fill_hashed_block(seq_ids):
            return False
        block_size = self.block_size
        ref_counts = self._pool.ref_counts
        members = [self._sequences[seq_id] for seq_id in seq_ids]
        for seq in members:
            if seq.cohort_offset is not None:
                raise ValueError("the sequence is already in the cohort")
            if seq.num_tokens > seq.final_tokens or (
                seq.num_tokens % block_size and ref_counts[seq.blocks[-1]] > 1
            ):
                return False
        for seq in members:
            if seq.num_tokens % block_size:
                self._untrack_partial(seq.blocks[-1])  # the cohort counts its unfilled slots
            self._cohort.join(seq)
        return True

    def leave_cohort(self, seq_ids: list[int]) -> None:
        """Take the sequences out of the cohort (their token counts written back)."""
        for seq_id in seq_ids:
            seq = self._sequences[seq_id]
            self._cohort.leave(seq)
            self._track_last_block(seq)

    def cohort_next_round_blocks(self) -> int:
        """Blocks the cohort's next round takes."""
        return self._cohort.next_round_blocks()

    def cohort_rounds(self) -> CohortRounds:
        """The blocks and internal fragmentation of the cohort's next rounds."""
        return self._cohort.rounds()

    def advance_cohort(self, num_rounds: int) -> None:
        """Append ``num_rounds`` tokens to every cohort member: the state that as many rounds of
        ``append(seq_id, 1)`` over the members in join order would leave. The caller has checked
        the free blocks against ``cohort_rounds``."""
        self._num_logical_blocks += self._cohort.advance(num_rounds)

    def num_free_blocks(self) -> int:
        """Blocks in the free queue."""
        return self._pool.num_free_blocks

    def fork(self, parent_id: int, child_id: int) -> bool:
        """Make ``child_id`` share every block of ``parent_id`` (always succeeds: no new block)."""
        self._check_new(child_id)
        parent = self._sequences[parent_id]
        self._check_not_in_cohort(parent)
        for block_id in parent.blocks:
            self._pool.incref(block_id)
        self._sequences[child_id] = _PagedSequence(
            request=parent.request,
            final_tokens=parent.final_tokens,
            num_tokens=parent.num_tokens,
            blocks=list(parent.blocks),
        )
        self._num_logical_blocks += len(parent.blocks)
        if self.prefix_cache is not None:
            self.prefix_cache.forked(parent_id, child_id)
        return True

    def free(self, seq_id: int) -> None:
        """Drop the sequence's references; blocks nobody else holds return to the free queue
        (hashed ones stay cached there until the pool reuses them)."""
        seq = self._sequences.pop(seq_id)
        if seq.cohort_offset is not None:
            self._cohort.leave(seq)
        self._num_logical_blocks -= len(seq.blocks)
        # Tail first, so the end of a sequence is reused (evicted) before its prefix (as vLLM).
        self._pool.release(seq.blocks[::-1])
        # Only a last block can be partial (tracked); it is untracked once nobody holds it.
        if seq.blocks and self._pool.ref_count(seq.blocks[-1]) == 0:
            self._untrack_partial(seq.blocks[-1])
        if self.prefix_cache is not None:
            self.prefix_cache.freed(seq_id)

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence currently holds."""
        seq = self._sequences[seq_id]
        if seq.cohort_offset is not None:
            return seq.cohort_offset + self._cohort.round_index
        return seq.num_tokens

    def held_slots(self, seq_id: int) -> int:
        """Slots of the blocks in the sequence's table (shared ones included)."""
        return len(self._sequences[seq_id].blocks) * self.block_size

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Physical block ids of the sequence, in order."""
        return tuple(self._sequences[seq_id].blocks)

    def free_blocks(self) -> tuple[int, ...]:
        """The free block ids in the order they will be reused (least recently freed first)."""
        return self._pool.free_queue()

    def ref_count(self, block_id: int) -> int:
        """Number of block-table entries that point at ``block_id``."""
        return self._pool.ref_count(block_id)

    def take_copy_on_writes(self) -> list[tuple[int, int]]:
        """(src_block, dst_block) copies made since the last call, for the executor to perform."""
        copies, self._copies = self._copies, []
        return copies

    def usage(self) -> MemoryUsage:
        """The pool split into the paper's categories (definitions in docs/metrics.md)."""
        num_partial_blocks = len(self._partial_blocks)
        num_held_blocks = self._pool.num_held_blocks
        num_full_blocks = num_held_blocks - num_partial_blocks  # and the cohort's last blocks
        cohort_unfilled = self._cohort.num_unfilled_slots
        cohort_frag = self._cohort.internal_frag_slots
        return MemoryUsage(
            num_slots=self.num_slots,
            token_states=(
                num_full_blocks * self.block_size + self._partial_filled_slots - cohort_unfilled
            ),
            reservation=(
                self._partial_usable_slots - self._partial_filled_slots
                + cohort_unfilled - cohort_frag
            ),
            internal_frag=(
                num_partial_blocks * self.block_size - self._partial_usable_slots + cohort_frag
            ),
            external_frag=self.num_slots - self._pool.num_blocks * self.block_size,
            free=self._pool.num_free_blocks * self.block_size,
            shared_slots=self._pool.num_shared_blocks * self.block_size,
            saved_slots=(self._num_logical_blocks - num_held_blocks) * self.block_size,
        )

    def _add_sequence(
        self, seq_id: int, request: Request, num_tokens: int, leading_blocks: list[int]
    ) -> _PagedSequence:
        """Register a sequence whose table is ``leading_blocks`` plus fresh blocks for the rest."""
        num_new_blocks = self._blocks_for(num_tokens) - len(leading_blocks)
        seq = _PagedSequence(
            request=request,
            final_tokens=min(request.total_tokens, self.max_model_len),
            num_tokens=num_tokens,
            blocks=leading_blocks + self._allocate_blocks(num_new_blocks),
        )
        self._sequences[seq_id] = seq
        self._num_logical_blocks += len(seq.blocks)
        self._track_last_block(seq)
        return seq

    def _allocate_blocks(self, num_blocks: int) -> list[int]:
        """Take blocks from the pool (evicting what the prefix cache remembered of them)."""
        block_ids = self._pool.allocate_many(num_blocks)
        if self.prefix_cache is not None:
            self.prefix_cache.evict(block_ids)
        return block_ids

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _prefix_hits(self, request: Request, num_tokens: int) -> list[int]:
        """The pool blocks the prefix cache holds for the sequence's leading blocks (none
        without a prefix cache)."""
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.lookup(request, num_tokens)

    def _admit_blocks_needed(self, num_tokens: int, hits: list[int]) -> int:
        """Free blocks an admission consumes: the missing blocks, plus the hits that are cached
        free blocks (reviving one takes it off the free queue too)."""
        if not hits:  # the common case, and every admission without a prefix cache
            return self._blocks_for(num_tokens)
        ref_counts = self._pool.ref_counts
        num_free_hits = sum(1 for block_id in hits if ref_counts[block_id] == 0)
        return self._blocks_for(num_tokens) - len(hits) + num_free_hits

    def _may_fill_hashed_block(self, seq_ids: list[int]) -> bool:
        """Whether a token appended to one of the sequences could complete a prompt block the
        prefix cache hashes (it then has to see the append)."""
        assert self.prefix_cache is not None
        hashes_of_seq = self.prefix_cache.hashes_of_seq
        block_size = self.block_size
        sequences = self._sequences
        return any(
            len(hashes_of_seq[seq_id]) > sequences[seq_id].num_tokens // block_size
            for seq_id in seq_ids
        )

    def _append_plan(self, seq: _PagedSequence, num_tokens: int) -> tuple[int, bool]:
        """(new blocks, whether the last block must be copied first) to append ``num_tokens``:
        a copy when the next token lands in a partially filled block that others share."""
        num_new_blocks = self._blocks_for(seq.num_tokens + num_tokens) - len(seq.blocks)
        needs_copy = (
            num_tokens > 0
            and seq.num_tokens % self.block_size != 0
            and self._pool.ref_count(seq.blocks[-1]) > 1
        )
        return num_new_blocks, needs_copy

    def _copy_last_block(self, seq: _PagedSequence) -> None:
        source_block = seq.blocks[-1]
        [copy_block] = self._allocate_blocks(1)
        self._pool.decref(source_block)  # the other sharers keep it
        seq.blocks[-1] = copy_block
        self._copies.append((source_block, copy_block))
        self.num_copy_on_writes += 1

    def _track_last_block(self, seq: _PagedSequence) -> None:
        filled_slots = seq.num_tokens % self.block_size
        if filled_slots == 0:
            return  # no block, or the last one is full
        first_token = seq.num_tokens - filled_slots
        final_tokens = max(seq.final_tokens, seq.num_tokens)
        usable_slots = min(final_tokens - first_token, self.block_size)
        block_id = seq.blocks[-1]
        self._untrack_partial(block_id)
        self._partial_blocks[block_id] = (filled_slots, usable_slots)
        self._partial_filled_slots += filled_slots
        self._partial_usable_slots += usable_slots

    def _untrack_partial(self, block_id: int) -> None:
        filled_slots, usable_slots = self._partial_blocks.pop(block_id, (0, 0))
        self._partial_filled_slots -= filled_slots
        self._partial_usable_slots -= usable_slots

    def _check_not_in_cohort(self, seq: _PagedSequence) -> None:
        if seq.cohort_offset is not None:
            raise RuntimeError("the sequence is in the cohort: leave_cohort first")

    def _check_new(self, seq_id: int) -> None:
        if seq_id in self._sequences:
            raise ValueError(f"sequence {seq_id} is already allocated")
