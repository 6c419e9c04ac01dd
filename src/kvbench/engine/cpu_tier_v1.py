"""vLLM v1's CPU offloading (its ``OffloadingConnector`` over the CPU backend): the CPU tier of
``scheduler=vllm_v1`` with ``allocator.cpu_cache_gib`` > 0.

Modelled on vLLM 0.32's ``OffloadingConnectorScheduler``
(``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``) with chunks of one block
(its default) or several (``blocks_per_chunk``), prompt blocks only or generated ones too
(``offload_prompt_only``), and its ``CPUOffloadingManager`` (``v1/kv_offload/cpu/``) with either
cache policy (``cpu_tier_policy_v1``: LRU, its default, or ARC) and its ``store_threshold``, for
one full-attention group; refereed step for step by the real ones (docs/referee.md). It works
the other way from kvbench's ``vllm_v0`` tier (``PrefixCache``):

- **chunks**: the tier's unit is a chunk of ``blocks_per_chunk`` consecutive GPU blocks, named
  by its last block's hash; below, "block" of the tier means chunk. A request hits whole
  chunks from the one its GPU hit ends in, and loads the blocks of them it lacks; a hit shorter
  than a chunk is none;
- **store on compute, inclusive**: each step offers the tier the prompt blocks (all blocks,
  unless ``offload_prompt_only``) its scheduled tokens complete; a block the tier lacks is
  stored (evicting readable blocks the policy picks; when too few are evictable, the whole
  offer is dropped and retried the next time the request is scheduled), while the GPU keeps
  its copy; with a ``store_threshold`` of N >= 2 a block is
  stored only from its N-th offer on (offers counted over requests, in a bounded table);
- a store becomes readable when its copy completes: the worker submits it at the start of the
  next step (one step later when copies are shorter than a step; ``CopyClock`` times them);
  the stores of a request preempted, or of a finished request whose GPU blocks a step
  reallocates, are flushed: that step waits for them;
- **asynchronous loads**: a waiting request whose prefix continues in the tier past its GPU hit
  gets blocks for both and waits outside the batch while they load; a later request whose hit
  is still being stored or loaded is skipped for the step;
- recency: a block is used when stored, and again when the request that stored, found or
  loaded it finishes (its blocks from the last to the first, so a prompt's head is evicted
  last); ARC also tells a block only stored from one reused.

Keys are the GPU cache's block hashes (``V1Sequence.block_hashes``): the same prefix names the
same block in both tiers (a chunk: its last block's).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvbench.engine.cpu_tier_policy_v1 import EVICTION_POLICIES, make_eviction_policy
from kvbench.engine.kv_cache_v1 import V1Sequence

_STORING = -1  # a chunk's pin count while its store is in flight: not readable, not evictable
CopyDone = Callable[[int], bool]  # whether the copy of a job id had completed by the answer


class _Copy:
    """One copy job (vLLM's ``TransferJob``): chunks of a request stored to the tier or loaded
    from it."""

    __slots__ = ("block_indices", "is_load", "job_id", "keys", "request_id")

    def __init__(self, job_id: int, keys: list[int], request_id: int, is_load: bool,
                 block_indices: list[int]) -> None:  # fmt: skip
        self.job_id = job_id
        self.keys = keys  # chunk keys
        self.request_id = request_id
        self.is_load = is_load
        self.block_indices = block_indices  # the GPU blocks it copies, in the request's blocks


@dataclass(frozen=True)
class StepCopies:
    """The copies vLLM's worker submits at the start of a step (``handle_preemptions``, then
    ``start_kv_transfers``), each (job id, tokens), in submission order.

    Attributes:
        stores: the stores the step before issued, then the ones this step issued and flushes.
        loads: the loads this step issued.
        wait_job_ids: the stores this step flushes (the worker waits for them before the
            forward pass): those of requests it preempted, of finished requests whose GPU blocks
            it reallocated, and its own flushed ones.
    """

    stores: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[int, int]] = field(default_factory=list)
    wait_job_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class CpuTierPolicy:
    """vLLM's ``kv_connector_extra_config`` options of the tier that kvbench models.

    Attributes:
        eviction_policy: ``lru`` (vLLM's default) or ``arc`` (``cpu_tier_policy_v1``).
        store_threshold: N >= 2: a block is stored from the N-th time a request offers it
            (vLLM's reuse filter); 0 or 1: at its first offer (vLLM's default 0).
        max_tracker_size: blocks whose offers the filter counts (vLLM's default 64,000): a
            block offered when the table is full replaces the least recently offered one.
        offload_prompt_only: store prompt blocks only (vLLM's default); False: generated
            tokens' blocks too, up to the last token whose K/V is computed.
        blocks_per_chunk: GPU blocks in one of the tier's chunks, its unit of storage,
            lookup and eviction (vLLM's default 1; its ``block_size`` option in tokens is this
            times the GPU block size).
    """

    eviction_policy: str = "lru"
    store_threshold: int = 0
    max_tracker_size: int = 64_000
    offload_prompt_only: bool = True
    blocks_per_chunk: int = 1

    def __post_init__(self) -> None:
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy={self.eviction_policy!r}: one of "
                             f"{', '.join(EVICTION_POLICIES)}")  # fmt: skip
        if self.store_threshold < 0:
            raise ValueError(f"store_threshold={self.store_threshold}: must be >= 0")
        if self.max_tracker_size < 1:
            raise ValueError(f"max_tracker_size={self.max_tracker_size}: must be >= 1")
        if self.blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk={self.blocks_per_chunk}: must be >= 1")


VLLM_DEFAULTS = CpuTierPolicy()  # what --kv-offloading-size runs


class _RequestState:
    """What the connector remembers of one request (vLLM's ``RequestOffloadState``); chunks
    by index in the request."""

    __slots__ = ("block_ids", "finish_signaled", "inserted_chunks", "next_stored_chunk",
                 "num_jobs", "reused_chunks", "seen_chunks", "store_miss_chunks")  # fmt: skip

    def __init__(self) -> None:
        self.next_stored_chunk = 0
        self.seen_chunks: set[int] = set()  # the chunks it offered as new, found, or loaded
        self.inserted_chunks: set[int] = set()  # of those, the ones it stored
        self.reused_chunks: set[int] = set()  # found readable or loaded, not stored by it
        self.store_miss_chunks: set[int] = set()  # offered as new (a policy learns once)
        self.num_jobs = 0  # copies in flight (one load, or stores)
        self.finish_signaled = False  # its finish was seen by a step's schedule
        self.block_ids: list[int] = []  # its GPU blocks when it finished


class CpuOffloadTier:
    """``num_chunks`` chunks of ``policy.blocks_per_chunk`` blocks of host memory holding
    prompt blocks, and generated ones unless ``policy.offload_prompt_only`` (store on compute,
    evicting by ``policy``).

    The scheduler calls it as vLLM's scheduler calls its connector, counting in GPU blocks:
    ``lookup`` and ``start_load`` at a waiting request's admission, ``preempted`` at a
    preemption, ``offer`` for every scheduled request after a step is scheduled, ``finished``
    when a request's last token is taken in, ``end_schedule`` once a step's stores are offered,
    and ``complete_step`` with the model runner's answer.

    Attributes:
        num_stored_blocks: GPU blocks stored into it (whole chunks).
        num_dropped_offers: offers dropped for want of evictable blocks.
        last_copies: what the worker copies at the start of the step last scheduled.
    """

    def __init__(
        self, num_chunks: int, block_size: int, policy: CpuTierPolicy = VLLM_DEFAULTS
    ) -> None:
        if num_chunks < 1:
            raise ValueError(f"num_chunks={num_chunks}: a CPU tier holds >= 1 chunk")
        self.num_chunks = num_chunks
        self.block_size = block_size
        self.blocks_per_chunk = policy.blocks_per_chunk
        self.num_stored_blocks = 0
        self.num_dropped_offers = 0
        self._pins: dict[int, int] = {}  # chunk key -> pin count (_STORING: being stored)
        self._policy = make_eviction_policy(policy.eviction_policy, num_chunks, self._pins)
        self._num_evictable = 0
        self._store_threshold = policy.store_threshold
        self._offload_prompt_only = policy.offload_prompt_only
        self._max_tracker_size = policy.max_tracker_size
        # chunk key -> times offered, least recently offered first (a store_threshold >= 2)
        self._offer_counts: OrderedDict[int, int] | None = (
            OrderedDict() if policy.store_threshold >= 2 else None
        )
        self._states: dict[int, _RequestState] = {}  # request id -> state
        self._being_loaded: set[int] = set()
        self._num_jobs_issued = 0  # the next job id
        # Copies issued by the step being scheduled (its flushed stores apart); those of the
        # steps whose answer is not taken in yet (its loads and flushed stores complete in it);
        # the stores of the last step taken in (they complete in the next); copies an answer
        # found still running (long copies).
        self._issued: list[_Copy] = []
        self._flushed: list[_Copy] = []
        self._unanswered: deque[tuple[list[_Copy], list[_Copy]]] = deque()
        self._deferred_stores: list[_Copy] = []
        self._stores_in_flight: list[_Copy] = []
        self._loads_in_flight: list[_Copy] = []
        self._stores_to_submit: list[_Copy] = []  # the last step's: submitted at the next one
        self._store_jobs: dict[int, _Copy] = {}  # every store not completed, by job id
        self._finished_since_schedule: list[V1Sequence] = []
        self._preempted_since_schedule: set[int] = set()
        self.last_copies = StepCopies()

    @property
    def has_copies_in_flight(self) -> bool:
        """Whether a copy is still to complete (a request waiting on it runs later)."""
        if self._deferred_stores or self._stores_in_flight or self._loads_in_flight:
            return True
        return any(issued or flushed for issued, flushed in self._unanswered)

    @property
    def has_finished_to_signal(self) -> bool:
        """Whether requests finished since the last schedule: vLLM schedules once more, even
        with no request left, to tell its workers (their last prompt blocks are offered then)."""
        return bool(self._finished_since_schedule)

    @property
    def num_held_chunks(self) -> int:
        """Chunks the tier holds, stores in flight included."""
        return len(self._pins)

    def _state(self, seq: V1Sequence) -> _RequestState:
        state = self._states.get(seq.request_id)
        if state is None:
            state = self._states[seq.request_id] = _RequestState()
        return state

    def _chunk_keys(self, seq: V1Sequence, end_chunk: int, first_chunk: int = 0) -> list[int]:
        """The keys of the sequence's chunks ``[first_chunk, end_chunk)``: each its last
        block's hash (vLLM's ``offload_keys``)."""
        per_chunk = self.blocks_per_chunk
        num_blocks = end_chunk * per_chunk
        hashes = seq.block_hashes(num_blocks, self.block_size)
        return hashes[(first_chunk + 1) * per_chunk - 1 : num_blocks : per_chunk]

    def lookup(self, seq: V1Sequence, first_block: int) -> int | None:
        """GPU blocks from ``first_block`` on (where the GPU hit ends) that the tier holds
        readable: whole chunks from the one that block is in, up to the first miss, within the
        sequence's full chunks (vLLM: prompt and taken-in tokens); 0 when that is less than a
        chunk. None when the request must wait a step (vLLM's connector defers it): copies of
        its own are in flight, or a hit chunk is still being stored, or being loaded for
        another request."""
        if self._state(seq).num_jobs:
            return None
        per_chunk = self.blocks_per_chunk
        num_full_chunks = seq.num_tokens // (self.block_size * per_chunk)
        if num_full_chunks * per_chunk - first_block < per_chunk:
            return 0
        first_chunk = first_block // per_chunk
        keys = self._chunk_keys(seq, num_full_chunks, first_chunk)
        pins = self._pins
        num_hits = 0
        deferred = False
        for key in keys:
            pin = pins.get(key)
            if pin is None:
                break
            deferred |= pin == _STORING
            num_hits += 1
        if deferred:
            return None
        num_hit_blocks = (first_chunk + num_hits) * per_chunk - first_block
        if num_hit_blocks < per_chunk:
            return 0
        if not self._being_loaded.isdisjoint(keys[:num_hits]):
            return None
        return num_hit_blocks

    def start_load(self, seq: V1Sequence, first_block: int, num_blocks: int) -> None:
        """Load the ``num_blocks`` blocks ``lookup`` found into the sequence's fresh blocks (of
        the chunk ``first_block`` is in, those from it on): pin their chunks until the copy
        completes (this step's end)."""
        per_chunk = self.blocks_per_chunk
        first_chunk = first_block // per_chunk
        end_chunk = (first_block + num_blocks) // per_chunk
        keys = self._chunk_keys(seq, end_chunk, first_chunk)
        for key in keys:
            pin = self._pins[key]
            if pin == 0:
                self._num_evictable -= 1
            self._pins[key] = pin + 1
        state = self._state(seq)
        loaded_chunks = range(first_chunk, end_chunk)
        state.seen_chunks.update(loaded_chunks)
        # A chunk it stored itself before a preemption is no reuse.
        state.reused_chunks.update(set(loaded_chunks) - state.inserted_chunks)
        state.next_stored_chunk = end_chunk
        state.num_jobs += 1
        self._being_loaded.update(keys)
        loaded_blocks = list(range(first_block, first_block + num_blocks))
        self._issued.append(self._new_copy(keys, seq.request_id, True, loaded_blocks))

    def _new_copy(self, keys: list[int], request_id: int, is_load: bool,
                  block_indices: list[int]) -> _Copy:  # fmt: skip
        job = _Copy(self._num_jobs_issued, keys, request_id, is_load, block_indices)
        self._num_jobs_issued += 1
        return job

    def preempted(self, seq: V1Sequence) -> None:
        """The scheduler preempted the sequence in the step it is scheduling: its stores still
        in flight are flushed."""
        self._preempted_since_schedule.add(seq.request_id)

    def offer(self, seq: V1Sequence, num_tokens_after_step: int, num_held_blocks: int) -> None:
        """Offer the prompt chunks (all chunks, unless ``offload_prompt_only``) a scheduled
        sequence's tokens complete (through ``num_tokens_after_step``) within its
        ``num_held_blocks`` GPU blocks that it has not offered yet (vLLM's
        ``_build_store_jobs``)."""
        state = self._state(seq)
        num_tokens = min(num_tokens_after_step, seq.num_tokens)
        if self._offload_prompt_only:
            num_tokens = min(num_tokens, seq.request.prompt_tokens)
        self._offer(seq, state, self._num_storable_chunks(num_tokens, num_held_blocks))

    def _num_storable_chunks(self, num_tokens: int, num_held_blocks: int) -> int:
        """Chunks full within ``num_tokens`` tokens and ``num_held_blocks`` GPU blocks."""
        per_chunk = self.blocks_per_chunk
        return min(num_tokens // (self.block_size * per_chunk), num_held_blocks // per_chunk)

    def _offer(self, seq: V1Sequence, state: _RequestState, end_chunk: int) -> list[int]:
        """Store ``[next_stored_chunk, end_chunk)``: the GPU blocks (by index in the request)
        of the chunks a store was issued for (one copy)."""
        first_chunk = state.next_stored_chunk
        if end_chunk <= first_chunk:
            return []
        keys = self._chunk_keys(seq, end_chunk)
        offered = keys[first_chunk:end_chunk]
        if self._offer_counts is not None:
            self._count_offers(offered)
        pins = self._pins
        new_chunks = []
        for index in range(first_chunk, end_chunk):
            pin = pins.get(keys[index])
            if pin is None:
                new_chunks.append(index)
            elif pin != _STORING:
                state.seen_chunks.add(index)
                if index not in state.inserted_chunks:
                    state.reused_chunks.add(index)
        if self._offer_counts is not None:  # offered too few times: as if it were not new
            counts = self._offer_counts
            threshold = self._store_threshold
            new_chunks = [index for index in new_chunks if counts.get(keys[index], 0) >= threshold]
        state.seen_chunks.update(new_chunks)
        first_misses = [index for index in new_chunks if index not in state.store_miss_chunks]
        if first_misses:  # even if the offer is dropped
            self._policy.on_store_miss([keys[index] for index in first_misses])
            state.store_miss_chunks.update(first_misses)
        new_keys = [keys[index] for index in new_chunks]
        if new_keys and not self._make_room(len(new_keys), set(offered)):
            self.num_dropped_offers += 1
            return []  # retried the next time (next_stored_chunk stays)
        state.next_stored_chunk = end_chunk
        if not new_keys:
            return []
        for key in new_keys:
            pins[key] = _STORING
            self._policy.insert(key)
        state.inserted_chunks.update(new_chunks)
        per_chunk = self.blocks_per_chunk
        new_blocks = [index * per_chunk + offset
                      for index in new_chunks for offset in range(per_chunk)]  # fmt: skip
        self.num_stored_blocks += len(new_blocks)
        state.num_jobs += 1
        job = self._new_copy(new_keys, seq.request_id, False, new_blocks)
        self._store_jobs[job.job_id] = job
        self._issued.append(job)
        return new_blocks

    def _count_offers(self, hashes: list[int]) -> None:
        """Count one offer of each block (vLLM's ``_record_accesses``): a block already counted
        becomes the most recently offered; a new one, when the table is full, replaces the
        least recently offered block this offer did not count (or is not counted)."""
        counts = self._offer_counts
        assert counts is not None
        num_counted_now = 0
        for block_hash in hashes:
            if block_hash in counts:
                counts.move_to_end(block_hash)
                counts[block_hash] += 1
                num_counted_now += 1
        num_forgettable = len(counts) - num_counted_now
        for block_hash in hashes:
            if block_hash in counts:
                continue
            if len(counts) >= self._max_tracker_size:
                if not num_forgettable:
                    continue
                counts.popitem(last=False)
                num_forgettable -= 1
            counts[block_hash] = 1

    def _make_room(self, num_new: int, protected: set[int]) -> bool:
        """Evict readable, unpinned blocks outside ``protected`` (the policy's choice) to make
        room for ``num_new``; False (nothing evicted) when too few can go."""
        num_to_evict = num_new - (self.num_chunks - len(self._pins))
        if num_to_evict <= 0:
            return True
        if num_to_evict > self._num_evictable:
            return False
        evicted = self._policy.evict(num_to_evict, protected)
        if evicted is None:
            return False
        for block_hash in evicted:
            del self._pins[block_hash]
        self._num_evictable -= len(evicted)
        return True

    def finished(self, seq: V1Sequence) -> None:
        """The sequence's last token was taken in (before its blocks are freed)."""
        state = self._state(seq)
        state.block_ids = list(seq.blocks)
        self._finished_since_schedule.append(seq)

    def end_schedule(self, allocated_block_ids: set[int]) -> None:
        """After a step's offers (vLLM's ``build_connector_meta``): requests that finished
        since the last step offer their remaining blocks (prompt blocks only, or through their
        last computed token), and their blocks become the most recently used. A store whose GPU
        blocks this step reallocated is copied at once (flushed) rather than at the next step's
        start; so are the stores in flight of the requests the step preempted, or whose GPU
        blocks it reallocated (``last_copies``)."""
        wait_job_ids = self._stores_to_flush(allocated_block_ids)
        for seq in self._finished_since_schedule:
            state = self._states[seq.request_id]
            # vLLM stores up to the last token whose K/V was computed (not the last sampled).
            end_tokens = seq.request.prompt_tokens
            if not self._offload_prompt_only:
                end_tokens = max(end_tokens, seq.num_tokens - 1)
            end_chunk = self._num_storable_chunks(end_tokens, len(state.block_ids))
            stored = self._offer(seq, state, end_chunk)
            if not allocated_block_ids.isdisjoint(state.block_ids[index] for index in stored):
                self._flushed.append(self._issued.pop())
        wait_job_ids += [job.job_id for job in self._flushed]
        block_size = self.block_size
        self.last_copies = StepCopies(
            stores=[(job.job_id, len(job.block_indices) * block_size)
                    for job in self._stores_to_submit + self._flushed],
            loads=[(job.job_id, len(job.block_indices) * block_size)
                   for job in self._issued if job.is_load],
            wait_job_ids=wait_job_ids,
        )  # fmt: skip
        self._stores_to_submit = [job for job in self._issued if not job.is_load]
        self._preempted_since_schedule.clear()
        for seq in self._finished_since_schedule:
            state = self._states[seq.request_id]
            self._request_finished(seq, state)
            state.finish_signaled = True
            if not state.num_jobs:
                del self._states[seq.request_id]
        self._finished_since_schedule = []
        self._unanswered.append((self._issued, self._flushed))
        self._issued = []
        self._flushed = []

    def _stores_to_flush(self, allocated_block_ids: set[int]) -> list[int]:
        """The stores in flight, issued by earlier steps, of requests this step preempted or of
        finished requests one of whose stored GPU blocks it reallocated (vLLM's
        ``_block_id_to_pending_jobs``)."""
        preempted = self._preempted_since_schedule
        if not (preempted or allocated_block_ids) or not self._store_jobs:
            return []
        flushed = []
        for job in self._store_jobs.values():
            if job.request_id in preempted:
                flushed.append(job.job_id)
                continue
            block_ids = self._states[job.request_id].block_ids  # set when it finished
            if block_ids and not allocated_block_ids.isdisjoint(
                block_ids[index] for index in job.block_indices
            ):
                flushed.append(job.job_id)
        return flushed

    def _request_finished(self, seq: V1Sequence, state: _RequestState) -> None:
        """Tell the policy what the request did with each chunk it saw, tail to head."""
        keys = self._chunk_keys(seq, max(state.seen_chunks, default=-1) + 1)
        reused = state.reused_chunks
        self._policy.on_request_finished(
            [keys[index] for index in sorted(state.seen_chunks, reverse=True)],
            {keys[index] for index in state.inserted_chunks - reused},
            {keys[index] for index in reused},
        )

    def complete_step(
        self, num_unanswered: int = 0, copy_done: CopyDone | None = None
    ) -> list[int]:
        """Take in the worker's answers to the steps scheduled so far but the last
        ``num_unanswered`` (1 under async scheduling): in each, its loads and flushed stores
        complete, and the stores of the step before it; its own stores wait for the next. A
        copy for which ``copy_done(job id)`` is False (longer than its step, on the caller's
        clock: ``CopyClock.done``) waits for a later answer; None: every copy is shorter than a
        step (the referee's worker). The ids of the requests whose load completed."""
        loaded: list[int] = []
        while len(self._unanswered) > num_unanswered:
            issued, flushed = self._unanswered.popleft()
            stores = self._stores_in_flight + self._deferred_stores + flushed
            done_stores, self._stores_in_flight = _split_done(stores, copy_done)
            loads = self._loads_in_flight + [job for job in issued if job.is_load]
            done_loads, self._loads_in_flight = _split_done(loads, copy_done)
            loaded += self._complete(done_stores + done_loads)
            self._deferred_stores = [job for job in issued if not job.is_load]
        return loaded

    def _complete(self, completed: list[_Copy]) -> list[int]:
        loaded = []
        pins = self._pins
        for job in completed:
            keys, request_id, is_load = job.keys, job.request_id, job.is_load
            if not is_load:
                del self._store_jobs[job.job_id]
            for block_hash in keys:
                # A store makes its block readable; a load unpins it (neither can be evicted
                # while in flight).
                pin = pins[block_hash] - 1 if is_load else 0
                pins[block_hash] = pin
                if pin == 0:
                    self._num_evictable += 1
            if is_load:
                self._being_loaded.difference_update(keys)
                loaded.append(request_id)
            state = self._states[request_id]
            state.num_jobs -= 1
            if not state.num_jobs and state.finish_signaled:
                del self._states[request_id]
        return loaded


def _split_done(jobs: list[_Copy], copy_done: CopyDone | None) -> tuple[list[_Copy], list[_Copy]]:
    """(the jobs whose copy completed, the others), each in order."""
    if copy_done is None:
        return jobs, []
    done: list[_Copy] = []
    running: list[_Copy] = []
    for job in jobs:
        (done if copy_done(job.job_id) else running).append(job)
    return done, running


class CopyClock:
    """When the tier's copies complete on a clock, as vLLM's offloading worker runs them.

    Each direction (stores to the host, loads from it) copies one job at a time in the order
    submitted (``SingleDirectionOffloadingHandler``), each for ``copy_time_s`` of its tokens. At
    a step's start (``submit``) the worker submits the stores the step before issued and the
    ones this step flushes, waits for the flushed ones (the step starts when they end), then
    submits this step's loads. It reports a copy with the first step that ends after it, which
    the scheduler takes in before the next step (a step later under async scheduling)."""

    def __init__(self, copy_time_s: Callable[[int], float], async_scheduling: bool) -> None:
        self._copy_time_s = copy_time_s
        self._async_scheduling = async_scheduling
        self._end_s: dict[int, float] = {}  # job id -> when its copy ends (until reported)
        self._store_free_s = 0.0
        self._load_free_s = 0.0
        self._answered_by_s = 0.0
        self._last_start_s = 0.0

    def before_step(self, now_s: float) -> None:
        """A step starts at ``now_s``: the answer it takes in first is that of the step that
        ended then (async: of the step before, which ended when the last one started)."""
        self._answered_by_s = self._last_start_s if self._async_scheduling else now_s
        self._last_start_s = now_s

    def done(self, job_id: int) -> bool:
        """Whether the job's copy had ended by the answer taken in (asked until it has, then
        forgotten)."""
        if self._end_s[job_id] > self._answered_by_s:
            return False
        del self._end_s[job_id]
        return True

    def submit(self, copies: StepCopies, now_s: float) -> float:
        """The step scheduled at ``now_s`` submits ``copies``: when it starts computing (later
        than ``now_s`` when it waits for flushed stores)."""
        free_s = self._store_free_s
        for job_id, num_tokens in copies.stores:
            free_s = self._end_s[job_id] = max(free_s, now_s) + self._copy_time_s(num_tokens)
        self._store_free_s = free_s
        # A flushed store already reported (forgotten) is not waited for.
        ends_s = (self._end_s.get(job_id, now_s) for job_id in copies.wait_job_ids)
        start_s = max([now_s, *ends_s])
        free_s = self._load_free_s
        for job_id, num_tokens in copies.loads:
            free_s = self._end_s[job_id] = max(free_s, start_s) + self._copy_time_s(num_tokens)
        self._load_free_s = free_s
        return start_s

    def next_end_s(self, now_s: float) -> float | None:
        """When the first copy still running at ``now_s`` ends (None: none is)."""
        return min((end_s for end_s in self._end_s.values() if end_s > now_s), default=None)
