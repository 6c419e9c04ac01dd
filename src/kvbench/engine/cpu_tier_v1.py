"""vLLM v1's CPU offloading (its ``OffloadingConnector`` over the CPU backend): the CPU tier of
``scheduler=vllm_v1`` with ``allocator.cpu_cache_gib`` > 0.

Modelled on vLLM 0.32's ``OffloadingConnectorScheduler``
(``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``) with its defaults (chunks
of one block, prompt blocks only, LRU) and its ``CPUOffloadingManager`` with the LRU policy
(``v1/kv_offload/cpu/``), for one full-attention group; refereed step for step by the real ones
(docs/referee.md). It works the other way from kvbench's ``vllm_v0`` tier (``PrefixCache``):

- **store on compute, inclusive**: each step offers the tier the prompt blocks its scheduled
  tokens complete; a block the tier lacks is stored (evicting its least recently used readable
  blocks; when too few are evictable, the whole offer is dropped and retried the next time the
  request is scheduled), while the GPU keeps its copy;
- a store becomes readable one step later: the worker copies it at the start of the next step;
- **asynchronous loads**: a waiting request whose prefix continues in the tier past its GPU hit
  gets blocks for both and waits outside the batch while they load (one step here: a copy
  shorter than a step); a later request whose hit is still being stored or loaded is skipped
  for the step;
- recency: a block is used when stored, and again when the request that stored or loaded it
  finishes (its blocks from the last to the first, so a prompt's head is evicted last).

Keys are the GPU cache's block hashes (``V1Sequence.block_hashes``): the same prefix names the
same block in both tiers.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable

from kvbench.engine.kv_cache_v1 import V1Sequence

_STORING = -1  # a chunk's pin count while its store is in flight: not readable, not evictable
_Copy = tuple[list[int], int, bool]  # (block hashes, request id, is a load)


class _RequestState:
    """What the connector remembers of one request (vLLM's ``RequestOffloadState``)."""

    __slots__ = ("block_ids", "finish_signaled", "next_stored_block", "num_jobs", "seen_blocks")

    def __init__(self) -> None:
        self.next_stored_block = 0
        self.seen_blocks: set[int] = set()  # block indices it stored, found stored, or loaded
        self.num_jobs = 0  # copies in flight (one load, or stores)
        self.finish_signaled = False  # its finish was seen by a step's schedule
        self.block_ids: list[int] = []  # its GPU blocks when it finished


class CpuOffloadTier:
    """``num_blocks`` blocks of host memory holding prompt blocks (store on compute, LRU).

    The scheduler calls it as vLLM's scheduler calls its connector: ``lookup`` and
    ``start_load`` at a waiting request's admission, ``offer`` for every scheduled request
    after a step is scheduled, ``finished`` when a request's last token is taken in,
    ``end_schedule`` once a step's stores are offered, and ``complete_step`` with the model
    runner's answer.

    Attributes:
        num_hit_blocks: blocks admissions loaded from the tier.
        num_stored_blocks: blocks stored into it.
        num_dropped_offers: offers dropped for want of evictable blocks.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: a CPU tier holds >= 1 block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_hit_blocks = 0
        self.num_stored_blocks = 0
        self.num_dropped_offers = 0
        self._pins: dict[int, int] = {}  # block hash -> pin count (_STORING: being stored)
        self._ranks: dict[int, int] = {}  # block hash -> recency (higher: more recent)
        self._next_rank = 0
        self._evictable_heap: list[tuple[int, int]] = []  # (rank, hash), lazily invalidated
        self._num_evictable = 0
        self._states: dict[int, _RequestState] = {}  # request id -> state
        self._being_loaded: set[int] = set()
        # Copies (hashes, request id, is_load) issued by the step being scheduled; those of the
        # steps whose answer is not taken in yet (its loads and flushed stores complete in it);
        # the stores of the last step taken in (they complete in the next).
        self._issued: list[_Copy] = []
        self._flushed: list[_Copy] = []
        self._unanswered: deque[tuple[list[_Copy], list[_Copy]]] = deque()
        self._deferred_stores: list[_Copy] = []
        self._loads_in_flight: list[_Copy] = []  # answered, but not copied yet (long copies)
        self._finished_since_schedule: list[V1Sequence] = []

    @property
    def has_copies_in_flight(self) -> bool:
        """Whether a copy is still to complete (a request waiting on it runs later)."""
        return bool(self._deferred_stores or self._loads_in_flight) or any(
            copies for copies, _ in self._unanswered
        )

    @property
    def num_held_blocks(self) -> int:
        """Blocks the tier holds, stores in flight included."""
        return len(self._pins)

    def _state(self, seq: V1Sequence) -> _RequestState:
        state = self._states.get(seq.request_id)
        if state is None:
            state = self._states[seq.request_id] = _RequestState()
        return state

    def lookup(self, seq: V1Sequence, first_block: int) -> int | None:
        """Blocks from ``first_block`` on (where the GPU hit ends) that the tier holds readable,
        up to its first miss, within the sequence's full blocks (vLLM: prompt and taken-in
        tokens); None when the request must wait a step (vLLM's connector defers it): copies
        of its own are in flight, or a hit block is still being stored, or being loaded for
        another request."""
        if self._state(seq).num_jobs:
            return None
        num_full_blocks = seq.num_tokens // self.block_size
        if num_full_blocks - first_block < 1:
            return 0
        hashes = seq.block_hashes(num_full_blocks, self.block_size)[first_block:num_full_blocks]
        pins = self._pins
        num_hits = 0
        deferred = False
        for block_hash in hashes:
            pin = pins.get(block_hash)
            if pin is None:
                break
            deferred |= pin == _STORING
            num_hits += 1
        if deferred:
            return None
        if num_hits and not self._being_loaded.isdisjoint(hashes[:num_hits]):
            return None
        return num_hits

    def start_load(self, seq: V1Sequence, first_block: int, num_blocks: int) -> None:
        """Load the ``num_blocks`` blocks ``lookup`` found into the sequence's fresh blocks: pin
        them until the copy completes (this step's end)."""
        hashes = seq.block_hashes(first_block + num_blocks, self.block_size)
        keys = hashes[first_block : first_block + num_blocks]
        for block_hash in keys:
            pin = self._pins[block_hash]
            if pin == 0:
                self._num_evictable -= 1
            self._pins[block_hash] = pin + 1
        state = self._state(seq)
        state.seen_blocks.update(range(first_block, first_block + num_blocks))
        state.next_stored_block = first_block + num_blocks
        state.num_jobs += 1
        self._being_loaded.update(keys)
        self._issued.append((keys, seq.request_id, True))
        self.num_hit_blocks += num_blocks

    def offer(self, seq: V1Sequence, num_tokens_after_step: int, num_held_blocks: int) -> None:
        """Offer the prompt blocks a scheduled sequence's tokens complete (through
        ``num_tokens_after_step``) that it has not offered yet (vLLM's ``_build_store_jobs``)."""
        state = self._state(seq)
        num_tokens = min(num_tokens_after_step, seq.num_tokens, seq.request.prompt_tokens)
        end_block = min(num_tokens // self.block_size, num_held_blocks)
        self._offer(seq, state, end_block)

    def _offer(self, seq: V1Sequence, state: _RequestState, end_block: int) -> list[int]:
        """Store ``[next_stored_block, end_block)``: the indices of the blocks a store was
        issued for (one copy)."""
        first_block = state.next_stored_block
        if end_block <= first_block:
            return []
        hashes = seq.block_hashes(end_block, self.block_size)
        pins = self._pins
        new_blocks = []
        for index in range(first_block, end_block):
            pin = pins.get(hashes[index])
            if pin is None:
                new_blocks.append(index)
            if pin != _STORING:
                state.seen_blocks.add(index)
        new_keys = [hashes[index] for index in new_blocks]
        if new_keys and not self._make_room(len(new_keys), set(hashes[first_block:end_block])):
            self.num_dropped_offers += 1
            return []  # retried the next time (next_stored_block stays)
        state.next_stored_block = end_block
        if not new_keys:
            return []
        for block_hash in new_keys:
            pins[block_hash] = _STORING
            self._next_rank += 1
            self._ranks[block_hash] = self._next_rank
        self.num_stored_blocks += len(new_keys)
        state.num_jobs += 1
        self._issued.append((new_keys, seq.request_id, False))
        return new_blocks

    def _make_room(self, num_new: int, protected: set[int]) -> bool:
        """Evict the least recently used readable, unpinned blocks outside ``protected`` to
        make room for ``num_new``; False (nothing evicted) when too few can go."""
        num_to_evict = num_new - (self.num_blocks - len(self._pins))
        if num_to_evict <= 0:
            return True
        if num_to_evict > self._num_evictable:
            return False
        heap = self._evictable_heap
        chosen: list[tuple[int, int]] = []
        chosen_hashes: set[int] = set()
        kept: list[tuple[int, int]] = []
        while heap and len(chosen) < num_to_evict:
            entry = heapq.heappop(heap)
            rank, block_hash = entry
            if self._pins.get(block_hash) != 0 or self._ranks.get(block_hash) != rank:
                continue  # stale
            if block_hash in chosen_hashes:
                continue  # pinned and unpinned again at the same rank: two entries
            if block_hash in protected:
                kept.append(entry)
            else:
                chosen.append(entry)
                chosen_hashes.add(block_hash)
        for entry in kept:
            heapq.heappush(heap, entry)
        if len(chosen) < num_to_evict:
            for entry in chosen:
                heapq.heappush(heap, entry)
            return False
        for _, block_hash in chosen:
            del self._pins[block_hash]
            del self._ranks[block_hash]
        self._num_evictable -= len(chosen)
        return True

    def finished(self, seq: V1Sequence) -> None:
        """The sequence's last token was taken in (before its blocks are freed)."""
        state = self._state(seq)
        state.block_ids = list(seq.blocks)
        self._finished_since_schedule.append(seq)

    def end_schedule(self, allocated_block_ids: set[int]) -> None:
        """After a step's offers (vLLM's ``build_connector_meta``): requests that finished
        since the last step offer their remaining prompt blocks, and their blocks become the
        most recently used. A store whose GPU blocks this step reallocated is copied at once
        (flushed) rather than at the next step's start."""
        for seq in self._finished_since_schedule:
            state = self._states[seq.request_id]
            end_block = seq.request.prompt_tokens // self.block_size
            stored = self._offer(seq, state, min(end_block, len(state.block_ids)))
            if not allocated_block_ids.isdisjoint(state.block_ids[index] for index in stored):
                self._flushed.append(self._issued.pop())
        for seq in self._finished_since_schedule:
            state = self._states[seq.request_id]
            hashes = seq.block_hashes(max(state.seen_blocks, default=-1) + 1, self.block_size)
            self._touch(hashes[index] for index in sorted(state.seen_blocks, reverse=True))
            state.finish_signaled = True
            if not state.num_jobs:
                del self._states[seq.request_id]
        self._finished_since_schedule = []
        self._unanswered.append((self._issued, self._flushed))
        self._issued = []
        self._flushed = []

    def _touch(self, hashes: Iterable[int]) -> None:
        for block_hash in hashes:
            if block_hash not in self._pins:
                continue
            self._next_rank += 1
            self._ranks[block_hash] = self._next_rank
            if self._pins[block_hash] == 0:
                heapq.heappush(self._evictable_heap, (self._next_rank, block_hash))

    def complete_step(
        self, num_unanswered: int = 0, load_done: Callable[[int], bool] | None = None
    ) -> list[int]:
        """Take in the worker's answers to the steps scheduled so far but the last
        ``num_unanswered`` (1 under async scheduling): in each, its loads and flushed stores
        complete, and the stores of the step before it; its own stores wait for the next. A
        load for which ``load_done(request id)`` is False (a copy longer than the step) waits
        for a later answer. The ids of the requests whose load completed."""
        loaded: list[int] = []
        while len(self._unanswered) > num_unanswered:
            issued, flushed = self._unanswered.popleft()
            done_loads: list[_Copy] = []
            still_loading: list[_Copy] = []
            for job in self._loads_in_flight + [job for job in issued if job[2]]:
                done = load_done is None or load_done(job[1])
                (done_loads if done else still_loading).append(job)
            self._loads_in_flight = still_loading
            loaded += self._complete(self._deferred_stores + flushed + done_loads)
            self._deferred_stores = [job for job in issued if not job[2]]
        return loaded

    def _complete(self, completed: list[_Copy]) -> list[int]:
        loaded = []
        pins = self._pins
        for keys, request_id, is_load in completed:
            for block_hash in keys:
                # A store makes its block readable; a load unpins it (neither can be evicted
                # while in flight).
                pin = pins[block_hash] - 1 if is_load else 0
                pins[block_hash] = pin
                if pin == 0:
                    self._num_evictable += 1
                    heapq.heappush(self._evictable_heap, (self._ranks[block_hash], block_hash))
            if is_load:
                self._being_loaded.difference_update(keys)
                loaded.append(request_id)
            state = self._states[request_id]
            state.num_jobs -= 1
            if not state.num_jobs and state.finish_signaled:
                del self._states[request_id]
        return loaded
