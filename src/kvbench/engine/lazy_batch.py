"""The engine's fast path: the running batch with lazy token counts.

Every iteration, every running sequence produces one token. ``LazyBatch`` holds that as a clock:
a running sequence has generated ``offset + tick`` tokens, its allocator holds its KV in a cohort
(``RoundsAllocator``: a round appends a token to every member for O(the blocks it starts or
frees) work), and the iterations at which sequences finish wait in a heap. An iteration then
costs O(what changes in it) (the sequences it admits or finishes, the blocks it starts), not
O(running sequences):

- a quiet stretch (nothing can be admitted) runs until an arrival into an empty queue, or a
  round the pool cannot hold, with O(1) work per iteration and the finishers freed as it goes
  (``CohortAllocator``, whose rounds only take blocks; ``paged_hybrid``'s free blocks behind
  sliding windows, which may admit the head: each of its iterations is one that may admit);
- an iteration that may admit runs the scheduler's admission as the step-by-step loop does,
  after one cohort round for the running sequences.

Whatever else (a preemption, swapped-out sequences, beams, a new request's samples forking, a
copy-on-write) goes to the step-by-step loop: ``step`` writes every count back first
(``deactivate``). The records are identical to the step-by-step loop's (``simulate(fast=False)``).
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar, cast

from kvbench.allocators.base import Allocator, CohortAllocator, RoundsAllocator
from kvbench.engine.arrival_queue import Arrivals
from kvbench.engine.cost_model import CostModel, DecodeTimeFn
from kvbench.engine.iteration import IdleWait, end_iteration, finish_sequence, record_step
from kvbench.engine.records import EXCEEDS_POOL, DecodeRows, StepRecords
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import FCFS, Scheduler, group_seats
from kvbench.engine.sequence import Sequence

_MemberT = TypeVar("_MemberT")


class FinishCalendar(Generic[_MemberT]):
    """When the members of a lazily advanced batch finish: the members finishing in each round
    (iteration), in the order added (running order), and the rounds in a heap."""

    __slots__ = ("_members", "_rounds")

    def __init__(self) -> None:
        self._members: dict[int, list[_MemberT]] = {}
        self._rounds: list[int] = []  # heap of the keys of _members

    def add(self, round_index: int, member: _MemberT) -> None:
        """``member`` finishes in round ``round_index``, after those added for it before."""
        members = self._members.get(round_index)
        if members is None:
            self._members[round_index] = [member]
            heapq.heappush(self._rounds, round_index)
        else:
            members.append(member)

    def first_round(self) -> int:
        """The first round in which a member finishes (the calendar is not empty)."""
        return self._rounds[0]

    def pop(self, round_index: int) -> list[_MemberT]:
        """The members finishing in round ``round_index``, taken out (none if the first round
        is later; an earlier one is an error: a round ran past it)."""
        rounds = self._rounds
        if not rounds or rounds[0] > round_index:
            return []
        if rounds[0] < round_index:
            raise RuntimeError(f"round {round_index} ran past a finish in round {rounds[0]}")
        heapq.heappop(rounds)
        return self._members.pop(round_index)

    def clear(self) -> None:
        """Forget every member."""
        self._members.clear()
        self._rounds.clear()


class LazyBatch:
    """The running batch of one ``simulate`` run, advanced lazily while it can be.

    ``enabled`` is False for an allocator without lazy rounds, and for the ``lpm`` policy
    (the engine then runs step by step). While ``active``, ``Sequence.num_generated`` of
    running sequences and the allocator's token counts are stale: ``deactivate`` writes them
    back.
    """

    def __init__(
        self,
        arrivals: Arrivals,
        scheduler: Scheduler,
        allocator: Allocator,
        cost_model: CostModel,
        steps: StepRecords,
        samples: SampleGroups,
        idle: IdleWait,
    ) -> None:
        # lpm reorders the queue as the cache changes, which a stretch's blocked head assumes
        # it does not: lpm runs step by step (the same records the step loop gives).
        self.enabled = isinstance(allocator, RoundsAllocator) and scheduler.limits.policy == FCFS
        # Quiet stretches need the rounds described ahead, and a head that stays blocked.
        self._stretches = isinstance(allocator, CohortAllocator)
        self.active = False
        self._arrivals = arrivals
        self._scheduler = scheduler
        self._allocator = cast(RoundsAllocator, allocator)
        self._cost_model = cost_model
        self._steps = steps
        self._samples = samples
        # Only an admission iteration can follow an idle wait (nothing ran during it).
        self._idle = idle
        self._tick = 0  # iterations run while active: a running sequence generated offset + tick
        self._finish_tick: dict[Sequence, int] = {}  # running sequence -> tick it finishes at
        self._finishing: FinishCalendar[Sequence] = FinishCalendar()  # by tick
        self._context_tokens = 0  # KV tokens of the running sequences
        self._decode_time_fns: dict[int, DecodeTimeFn] = {}

    def step(self, now_s: float) -> tuple[float, int] | None:
        """Run the next iteration, or a stretch of them; (end time, requests ended), or None
        (counts written back, nothing run) when the step-by-step loop must run it."""
        if not self.active and not self._activate():
            return None
        scheduler = self._scheduler
        allocator = self._allocator
        if not scheduler.running and not scheduler.waiting:
            return now_s, 0
        if allocator.cohort_next_round_blocks() > allocator.num_free_blocks():
            self.deactivate()  # a running sequence cannot grow: preemption
            return None
        memory_blocked = None
        if self._stretches and scheduler.running:
            memory_blocked = _head_blocked(scheduler, allocator)
        if memory_blocked is None:
            return self._admission_iteration(now_s)
        return self._stretch(now_s, memory_blocked)

    def deactivate(self) -> None:
        """Write the running sequences' counts back and leave the cohort."""
        if not self.active:
            return
        running = self._scheduler.running
        tick = self._tick
        finish_tick = self._finish_tick
        for seq in running:
            seq.num_generated = seq.request.output_tokens - (finish_tick[seq] - tick)
        self._allocator.leave_cohort([seq.seq_id for seq in running])
        finish_tick.clear()
        self._finishing.clear()
        self._context_tokens = 0
        self.active = False

    def _activate(self) -> bool:
        scheduler = self._scheduler
        if not self.enabled or scheduler.swapped or self._samples.beams.beams:
            return False  # swap-in and beam steps run step by step
        running = scheduler.running
        if not self._allocator.join_cohort([seq.seq_id for seq in running]):
            return False
        for seq in running:
            self._join(seq)
        self.active = True
        return True

    def _join(self, seq: Sequence) -> None:
        """Start tracking a running sequence (its ``num_generated`` is current)."""
        finish_tick = self._tick + seq.request.output_tokens - seq.num_generated
        self._finish_tick[seq] = finish_tick
        self._finishing.add(finish_tick, seq)
        self._context_tokens += seq.request.prompt_tokens + seq.num_generated

    def _finish_due(self, end_s: float) -> int:
        """Finish the sequences whose last token the iteration ending at ``end_s`` produced, in
        running order; returns the requests that finished."""
        num_finished = 0
        for seq in self._finishing.pop(self._tick):
            del self._finish_tick[seq]
            seq.num_generated = seq.request.output_tokens
            self._context_tokens -= seq.request.prompt_tokens + seq.num_generated
            num_finished += finish_sequence(
                seq, end_s, self._scheduler, self._allocator, self._samples
            )  # free() takes it out of the cohort
        return num_finished

    def _decode_time_fn(self, num_seqs: int) -> DecodeTimeFn:
        decode_time_s = self._decode_time_fns.get(num_seqs)
        if decode_time_s is None:
            decode_time_s = self._cost_model.decode_time_fn(num_seqs)
            self._decode_time_fns[num_seqs] = decode_time_s
        return decode_time_s

    def _admission_iteration(self, now_s: float) -> tuple[float, int]:
        """One iteration as ``Scheduler.schedule`` and the step-by-step loop would run it, when no
        preemption is needed and nothing is swapped out."""
        scheduler = self._scheduler
        allocator = self._allocator
        allocator.advance_cohort(1)  # every running sequence's slot for this iteration's token
        batch, rejected = scheduler.schedule_admissions(allocator)
        for seq in rejected:
            seq.record.mark_rejected(EXCEEDS_POOL)
        prefill = batch.prefill
        if not batch.decode and not prefill:
            return now_s, len(rejected)
        duration_s = record_step(self._steps, batch, now_s, self._context_tokens, scheduler,
                                 allocator, self._cost_model, self._idle)  # fmt: skip
        end_s = now_s + duration_s
        forks = False
        for seq in prefill:
            request = seq.request
            if request.num_samples > 1 or request.beam_width > 1:
                forks = True
        if forks or not allocator.join_cohort([seq.seq_id for seq in prefill]):
            # A new request's samples fork after this token: step by step from here on.
            self.deactivate()
            scheduler.run_admitted(batch)
            return end_s, len(rejected) + end_iteration(
                batch, now_s, end_s, scheduler, allocator, self._samples
            )
        for seq in prefill:
            seq.record.mark_admitted(now_s, seq.num_cached_tokens)
            if seq.num_generated == 0:
                seq.record.mark_first_token(end_s)
            self._join(seq)
        scheduler.run_admitted(batch)
        self._tick += 1
        self._context_tokens += len(scheduler.running)
        return end_s, len(rejected) + self._finish_due(end_s)

    def _stretch(self, now_s: float, memory_blocked: bool) -> tuple[float, int]:
        """Decode-only iterations: rounds up to the first finish (run, and the finishers freed),
        and on past it while nothing waits (the next iteration would decode the smaller batch
        alone), until an arrival into an empty queue or a round the pool cannot hold (not run).
        O(1) work per iteration, O(what changes) per finish."""
        scheduler = self._scheduler
        num_ended, reached_finish = 0, True
        check_first_arrival = False  # the engine queued the arrivals due now
        while reached_finish and scheduler.running:
            now_s, num_rejected, reached_finish = self._decode_rounds(
                now_s, memory_blocked, check_first_arrival
            )
            num_ended += num_rejected
            if reached_finish:
                num_ended += self._finish_due(now_s)
                if scheduler.waiting:
                    break  # the freed seat or memory may admit the head: its own iteration
                memory_blocked, check_first_arrival = False, True
        return now_s, num_ended

    def _decode_rounds(
        self, now_s: float, memory_blocked: bool, check_first_arrival: bool
    ) -> tuple[float, int, bool]:
        """Decode-only iterations of the running batch up to the next finish; (end time, requests
        rejected on arrival, whether the finishing round ran)."""
        scheduler = self._scheduler
        allocator = self._allocator
        arrivals = self._arrivals
        waiting = scheduler.waiting
        num_seqs = len(scheduler.running)
        decode_time_s = self._decode_time_fn(num_seqs)
        # Each round's row goes straight into the step columns (the usage after it from the
        # cohort's rounds: a token state more per sequence, a block more per start).
        block_size = allocator.block_size
        rows = DecodeRows(self._steps, allocator.usage(),
                          cast(CohortAllocator, allocator).cohort_rounds(),
                          num_seqs=num_seqs, block_size=block_size,
                          num_free_slots=allocator.num_free_blocks() * block_size,
                          memory_blocked=memory_blocked)  # fmt: skip
        queue_was_empty = not waiting
        next_arrival_s = arrivals.next_arrival_s()
        context_tokens = self._context_tokens
        num_rejected = 0
        max_rounds = self._finishing.first_round() - self._tick
        while rows.num_rows < max_rounds:
            if (rows.num_rows or check_first_arrival) and next_arrival_s <= now_s:
                if queue_was_empty:
                    break  # the scheduler may admit it: its own iteration decides
                # Behind a blocked head an arrival only waits (or is rejected for good).
                num_rejected += arrivals.admit_until(now_s, scheduler, self._samples)
                next_arrival_s = arrivals.next_arrival_s()
            duration_s = decode_time_s(context_tokens)
            if not rows.append(now_s, duration_s, context_tokens, len(waiting)):
                break  # some sequence cannot grow: preemption, step by step
            now_s += duration_s
            context_tokens += num_seqs
        num_rounds = rows.num_rows
        if not num_rounds:
            return now_s, num_rejected, False
        allocator.advance_cohort(num_rounds)
        rows.complete()
        self._tick += num_rounds
        self._context_tokens = context_tokens
        return now_s, num_rejected, num_rounds == max_rounds


def _head_blocked(scheduler: Scheduler, allocator: Allocator) -> bool | None:
    """Whether the waiting head stays blocked while the running sequences only decode: False
    (blocked by seats or the token budget, or nothing waits), True (blocked for lack of memory:
    the step's ``memory_blocked``), None (it might be admitted: an admission iteration).

    A head blocked now stays blocked: seats and token budget do not change while the batch is the
    same, and decoding only takes free blocks (and evicts cached ones), never gives them back.
    """
    if not scheduler.waiting:
        return False
    limits = scheduler.limits
    num_running = len(scheduler.running)
    head = scheduler.waiting[0]
    if num_running + group_seats(head, limits.max_num_seqs) > limits.max_num_seqs:
        return False
    if head.num_kv_tokens > limits.max_num_batched_tokens - num_running:
        return False
    if allocator.can_admit(head.request, head.num_kv_tokens + 1):
        return None
    return True
