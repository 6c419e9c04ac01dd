"""Fixed-size physical KV blocks with a free queue and reference counts."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol


class _FreeQueue(Protocol):
    """The free blocks in the order they will be reused (least recently freed first)."""

    def pop_head(self, num_blocks: int) -> list[int]:
        """Take the first ``num_blocks`` blocks (the caller has checked there are as many)."""
        ...

    def push_tail(self, block_ids: list[int]) -> None:
        """Queue blocks that just became free, in order."""
        ...

    def push_head(self, block_ids: list[int]) -> None:
        """Put blocks that just became free at the head, ``block_ids[0]`` first."""
        ...

    def remove(self, block_id: int) -> None:
        """Take a free block out of the middle of the queue."""
        ...

    def block_ids(self) -> tuple[int, ...]:
        """The queue, head first."""
        ...


class _HeadIndexQueue:
    """A free queue that blocks leave only from the head: a list read from a moving head index
    (bulk allocation is a slice)."""

    def __init__(self, block_ids: range) -> None:
        self._queue = list(block_ids)
        self._head = 0  # _queue[_head:] is the queue

    def pop_head(self, num_blocks: int) -> list[int]:
        queue = self._queue
        head = self._head
        block_ids = queue[head : head + num_blocks]
        head += num_blocks
        if head > 4096 and 2 * head > len(queue):
            del queue[:head]  # amortized O(1) per block
            head = 0
        self._head = head
        return block_ids

    def push_tail(self, block_ids: list[int]) -> None:
        self._queue.extend(block_ids)

    def push_head(self, block_ids: list[int]) -> None:
        self._queue[self._head : self._head] = block_ids

    def remove(self, block_id: int) -> None:
        raise ValueError(f"block {block_id} is free; only a revivable pool takes it back")

    def block_ids(self) -> tuple[int, ...]:
        return tuple(self._queue[self._head :])


class _RevivableQueue:
    """A free queue that a block can also leave from the middle (a prefix-cache hit revives a
    cached free block), in O(1)."""

    def __init__(self, block_ids: range) -> None:
        # Not a plain dict: taking a plain dict's first key after many deletions at its front
        # scans the deleted slots.
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def pop_head(self, num_blocks: int) -> list[int]:
        popitem = self._queue.popitem
        return [popitem(last=False)[0] for _ in range(num_blocks)]

    def push_tail(self, block_ids: list[int]) -> None:
        self._queue.update(dict.fromkeys(block_ids))

    def push_head(self, block_ids: list[int]) -> None:
        queue = self._queue
        for block_id in reversed(block_ids):  # the first of them ends at the head
            queue[block_id] = None
            queue.move_to_end(block_id, last=False)

    def remove(self, block_id: int) -> None:
        del self._queue[block_id]

    def block_ids(self) -> tuple[int, ...]:
        return tuple(self._queue)


class BlockPool:
    """``num_blocks`` physical blocks, ids ``0 .. num_blocks - 1``.

    Free blocks wait in one queue in the order they were freed (initially by id): ``allocate``
    takes the head, so the least recently freed block is reused first (LRU). A ``revivable`` pool
    (the one a prefix cache needs) also lets ``incref`` take a free block back out of the middle
    of the queue; a plain one keeps the cheaper queue that blocks leave only from the head.
    """

    def __init__(self, num_blocks: int, *, revivable: bool = False) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks={num_blocks}: must be >= 0")
        self.num_blocks = num_blocks
        self.num_shared_blocks = 0  # blocks with more than one reference
        self.num_free_blocks = num_blocks  # blocks nobody references (a prefix cache may
        # still remember them)
        self._ref_counts = [0] * num_blocks
        queue_type = _RevivableQueue if revivable else _HeadIndexQueue
        self._free_queue: _FreeQueue = queue_type(range(num_blocks))

    def free_queue(self) -> tuple[int, ...]:
        """The free blocks, head first: the order ``allocate`` will hand them out."""
        return self._free_queue.block_ids()

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
        block_ids = self._free_queue.pop_head(num_blocks)
        self.num_free_blocks -= num_blocks
        ref_counts = self._ref_counts
        for block_id in block_ids:
            ref_counts[block_id] = 1
        return block_ids

    def incref(self, block_id: int) -> None:
        """Add a reference to a block; a free one leaves the queue (revivable pools only:
        ValueError otherwise)."""
        num_refs = self._ref_counts[block_id]
        if num_refs == 0:
            self._free_queue.remove(block_id)
            self.num_free_blocks -= 1
        elif num_refs == 1:
            self.num_shared_blocks += 1
        self._ref_counts[block_id] = num_refs + 1

    def release(
        self, block_ids: list[int], hashed: Callable[[int], bool] | None = None
    ) -> None:
        """``decref`` every block of ``block_ids``, in order; a block already free (ValueError)
        leaves the pool as it was before the call.

        Blocks that become free join the tail of the queue; with ``hashed``, vLLM v1's order
        instead (``BlockPool.free_blocks``): those ``hashed`` says carry no hash go to the head
        (reused first, the first of them first), hashed ones to the tail (LRU)."""
        freed = self._decref_all(block_ids)
        if hashed is None:
            self._free_queue.push_tail(freed)
        else:
            self._free_queue.push_head([block_id for block_id in freed if not hashed(block_id)])
            self._free_queue.push_tail([block_id for block_id in freed if hashed(block_id)])
        self.num_free_blocks += len(freed)

    def _decref_all(self, block_ids: list[int]) -> list[int]:
        """Drop one reference to each block; the blocks that became free, in order."""
        ref_counts = self._ref_counts
        if not self.num_shared_blocks:
            # Every held block has one reference: all of them become free (runs for every
            # finished sequence, so without the general case's branches).
            for position, block_id in enumerate(block_ids):
                if ref_counts[block_id] != 1:
                    for freed_id in block_ids[:position]:
                        ref_counts[freed_id] = 1
                    raise ValueError(f"block {block_id} is already free")
                ref_counts[block_id] = 0
            return block_ids
        freed = []
        for position, block_id in enumerate(block_ids):
            num_refs = ref_counts[block_id]
            if num_refs == 0:
                self._undo_decrefs(block_ids[:position])
                raise ValueError(f"block {block_id} is already free")
            ref_counts[block_id] = num_refs - 1
            if num_refs == 1:
                freed.append(block_id)
            else:
                self.num_shared_blocks -= num_refs == 2
        return freed

    def _undo_decrefs(self, block_ids: list[int]) -> None:
        """Give back the references ``release`` took from ``block_ids`` before it refused."""
        ref_counts = self._ref_counts
        for block_id in block_ids:
            num_refs = ref_counts[block_id] + 1
            ref_counts[block_id] = num_refs
            self.num_shared_blocks += num_refs == 2

    def decref(self, block_id: int) -> bool:
        """Drop a reference; True if the block became free (it joins the tail of the queue)."""
        self.release([block_id])
        return self._ref_counts[block_id] == 0
