"""Prefix caching over vLLM v1's hybrid KV-cache groups (``paged_hybrid_prefix``).

Every group caches its own full prompt blocks under the prompt's chained block hashes
(``prefix_hashes``), as vLLM's ``BlockPool`` keys them by (hash, group id). A prefix hit is the
longest prefix that EVERY group can serve (vLLM's
``HybridKVCacheCoordinator.find_longest_cache_hit``):

- a full-attention group needs every block before the hit point cached (a leading run);
- a sliding-window group of window ``w`` needs only the last ``ceil((w - 1) / block_size)``
  blocks before the hit point (the next token attends to ``w - 1`` earlier ones); its entries
  before them are vLLM's null block (None). It searches from the right for that many
  contiguous cached blocks (``SlidingWindowManager.find_longest_cache_hit``); without such a run,
  only a run of cached blocks from the prompt's start counts;
- groups of one window are looked up together (vLLM merges equal specs): a block index hits only
  where all of them hold it. Full attention goes first, then each window in group order, and the
  candidate length shrinks until every spec accepts it (a fixed point; one pass when there is
  one full and one sliding spec).

What a sliding group caches is vLLM 0.32's default sparse retention
(``prefix_cache_retention_interval=0``, ``SlidingWindowManager.reachable_block_mask``): not every
full prompt block, only the ``ceil((w - 1) / block_size)`` blocks that end at a point a later
request can resume at. Those points are the prompt's replay boundary, ``prompt - 1`` tokens
floored to a block (a resend of the prompt, capped at ``prompt - 1`` tokens, or a longer sibling
of it), and the request's shared-prefix junction: when a full group found a longer hit than the
sliding groups could serve, the request pins that point (``shared_prefix_boundary``), so that
the next request sharing the prefix hits there. A prefix that ends elsewhere in an earlier prompt
is a miss in the sliding groups, however long the full groups' hit. Full groups cache every full
block.

Blocks a sliding group freed behind its window keep their hash in the free queue (vLLM frees
them into the pool like any block) until the pool hands them out again, so a prefix whose window
blocks were evicted stops hitting at the point where they are gone, even if the full groups still
hold it. The free queue takes them as vLLM's does (``hashed_for_reuse``): blocks vLLM holds a
hash for at its tail, the others at its head, reused first. Like vLLM (``BlockHashToBlockMap``)
and unlike ``PrefixCache``, equal blocks are not deduplicated: a hash may name several blocks of a
group (the first cached serves hits), so a block recomputed after a partial hit keeps the prefix
alive when the older copy is evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvbench.allocators.prefix_cache import RECENT_REQUESTS
from kvbench.allocators.prefix_hashes import RecentPromptHashes
from kvbench.core.request import Request


@dataclass(frozen=True, slots=True)
class HybridHit:
    """A prefix hit over every group.

    Attributes:
        num_blocks: leading prompt blocks every group serves (hit tokens / block_size).
        group_blocks: per group, its table's first ``num_blocks`` entries: a cached pool block,
            or None (the null block) before a sliding group's window.
        junction_blocks: the longest hit one group alone found, in blocks, where it is longer
            than ``num_blocks`` (vLLM's ``shared_prefix_boundary`` / block_size); else 0.
    """

    num_blocks: int
    group_blocks: tuple[tuple[int | None, ...], ...]
    junction_blocks: int = 0


def blocks_needed_for_hit(window_tokens: int | None, block_size: int) -> int | None:
    """Blocks before a hit point a group must hold: ``ceil((w - 1) / block_size)`` for a
    sliding window of ``w`` tokens (vLLM's ``_contiguous_blocks_for_hit``), None (all of them)
    for full attention."""
    if window_tokens is None:
        return None
    return -(-(window_tokens - 1) // block_size)


def longest_hybrid_hit(
    max_blocks: int,
    specs: Sequence[tuple[int | None, Sequence[int]]],
    is_cached: Callable[[int, Sequence[int]], bool],
) -> tuple[int, int]:
    """Leading blocks (at most ``max_blocks``) every spec serves: vLLM's fixed point (module doc);
    and the longest hit a spec alone found on the way (the full groups' first lookup, where there
    are full groups), whose excess over the first is vLLM's uncached shared prefix.

    ``specs``: (blocks a hit needs before it, ``blocks_needed_for_hit``; the group ids sharing
    that spec), full attention (None) first. ``is_cached(block_index, group_ids)``: whether every
    one of the groups holds that prompt block.
    """
    hit_blocks = max_blocks
    longest = 0
    full_hit: int | None = None
    one_pass = len(specs) == 2 and specs[0][0] is None
    while True:
        candidate = hit_blocks
        for num_needed, group_ids in specs:
            if num_needed is None:
                if full_hit is None:  # downward closed: looked up once, then only trimmed
                    full_hit = _leading_run(candidate, group_ids, is_cached)
                    longest = max(longest, full_hit)
                candidate = min(candidate, full_hit)
            else:
                candidate = _sliding_hit(candidate, num_needed, group_ids, is_cached)
                longest = max(longest, candidate)
        if candidate >= hit_blocks:
            return hit_blocks, longest
        hit_blocks = candidate
        if one_pass:
            return hit_blocks, longest


def _leading_run(
    max_blocks: int, group_ids: Sequence[int], is_cached: Callable[[int, Sequence[int]], bool]
) -> int:
    for block_index in range(max_blocks):
        if not is_cached(block_index, group_ids):
            return block_index
    return max_blocks


def _sliding_hit(
    max_blocks: int,
    num_needed: int,
    group_ids: Sequence[int],
    is_cached: Callable[[int, Sequence[int]], bool],
) -> int:
    """The rightmost end of ``num_needed`` contiguous cached blocks; else the run from 0."""
    run = 0
    for block_index in range(max_blocks - 1, -1, -1):
        if is_cached(block_index, group_ids):
            run += 1
            if run >= num_needed:
                return block_index + run
        else:
            run = 0
    return run


class HybridPrefixCache:
    """Per-group block hash -> pool blocks for ``PagedHybridAllocator`` (module doc).

    Args:
        block_size: tokens per block.
        windows: each group's window in tokens, None for full attention.

    Attributes:
        num_hit_blocks: table entries admissions took from the cache, over all groups.
        num_evicted_blocks: cached free blocks the pool handed out for other content.
    """

    def __init__(self, block_size: int, windows: Sequence[int | None]) -> None:
        self.block_size = block_size
        self.num_hit_blocks = 0
        self.num_evicted_blocks = 0
        self._num_groups = len(windows)
        self._needed = [blocks_needed_for_hit(window, block_size) for window in windows]
        groups_of_window: dict[int | None, list[int]] = {}
        for group, window in enumerate(windows):
            groups_of_window.setdefault(window, []).append(group)
        # Full attention first (vLLM's order: its leading run bounds the sliding searches).
        self._specs = sorted(
            ((blocks_needed_for_hit(window, block_size), groups)
             for window, groups in groups_of_window.items()),
            key=lambda spec: spec[0] is not None,
        )  # fmt: skip
        # Per group: hash -> its cached blocks in caching order (a dict as an ordered set).
        self._blocks_of_hash: list[dict[int, dict[int, None]]] = [{} for _ in windows]
        self._hash_of_block: dict[int, tuple[int, int]] = {}  # block -> (group, hash)
        # Per sequence: its blocks' chained hashes (its known prompt prefix; or, given at
        # admission, a list the caller extends as the sequence grows past it).
        self._hashes_of_seq: dict[int, Sequence[int]] = {}
        self._cached_tokens_of_seq: dict[int, int] = {}
        # Per sequence: the end of its blocks offered to the cache so far (vLLM's
        # num_cached_block): under async scheduling a block can fill before its token is known.
        self._offered_end_of_seq: dict[int, int] = {}
        # Per sequence: the blocks (exclusive ends) its sliding groups keep cached tails before:
        # its replay boundary and its junction (module doc).
        self._tail_ends_of_seq: dict[int, tuple[int, ...]] = {}
        # Full blocks vLLM would hold a hash for that kvbench cannot match (generated tokens'
        # blocks of full groups): they are freed to the queue's tail all the same.
        self._hashed_unmatched: set[int] = set()
        self._recent_hashes = RecentPromptHashes(block_size, RECENT_REQUESTS)

    def lookup(
        self, request: Request, num_tokens: int, hashes: Sequence[int] | None = None
    ) -> HybridHit:
        """The hit an admission of ``num_tokens`` tokens of ``request`` would take now: at most
        ``num_tokens - 1`` tokens (the last one is computed for its logits), as vLLM caps it.
        ``hashes``: the sequence's block hashes, its own blocks included (default: its known
        prompt prefix's)."""
        if hashes is None:
            hashes = self._prompt_hashes(request)
        max_blocks = min((num_tokens - 1) // self.block_size, len(hashes))
        if max_blocks <= 0 or not self._hash_of_block:
            return HybridHit(0, ((),) * self._num_groups)
        blocks_of_hash = self._blocks_of_hash

        def is_cached(block_index: int, group_ids: Sequence[int]) -> bool:
            block_hash = hashes[block_index]
            return all(block_hash in blocks_of_hash[group] for group in group_ids)

        num_blocks, longest = longest_hybrid_hit(max_blocks, self._specs, is_cached)
        group_blocks = []
        for group, num_needed in enumerate(self._needed):
            first = 0 if num_needed is None else max(0, num_blocks - num_needed)
            leading: list[int | None] = [None] * first
            for block_index in range(first, num_blocks):
                leading.append(next(iter(blocks_of_hash[group][hashes[block_index]])))
            group_blocks.append(tuple(leading))
        junction = longest if longest > num_blocks else 0
        return HybridHit(num_blocks, tuple(group_blocks), junction)

    def match_tokens(self, request: Request, num_tokens: int) -> int:
        """Leading tokens of a sequence of ``num_tokens`` tokens of ``request`` every group
        serves now (``lookup``'s hit), without changing anything."""
        return self.lookup(request, num_tokens).num_blocks * self.block_size

    def admitted(
        self,
        seq_id: int,
        request: Request,
        hit: HybridHit,
        tables: Sequence[Sequence[int | None]],
        num_tokens: int,
        hashes: Sequence[int] | None = None,
    ) -> None:
        """A new sequence whose group ``tables`` start with ``hit`` and hold ``num_tokens``
        tokens: remember its hashes (``hashes``, else its known prompt prefix's) and tails, and
        cache its full blocks past the hit."""
        self.num_hit_blocks += sum(
            1 for blocks in hit.group_blocks for block_id in blocks if block_id is not None
        )
        self._hashes_of_seq[seq_id] = self._prompt_hashes(request) if hashes is None else hashes
        self._cached_tokens_of_seq[seq_id] = hit.num_blocks * self.block_size
        replay_end = (request.prompt_tokens - 1) // self.block_size
        self._tail_ends_of_seq[seq_id] = (replay_end, hit.junction_blocks)
        self._offered_end_of_seq[seq_id] = hit.num_blocks
        self.cache_through(seq_id, tables, num_tokens // self.block_size)

    def retains(self, seq_id: int, group: int, block_index: int) -> bool:
        """Whether the sequence's full block ``block_index`` of ``group`` is cached (vLLM 0.32's
        default retention): always in a full group; in a sliding one, within a tail of
        ``ceil((w - 1) / block_size)`` blocks before the sequence's replay boundary or
        junction."""
        num_needed = self._needed[group]
        if num_needed is None:
            return True
        return any(end - num_needed <= block_index < end
                   for end in self._tail_ends_of_seq[seq_id] if end)  # fmt: skip

    def cache_through(
        self, seq_id: int, tables: Sequence[Sequence[int | None]], end_block: int
    ) -> None:
        """Cache the sequence's full blocks not offered yet, up to ``end_block``
        (``cache_full_blocks``)."""
        first_block = self._offered_end_of_seq[seq_id]
        if end_block > first_block:
            self.cache_full_blocks(seq_id, tables, first_block, end_block)
            self._offered_end_of_seq[seq_id] = end_block

    def cache_full_blocks(
        self,
        seq_id: int,
        tables: Sequence[Sequence[int | None]],
        first_block: int,
        end_block: int,
    ) -> None:
        """Cache every group's blocks ``[first_block, end_block)`` (all full) that have a hash
        and that the group retains (``retains``); entries a sliding group already freed (None)
        are skipped. A full group's blocks past the known hashes (generated tokens) are only
        marked hashed for the free queue's order."""
        hashes = self._hashes_of_seq[seq_id]
        hash_of_block = self._hash_of_block
        for group, table in enumerate(tables):
            blocks_of_hash = self._blocks_of_hash[group]
            for block_index in range(first_block, end_block):
                block_id = table[block_index]
                if block_id is None or block_id in hash_of_block:
                    continue
                if not self.retains(seq_id, group, block_index):
                    continue
                if block_index >= len(hashes):
                    self._hashed_unmatched.add(block_id)
                    continue
                block_hash = hashes[block_index]
                blocks_of_hash.setdefault(block_hash, {})[block_id] = None
                hash_of_block[block_id] = (group, block_hash)

    def hashed_for_reuse(self, block_id: int) -> bool:
        """Whether vLLM would hold a hash for the block: freed, it joins the free queue's tail
        (LRU); a block without one joins its head (``BlockPool.free_blocks``)."""
        return block_id in self._hash_of_block or block_id in self._hashed_unmatched

    @property
    def hashes_of_seq(self) -> Mapping[int, Sequence[int]]:
        """Sequence id -> the chained hashes of its blocks: its leading known prompt blocks, or
        those given at admission (read only)."""
        return self._hashes_of_seq

    def forked(self, parent_id: int, child_id: int) -> None:
        """``child_id`` shares the parent's blocks (it found none of them in the cache)."""
        self._hashes_of_seq[child_id] = self._hashes_of_seq[parent_id]
        self._cached_tokens_of_seq[child_id] = 0
        self._offered_end_of_seq[child_id] = self._offered_end_of_seq[parent_id]
        self._tail_ends_of_seq[child_id] = self._tail_ends_of_seq[parent_id]

    def freed(self, seq_id: int) -> None:
        """Forget the sequence; its hashed blocks stay cached while they wait in the free queue."""
        del self._hashes_of_seq[seq_id]
        del self._cached_tokens_of_seq[seq_id]
        del self._offered_end_of_seq[seq_id]
        del self._tail_ends_of_seq[seq_id]

    def evict(self, block_ids: list[int]) -> None:
        """The pool handed these blocks out for other content: forget their hashes."""
        if self._hashed_unmatched:
            self._hashed_unmatched.difference_update(block_ids)
        if not self._hash_of_block:
            return
        for block_id in block_ids:
            entry = self._hash_of_block.pop(block_id, None)
            if entry is None:
                continue
            group, block_hash = entry
            blocks = self._blocks_of_hash[group][block_hash]
            del blocks[block_id]
            if not blocks:
                del self._blocks_of_hash[group][block_hash]
            self.num_evicted_blocks += 1

    def cached_prefix_tokens(self, seq_id: int) -> int:
        """Leading tokens every group found cached at admission: prefill need not compute them
        (0 for a forked sequence)."""
        return self._cached_tokens_of_seq[seq_id]

    def loaded_prefix_tokens(self, seq_id: int) -> int:
        """Always 0: the hybrid cache has no CPU tier."""
        del seq_id
        return 0

    @property
    def num_cached_blocks(self) -> int:
        """Pool blocks that carry a hash now (held or cached free)."""
        return len(self._hash_of_block)

    def _prompt_hashes(self, request: Request) -> tuple[int, ...]:
        return self._recent_hashes.of(request)
