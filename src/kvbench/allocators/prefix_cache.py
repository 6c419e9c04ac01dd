"""Automatic prefix caching (vLLM's), the component a paged allocator is given to share prompts.

Every full prompt block whose tokens are known gets a chained hash (``prefix_hashes``); a new
sequence whose leading blocks hash like blocks already in the pool references them (ref count + 1)
instead of allocating. Freed blocks keep their hash while they wait in the free queue (a "cached
free" block, still counted as free), so a later request can revive them; when the pool hands a
block out for other content, its hash is forgotten (LRU eviction: the pool reuses the least
recently freed block first).

The cache only maps hashes to block ids and remembers each sequence's hashes; the allocator owns
the blocks and the pool, and tells the cache what it admitted, filled, forked, freed and reused.

With a CPU tier (``cpu_cache_blocks`` > 0, vLLM's CPU offloading / LMCache), an evicted block's
hash moves to an LRU set of that many blocks in CPU memory instead of being forgotten; an
admission whose GPU hits end where the CPU tier continues the chain loads those blocks back into
fresh pool blocks (they leave the CPU tier: the tiers are exclusive), and the engine prices the
copy over PCIe (``loaded_prefix_tokens``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from kvbench.allocators.prefix_hashes import RecentPromptHashes
from kvbench.core.request import Request

# Requests whose prompt hashes the cache keeps (the lpm policy's waiting queue, at most).
RECENT_REQUESTS = 1024


class PrefixCache:
    """Block hash -> pool block for the blocks of ``block_size`` tokens a paged allocator holds
    or keeps cached free.

    Attributes:
        num_hit_blocks: blocks admissions found in the pool instead of allocating.
        num_evicted_blocks: cached free blocks reused for other content.
        num_cpu_hit_blocks: blocks admissions loaded back from the CPU tier.
    """

    def __init__(self, block_size: int, cpu_cache_blocks: int = 0) -> None:
        if cpu_cache_blocks < 0:
            raise ValueError(f"cpu_cache_blocks={cpu_cache_blocks}: must be >= 0")
        self.block_size = block_size
        self.cpu_cache_blocks = cpu_cache_blocks
        self.num_hit_blocks = 0
        self.num_cpu_hit_blocks = 0
        self.num_evicted_blocks = 0
        self._cpu_hashes: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._loaded_tokens_of_seq: dict[int, int] = {}
        self._block_of_hash: dict[int, int] = {}
        self._hash_of_block: dict[int, int] = {}
        self._hashes_of_seq: dict[int, tuple[int, ...]] = {}
        self._cached_tokens_of_seq: dict[int, int] = {}
        # The engine asks can_admit and then admit for the same request: hash its prompt once.
        self._last_hashed: tuple[Request, tuple[int, ...]] | None = None
        self._recent_hashes = RecentPromptHashes(block_size, RECENT_REQUESTS)

    def lookup(self, request: Request, num_tokens: int) -> list[int]:
        """Pool blocks holding the leading full blocks of a sequence of ``num_tokens`` tokens of
        ``request``, up to the first miss (cached free blocks included)."""
        block_of_hash = self._block_of_hash
        hits = []
        for block_hash in self._prompt_hashes(request)[: num_tokens // self.block_size]:
            block_id = block_of_hash.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def match_tokens(self, request: Request, num_tokens: int) -> int:
        """Leading tokens of a sequence of ``num_tokens`` tokens of ``request`` whose blocks the
        pool holds now (``lookup``'s hits), without changing anything."""
        num_gpu_blocks = len(self.lookup(request, num_tokens))
        num_cpu_blocks = self.cpu_hits(request, num_tokens, num_gpu_blocks)
        return (num_gpu_blocks + num_cpu_blocks) * self.block_size

    def cpu_hits(self, request: Request, num_tokens: int, first_block: int) -> int:
        """Leading blocks from ``first_block`` on (where the GPU hits end) that the CPU tier
        holds, up to its first miss."""
        if not self._cpu_hashes:
            return 0
        cpu_hashes = self._cpu_hashes
        hashes = self._prompt_hashes(request)[first_block : num_tokens // self.block_size]
        num_hits = 0
        for block_hash in hashes:
            if block_hash not in cpu_hashes:
                break
            num_hits += 1
        return num_hits

    def take_from_cpu(self, request: Request, first_block: int, num_blocks: int) -> None:
        """The ``num_blocks`` blocks from ``first_block`` on, which ``cpu_hits`` found, leave the
        CPU tier for the GPU (before the pool allocates, so its evictions cannot drop them)."""
        for block_hash in self._prompt_hashes(request)[first_block : first_block + num_blocks]:
            del self._cpu_hashes[block_hash]

    def admitted(
        self,
        seq_id: int,
        request: Request,
        hits: list[int],
        blocks: list[int],
        num_tokens: int,
        num_cpu_blocks: int = 0,
    ) -> None:
        """A new sequence whose table ``blocks`` starts with the ``hits`` ``lookup`` found, then
        ``num_cpu_blocks`` blocks loaded from the CPU tier, and holds ``num_tokens`` tokens:
        remember its hashes and cache its full blocks."""
        self.num_hit_blocks += len(hits)
        self.num_cpu_hit_blocks += num_cpu_blocks
        self._hashes_of_seq[seq_id] = self._prompt_hashes(request)
        self._cached_tokens_of_seq[seq_id] = (len(hits) + num_cpu_blocks) * self.block_size
        self._loaded_tokens_of_seq[seq_id] = num_cpu_blocks * self.block_size
        self.cache_full_blocks(seq_id, blocks, len(hits), num_tokens // self.block_size)

    def cache_full_blocks(
        self, seq_id: int, blocks: list[int], first_block: int, end_block: int
    ) -> None:
        """Cache the hashes of the sequence's blocks ``[first_block, end_block)`` (all full).

        A hash already cached for another block keeps that block (duplicates are not merged).
        """
        block_hashes = self._hashes_of_seq[seq_id]
        for block_index in range(first_block, min(end_block, len(block_hashes))):
            block_hash = block_hashes[block_index]
            block_id = blocks[block_index]
            if block_hash not in self._block_of_hash and block_id not in self._hash_of_block:
                self._block_of_hash[block_hash] = block_id
                self._hash_of_block[block_id] = block_hash

    @property
    def hashes_of_seq(self) -> Mapping[int, tuple[int, ...]]:
        """Sequence id -> the chained hashes of its leading blocks whose prompt tokens are known
        (those that get cached once full). Read only: for hot loops."""
        return self._hashes_of_seq

    def forked(self, parent_id: int, child_id: int) -> None:
        """``child_id`` shares the parent's blocks (it found none of them in the cache)."""
        self._hashes_of_seq[child_id] = self._hashes_of_seq[parent_id]
        self._cached_tokens_of_seq[child_id] = 0
        self._loaded_tokens_of_seq[child_id] = 0

    def freed(self, seq_id: int) -> None:
        """Forget the sequence; its hashed blocks stay cached while they wait in the free queue."""
        del self._hashes_of_seq[seq_id]
        del self._cached_tokens_of_seq[seq_id]
        del self._loaded_tokens_of_seq[seq_id]

    def evict(self, block_ids: list[int]) -> None:
        """The pool handed these blocks out for other content: forget their hashes (the CPU
        tier, if any, takes them, dropping its least recently used blocks when full)."""
        if not self._hash_of_block:
            return
        for block_id in block_ids:
            evicted_hash = self._hash_of_block.pop(block_id, None)
            if evicted_hash is not None:
                del self._block_of_hash[evicted_hash]
                self.num_evicted_blocks += 1
                if self.cpu_cache_blocks:
                    self._offload(evicted_hash)

    def _offload(self, block_hash: int) -> None:
        cpu_hashes = self._cpu_hashes
        cpu_hashes[block_hash] = None
        cpu_hashes.move_to_end(block_hash)
        if len(cpu_hashes) > self.cpu_cache_blocks:
            cpu_hashes.popitem(last=False)

    @property
    def num_cpu_blocks(self) -> int:
        """Blocks the CPU tier holds now."""
        return len(self._cpu_hashes)

    def cached_prefix_tokens(self, seq_id: int) -> int:
        """Leading tokens whose blocks the sequence found in the pool at admission: their KV is
        already there, so prefill need not compute them (0 for a forked sequence)."""
        return self._cached_tokens_of_seq[seq_id]

    def loaded_prefix_tokens(self, seq_id: int) -> int:
        """Of ``cached_prefix_tokens``, those loaded from the CPU tier at admission."""
        return self._loaded_tokens_of_seq[seq_id]

    def _prompt_hashes(self, request: Request) -> tuple[int, ...]:
        if self._last_hashed is None or self._last_hashed[0] is not request:
            self._last_hashed = (request, self._recent_hashes.of(request))
        return self._last_hashed[1]
