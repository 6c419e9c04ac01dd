"""Fixed-size physical KV blocks with a free queue and reference counts."""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """``num_blocks`` physical blocks, ids ``0 .. num_blocks - 1``.

    Free blocks wait in one queue in the order they were freed (initially by id): ``allocate``
    takes the head, so the least recently freed block is reused first (LRU), and a free block
    can also be taken out of the middle (a prefix-cache hit) by ``incref``.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks={num_blocks}: must be >= 0")
        self.num_blocks = num_blocks
        self.num_shared_blocks = 0  # blocks with more than one reference
        self._ref_counts = [0] * num_blocks
        # An ordered free queue that also removes from the middle in O(1). Not a plain dict: taking
        # a plain dict's first key after many deletions at its front scans the deleted slots.
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody references (including ones a prefix cache still remembers)."""
        return len(self._free_queue)

    @property
    def num_held_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - len(self._free_queue)

    def ref_count(self, block_id: int) -> int:
        """Number of references to ``block_id`` (0 when free)."""
        return self._ref_counts[block_id]

    def allocate(self) -> int:
        """Take the least recently freed block, with one reference (RuntimeError if none)."""
        if not self._free_queue:
            raise RuntimeError("no free block: check num_free_blocks before allocating")
        block_id, _ = self._free_queue.popitem(last=False)
        self._ref_counts[block_id] = 1
        return block_id

    def incref(self, block_id: int) -> None:
        """Add a reference; a free block leaves the free queue."""
        num_refs = self._ref_counts[block_id]
        if num_refs == 0:
            del self._free_queue[block_id]
        elif num_refs == 1:
            self.num_shared_blocks += 1
        self._ref_counts[block_id] = num_refs + 1

    def decref(self, block_id: int) -> bool:
        """Drop a reference; True if the block became free (it joins the tail of the queue)."""
        num_refs = self._ref_counts[block_id]
        if num_refs == 0:
            raise ValueError(f"block {block_id} is already free")
        self._ref_counts[block_id] = num_refs - 1
        if num_refs == 2:
            self.num_shared_blocks -= 1
        elif num_refs == 1:
            self._free_queue[block_id] = None
            return True
        return False
