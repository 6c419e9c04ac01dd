"""Fixed-size physical KV blocks with a free queue and reference counts."""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """``num_blocks`` physical blocks, ids ``0 .. num_blocks - 1``.

    Free blocks wait in one queue in the order they were freed (initially by id): ``allocate``
    takes the head, so the least recently freed block is reused first (LRU). A free block leaves
    the queue only from the head, so the queue is a list read from a moving head index (bulk
    allocation is a slice). ``RevivableBlockPool`` also takes free blocks out of the middle
    (prefix-cache hits).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks={num_blocks}: must be >= 0")
        self.num_blocks = num_blocks
        self.num_shared_blocks = 0  # blocks with more than one reference
        self.num_free_blocks = num_blocks  # blocks nobody references (a prefix cache may
        # still remember them)
        self._ref_counts = [0] * num_blocks
        self._init_free_queue(range(num_blocks))

    def _init_free_queue(self, block_ids: range) -> None:
        self._free_queue: list[int] | OrderedDict[int, None] = list(block_ids)
        self._free_head = 0  # _free_queue[_free_head:] is the queue

    def free_queue(self) -> tuple[int, ...]:
        """The free blocks, head first: the order ``allocate`` will hand them out."""
        if isinstance(self._free_queue, list):
            return tuple(self._free_queue[self._free_head :])
        return tuple(self._free_queue)

    @property
    def num_held_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def ref_counts(self) -> list[int]:
        """Every block's reference count, by block id (read only: for hot loops)."""
        return self._ref_counts

    def ref_count(self, block_id: int) -> int:
        """Number of references to ``block_id`` (0 when free)."""
        return self._ref_counts[block_id]

    def allocate(self) -> int:
        """Take the least recently freed block, with one reference (RuntimeError if none)."""
        return self.allocate_many(1)[0]

    def allocate_many(self, num_blocks: int) -> list[int]:
        """``allocate`` called ``num_blocks`` times, in one call (RuntimeError if too few)."""
        if num_blocks > self.num_free_blocks:
            raise RuntimeError("too few free blocks: check num_free_blocks before allocating")
        block_ids = self._pop_free(num_blocks)
        self.num_free_blocks -= num_blocks
        ref_counts = self._ref_counts
        for block_id in block_ids:
            ref_counts[block_id] = 1
        return block_ids

    def _pop_free(self, num_blocks: int) -> list[int]:
        free_queue = self._free_queue
        assert isinstance(free_queue, list)
        head = self._free_head
        block_ids = free_queue[head : head + num_blocks]
        head += num_blocks
        if head > 4096 and 2 * head > len(free_queue):
            del free_queue[:head]  # amortized O(1) per block
            head = 0
        self._free_head = head
        return block_ids

    def _push_free(self, block_ids: list[int]) -> None:
        self._free_queue.extend(block_ids)  # type: ignore[union-attr]

    def incref(self, block_id: int) -> None:
        """Add a reference to a held block (``RevivableBlockPool`` also takes free ones)."""
        num_refs = self._ref_counts[block_id]
        if num_refs == 0:
            self._revive(block_id)
        elif num_refs == 1:
            self.num_shared_blocks += 1
        self._ref_counts[block_id] = num_refs + 1

    def _revive(self, block_id: int) -> None:
        raise ValueError(f"block {block_id} is free; only a RevivableBlockPool takes it back")

    def release(self, block_ids: list[int]) -> None:
        """``decref`` every block of ``block_ids``, in order."""
        ref_counts = self._ref_counts
        if not self.num_shared_blocks:
            # Every held block has one reference: all of them become free (runs for every
            # finished sequence, so without the general case's branches).
            for block_id in block_ids:
                if ref_counts[block_id] != 1:
                    raise ValueError(f"block {block_id} is already free")
                ref_counts[block_id] = 0
            self._push_free(block_ids)
            self.num_free_blocks += len(block_ids)
            return
        freed = []
        for block_id in block_ids:
            num_refs = ref_counts[block_id]
            if num_refs == 1:
                ref_counts[block_id] = 0
                freed.append(block_id)
            elif num_refs == 0:
                raise ValueError(f"block {block_id} is already free")
            else:
                ref_counts[block_id] = num_refs - 1
                self.num_shared_blocks -= num_refs == 2
        self._push_free(freed)
        self.num_free_blocks += len(freed)

    def decref(self, block_id: int) -> bool:
        """Drop a reference; True if the block became free (it joins the tail of the queue)."""
        self.release([block_id])
        return self._ref_counts[block_id] == 0


class RevivableBlockPool(BlockPool):
    """A ``BlockPool`` whose free blocks can be taken back out of the middle of the queue by
    ``incref`` (a prefix-cache hit on a cached free block), in O(1)."""

    def _init_free_queue(self, block_ids: range) -> None:
        # Not a plain dict: taking a plain dict's first key after many deletions at its front
        # scans the deleted slots.
        self._free_queue = OrderedDict.fromkeys(block_ids)

    def _pop_free(self, num_blocks: int) -> list[int]:
        popitem = self._free_queue.popitem
        return [popitem(last=False)[0] for _ in range(num_blocks)]

    def _push_free(self, block_ids: list[int]) -> None:
        self._free_queue.update(dict.fromkeys(block_ids))

    def _revive(self, block_id: int) -> None:
        del self._free_queue[block_id]
        self.num_free_blocks -= 1
