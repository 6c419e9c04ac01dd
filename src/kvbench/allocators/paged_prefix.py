"""Paged allocation plus prefix sharing (vLLM's automatic prefix caching).

On top of ``PagedAllocator`` (block tables, fork sharing, copy-on-write): every full prompt block
whose tokens are known gets a chained hash (``prefix_hashes``); a new sequence whose leading
blocks hash like blocks already in the pool references them (ref count + 1) instead of allocating.
Freed blocks keep their hash while they wait in the free queue (a "cached free" block, still
counted as free), so a later request can revive them; when the pool needs a block it takes the
least recently freed one and forgets its hash (LRU eviction).
"""

from __future__ import annotations

from kvbench.allocators.block_pool import BlockPool, RevivableBlockPool
from kvbench.allocators.checks import check_token_count
from kvbench.allocators.paged import PagedAllocator
from kvbench.allocators.prefix_hashes import prompt_block_hashes
from kvbench.core.request import Request


class PagedPrefixAllocator(PagedAllocator):
    """``PagedAllocator`` that shares identical prompt prefixes across requests."""

    name = "paged_prefix"

    def __init__(self, num_slots: int, block_size: int, max_model_len: int) -> None:
        super().__init__(num_slots, block_size, max_model_len)
        self.num_hit_blocks = 0  # blocks admissions found in the pool instead of allocating
        self.num_evicted_blocks = 0  # cached free blocks reused for other content
        self._block_of_hash: dict[int, int] = {}
        self._hash_of_block: dict[int, int] = {}
        self._hashes_of_seq: dict[int, tuple[int, ...]] = {}
        self._cached_tokens_of_seq: dict[int, int] = {}
        # The engine asks can_admit and then admit for the same request: hash its prompt once.
        self._last_hashed: tuple[Request, tuple[int, ...]] | None = None

    def _new_pool(self, num_blocks: int) -> BlockPool:
        return RevivableBlockPool(num_blocks)  # a prefix hit revives a cached free block

    def can_admit(self, request: Request, num_tokens: int) -> bool:
        """Whether ``admit`` would succeed now, counting only the blocks the cache lacks."""
        check_token_count(num_tokens)
        hits = self._prefix_hits(self._prompt_hashes(request), num_tokens)
        return self._admit_blocks_needed(num_tokens, hits) <= self._pool.num_free_blocks

    def admit(self, seq_id: int, request: Request, num_tokens: int) -> bool:
        """Allocate a new sequence, reusing the pool's blocks of its prefix. False if no room."""
        self._check_new(seq_id)
        check_token_count(num_tokens)
        block_hashes = self._prompt_hashes(request)
        hits = self._prefix_hits(block_hashes, num_tokens)
        if self._admit_blocks_needed(num_tokens, hits) > self._pool.num_free_blocks:
            return False
        # Reference the hits before allocating, so that allocation cannot evict them.
        for block_id in hits:
            self._pool.incref(block_id)
        self.num_hit_blocks += len(hits)
        self._add_sequence(seq_id, request, num_tokens, hits)
        self._hashes_of_seq[seq_id] = block_hashes
        self._cached_tokens_of_seq[seq_id] = len(hits) * self.block_size
        self._register_full_blocks(seq_id, len(hits), num_tokens // self.block_size)
        return True

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Grow the sequence (see ``PagedAllocator.append``); prompt blocks it fills get cached."""
        seq = self._sequences[seq_id]
        num_full_blocks = seq.num_tokens // self.block_size
        if not super().append(seq_id, num_tokens):
            return False
        num_full_blocks_now = seq.num_tokens // self.block_size
        if num_full_blocks_now > num_full_blocks:  # only a block that just filled can be cached
            self._register_full_blocks(seq_id, num_full_blocks, num_full_blocks_now)
        return True

    def try_append_round(self, seq_ids: list[int]) -> bool:
        """See ``PagedAllocator.try_append_round``; False also when a sequence could fill a
        hashed prompt block."""
        return not self._may_fill_hashed_block(seq_ids) and super().try_append_round(seq_ids)

    def join_cohort(self, seq_ids: list[int]) -> bool:
        """See ``PagedAllocator.join_cohort``; False also when a sequence could still fill a
        hashed prompt block (single appends would cache it). Cohort rounds take their blocks
        through ``_allocate_blocks``, so they evict cached blocks as single appends do."""
        return not self._may_fill_hashed_block(seq_ids) and super().join_cohort(seq_ids)

    def _may_fill_hashed_block(self, seq_ids: list[int]) -> bool:
        block_size = self.block_size
        return any(
            len(self._hashes_of_seq[seq_id]) > self._sequences[seq_id].num_tokens // block_size
            for seq_id in seq_ids
        )

    def fork(self, parent_id: int, child_id: int) -> bool:
        """Share every block of the parent (see ``PagedAllocator.fork``)."""
        super().fork(parent_id, child_id)
        self._hashes_of_seq[child_id] = self._hashes_of_seq[parent_id]
        self._cached_tokens_of_seq[child_id] = 0
        return True

    def free(self, seq_id: int) -> None:
        """Release the sequence; its hashed blocks stay cached while they wait in the free queue."""
        super().free(seq_id)
        del self._hashes_of_seq[seq_id]
        del self._cached_tokens_of_seq[seq_id]

    def cached_prefix_tokens(self, seq_id: int) -> int:
        """Leading tokens whose blocks the sequence found in the pool at admission: their KV is
        already there, so prefill need not compute them (0 for a forked sequence)."""
        return self._cached_tokens_of_seq[seq_id]

    def _prompt_hashes(self, request: Request) -> tuple[int, ...]:
        if self._last_hashed is None or self._last_hashed[0] is not request:
            self._last_hashed = (request, prompt_block_hashes(request, self.block_size))
        return self._last_hashed[1]

    def _prefix_hits(self, block_hashes: tuple[int, ...], num_tokens: int) -> list[int]:
        """Pool blocks holding the sequence's leading full blocks, up to the first miss."""
        hits = []
        for block_hash in block_hashes[: num_tokens // self.block_size]:
            block_id = self._block_of_hash.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _admit_blocks_needed(self, num_tokens: int, hits: list[int]) -> int:
        """Free blocks an admission consumes: the missing blocks, plus the hits that are cached
        free blocks (reviving one takes it off the free queue too)."""
        num_free_hits = sum(1 for block_id in hits if self._pool.ref_count(block_id) == 0)
        return self._blocks_for(num_tokens) - len(hits) + num_free_hits

    def _register_full_blocks(self, seq_id: int, first_block: int, end_block: int) -> None:
        """Cache the hashes of the sequence's blocks ``[first_block, end_block)`` (all full).

        A hash already cached for another block keeps that block (duplicates are not merged).
        """
        block_hashes = self._hashes_of_seq[seq_id]
        blocks = self._sequences[seq_id].blocks
        for block_index in range(first_block, min(end_block, len(block_hashes))):
            block_hash = block_hashes[block_index]
            block_id = blocks[block_index]
            if block_hash not in self._block_of_hash and block_id not in self._hash_of_block:
                self._block_of_hash[block_hash] = block_id
                self._hash_of_block[block_id] = block_hash

    def _allocate_block(self) -> int:
        block_id = self._pool.allocate()
        self._forget_hash(block_id)
        return block_id

    def _allocate_blocks(self, num_blocks: int) -> list[int]:
        block_ids = self._pool.allocate_many(num_blocks)
        if self._hash_of_block:
            for block_id in block_ids:
                self._forget_hash(block_id)
        return block_ids

    def _forget_hash(self, block_id: int) -> None:
        """A cached free block is being reused for other content: evict its hash."""
        evicted_hash = self._hash_of_block.pop(block_id, None)
        if evicted_hash is not None:
            del self._block_of_hash[evicted_hash]
            self.num_evicted_blocks += 1
