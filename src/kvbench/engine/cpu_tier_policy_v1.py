"""Which block vLLM v1's CPU tier evicts: the cache policies of vLLM 0.32's
``CPUOffloadingManager`` (``v1/kv_offload/cpu/policies/``, ``kv_connector_extra_config``'s
``eviction_policy``), over the tier's block hashes.

- ``lru`` (vLLM's default): the least recently used readable block. A block is used when it is
  stored and when a request that stored, found or loaded it finishes.
- ``arc`` (Adaptive Replacement Cache, Megiddo and Modha, FAST'03): blocks used once (T1) and
  blocks a later request reused (T2), each in recency order, and ghost lists of the hashes each
  evicted (B1, B2). Eviction takes from T1 while it holds at least an adaptive target, else
  from T2; a prompt whose blocks were evicted from T1 (a B1 hit) raises the target, one evicted
  from T2 (a B2 hit) lowers it. A scan of one-off prompts then evicts its own blocks rather
  than a prefix requests reuse.

The tier (``cpu_tier_v1.CpuOffloadTier``) keeps the pins, which a policy reads: it evicts only
blocks whose pin is 0 (readable, no load in flight), and keeps a pinned block's place.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

EVICTION_POLICIES = ("lru", "arc")


class EvictionPolicy(Protocol):
    """What the tier asks of a policy; every argument is a block hash."""

    def insert(self, block_hash: int) -> None:
        """A store of the block starts (it is not evictable until its pin drops to 0)."""

    def evict(self, num_blocks: int, protected: set[int]) -> list[int] | None:
        """Take ``num_blocks`` evictable blocks outside ``protected`` out of the policy, or
        none (None) when fewer can go."""

    def on_store_miss(self, hashes: list[int]) -> None:
        """A request offers these blocks, which the tier lacks, for the first time (head to
        tail)."""

    def on_request_finished(
        self, hashes: list[int], insertion_only: set[int], reused: set[int]
    ) -> None:
        """A request finished: ``hashes`` are the blocks it stored, found or loaded, tail to
        head; ``insertion_only`` those it only stored, ``reused`` those it found readable or
        loaded."""


def make_eviction_policy(name: str, num_blocks: int, pins: dict[int, int]) -> EvictionPolicy:
    """The policy ``name`` (``EVICTION_POLICIES``) of a tier of ``num_blocks`` blocks whose pin
    counts are ``pins`` (block hash -> pin; 0: evictable)."""
    if name == "lru":
        return LruPolicy(pins)
    if name == "arc":
        return ArcPolicy(num_blocks, pins)
    raise ValueError(f"eviction_policy={name!r}: one of {', '.join(EVICTION_POLICIES)}")


class LruPolicy:
    """vLLM's ``LRUCachePolicy``: the tier's blocks in recency order (least recent first);
    eviction takes the first evictable ones. (vLLM keeps ranks in a lazily invalidated heap;
    a block pinned while used keeps its place, so the order is the same.)"""

    def __init__(self, pins: dict[int, int]) -> None:
        self._pins = pins
        self._by_recency: OrderedDict[int, None] = OrderedDict()

    def insert(self, block_hash: int) -> None:
        self._by_recency[block_hash] = None

    def evict(self, num_blocks: int, protected: set[int]) -> list[int] | None:
        pins = self._pins
        chosen = []
        for block_hash in self._by_recency:
            if pins[block_hash] == 0 and block_hash not in protected:
                chosen.append(block_hash)
                if len(chosen) == num_blocks:
                    break
        else:
            return None
        for block_hash in chosen:
            del self._by_recency[block_hash]
        return chosen

    def on_store_miss(self, hashes: list[int]) -> None:
        return  # vLLM's LRU touches them, and it holds none of them

    def on_request_finished(
        self, hashes: list[int], insertion_only: set[int], reused: set[int]
    ) -> None:
        by_recency = self._by_recency
        for block_hash in hashes:
            if block_hash in by_recency:
                by_recency.move_to_end(block_hash)


class ArcPolicy:
    """vLLM's ``ARCCachePolicy``: T1/T2 in recency order (least recent first), ghosts B1/B2
    each bounded by the tier's size, and the adaptive target of T1's size."""

    def __init__(self, num_blocks: int, pins: dict[int, int]) -> None:
        self._num_blocks = num_blocks
        self._pins = pins
        self.target_t1_blocks = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()  # used once
        self.t2: OrderedDict[int, None] = OrderedDict()  # reused
        self.b1: OrderedDict[int, None] = OrderedDict()  # evicted from T1
        self.b2: OrderedDict[int, None] = OrderedDict()  # evicted from T2

    def insert(self, block_hash: int) -> None:
        self.t1[block_hash] = None
        self.b1.pop(block_hash, None)
        self.b2.pop(block_hash, None)

    def evict(self, num_blocks: int, protected: set[int]) -> list[int] | None:
        # Chosen before anything moves, as if T1 shrank with each pick; the scans only go
        # forward (from the least recent).
        t1_blocks = iter(self.t1)
        t2_blocks = iter(self.t2)
        num_t1_blocks = len(self.t1)
        chosen: list[tuple[int, bool]] = []  # (hash, from T1)
        for _ in range(num_blocks):
            block_hash = None
            from_t1 = num_t1_blocks >= int(self.target_t1_blocks)
            if from_t1:
                block_hash = self._next_evictable(t1_blocks, protected)
            if block_hash is None:
                block_hash = self._next_evictable(t2_blocks, protected)
                from_t1 = False
            if block_hash is None:
                block_hash = self._next_evictable(t1_blocks, protected)
                from_t1 = True
                if block_hash is None:
                    return None
            num_t1_blocks -= from_t1
            chosen.append((block_hash, from_t1))
        for block_hash, from_t1 in chosen:
            if from_t1:
                del self.t1[block_hash]
                self.b1[block_hash] = None
            else:
                del self.t2[block_hash]
                self.b2[block_hash] = None
        for ghosts in (self.b1, self.b2):
            for _ in range(len(ghosts) - self._num_blocks):
                ghosts.popitem(last=False)
        return [block_hash for block_hash, _ in chosen]

    def _next_evictable(self, blocks: Iterable[int], protected: set[int]) -> int | None:
        pins = self._pins
        for block_hash in blocks:
            if pins[block_hash] == 0 and block_hash not in protected:
                return block_hash
        return None

    def on_store_miss(self, hashes: list[int]) -> None:
        for block_hash in reversed(hashes):
            self._adapt_to_ghost_hit(block_hash)

    def _adapt_to_ghost_hit(self, block_hash: int) -> None:
        """A block evicted from T1 is asked for again: recency matters more (T1's target
        grows); one evicted from T2: frequency does (it shrinks)."""
        if block_hash in self.b1:
            step = max(1.0, len(self.b2) / len(self.b1))
            self.target_t1_blocks = min(self.target_t1_blocks + step, self._num_blocks)
            self.b1.move_to_end(block_hash)
        elif block_hash in self.b2:
            step = max(1.0, len(self.b1) / len(self.b2))
            self.target_t1_blocks = max(self.target_t1_blocks - step, 0.0)
            self.b2.move_to_end(block_hash)

    def on_request_finished(
        self, hashes: list[int], insertion_only: set[int], reused: set[int]
    ) -> None:
        t1, t2 = self.t1, self.t2
        for block_hash in hashes:
            if block_hash in insertion_only:  # a store is no reuse: recency only
                if block_hash in t1:
                    t1.move_to_end(block_hash)
                elif block_hash in t2:
                    t2.move_to_end(block_hash)
            elif block_hash in reused:
                if block_hash in t1:
                    del t1[block_hash]
                    t2[block_hash] = None
                elif block_hash in t2:
                    t2.move_to_end(block_hash)
