"""The engine's fast path: run a stretch of decode-only iterations at once.

Between events that change the schedule (an arrival the scheduler could admit, a finish, a
preemption, a copy-on-write, a beam reorganization), every iteration runs the same sequences,
each appending one token. ``run_decode_stretch`` finds how many such iterations come next and
produces their records in one go: the same times (the same float operations in the same order),
the same usage, the same allocator state as the step-by-step loop (``simulate(fast=False)``),
but with O(1) work per iteration instead of a scheduler pass and an allocator call per sequence.
An iteration whose waiting head could be admitted, or that needs anything else, is left to the
step-by-step loop.
"""

from __future__ import annotations

from kvbench.allocators.base import Allocator, DecodeRounds, MemoryUsage
from kvbench.engine.arrivals import Arrivals
from kvbench.engine.cost_model import RooflineCostModel
from kvbench.engine.finish import finish_sequence
from kvbench.engine.records import StepRecords
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.sequence import Sequence


def head_blocked(scheduler: Scheduler, allocator: Allocator) -> bool | None:
    """Whether the waiting head stays blocked while the running sequences only decode: False
    (blocked by seats or the token budget, or nothing waits), True (blocked for lack of memory:
    the step's ``memory_blocked``), None (it might be admitted: not a quiet stretch).

    A head blocked now stays blocked: seats and token budget do not change while the batch is the
    same, and decoding only takes free blocks (and evicts cached ones), never gives them back.
    """
    if not scheduler.waiting:
        return False
    limits = scheduler.limits
    num_running = len(scheduler.running)
    if num_running >= limits.max_num_seqs:
        return False
    head = scheduler.waiting[0]
    if head.num_kv_tokens > limits.max_num_batched_tokens - num_running:
        return False
    if allocator.can_admit(head.request, head.num_kv_tokens + 1):
        return None
    return True


def _plan(
    running: list[Sequence], allocator: Allocator
) -> tuple[list[int], DecodeRounds, int, int] | None:
    """(sequence ids, the allocator's rounds, most rounds before a sequence finishes, summed
    context tokens), or None when the running sequences cannot run as a stretch."""
    seq_ids = []
    context_tokens = 0
    rounds_to_finish = allocator.num_slots + 1
    for seq in running:
        request = seq.request
        if request.beam_width > 1:
            return None  # beams reorganize after every step
        seq_ids.append(seq.seq_id)
        context_tokens += request.prompt_tokens + seq.num_generated  # seq.num_kv_tokens
        rounds_to_finish = min(rounds_to_finish, request.output_tokens - seq.num_generated)
    rounds = allocator.decode_rounds(seq_ids)
    if rounds is None:
        return None
    return seq_ids, rounds, min(rounds.max_rounds, rounds_to_finish), context_tokens


def run_decode_stretch(
    now_s: float,
    arrivals: Arrivals,
    scheduler: Scheduler,
    allocator: Allocator,
    cost_model: RooflineCostModel,
    steps: StepRecords,
    samples: SampleGroups,
) -> tuple[float, int] | None:
    """Run the decode-only iterations that come next; (end time, requests ended) or None.

    Called at the start of an iteration, once the arrivals due by ``now_s`` are queued. None
    (nothing changed) when the next iteration is not a quiet decode. Otherwise runs iterations
    until one would differ: a sequence finishes (the last one run), a request arrives into an empty
    queue, or the pool has no block for the next round.
    """
    running = scheduler.running
    if not running or scheduler.swapped:
        return None
    memory_blocked = head_blocked(scheduler, allocator)
    if memory_blocked is None:
        return None
    plan = _plan(running, allocator)
    if plan is None or plan[2] < 1:
        return None
    seq_ids, rounds, max_rounds, context_tokens = plan
    block_size = allocator.block_size
    num_free_blocks = allocator.usage().free // block_size
    new_blocks = rounds.new_blocks
    period = len(new_blocks)
    queue_was_empty = not scheduler.waiting
    num_seqs = len(running)
    decode_time_s = cost_model.decode_time_fn(num_seqs)

    times_s: list[float] = []
    durations_s: list[float] = []
    num_blocks_taken: list[int] = []  # new blocks since the stretch began, after each round
    num_waiting: list[int] = []
    num_rejected = 0
    num_taken = 0
    for round_index in range(max_rounds):
        if round_index and arrivals.next_arrival_s() <= now_s:
            if queue_was_empty:
                break  # the scheduler may admit it: the step-by-step loop decides
            # Behind a blocked head an arrival only waits (or is rejected for good).
            num_rejected += arrivals.admit_until(now_s, scheduler, samples)
        num_taken_next = num_taken + new_blocks[round_index % period]
        if num_taken_next > num_free_blocks:
            break  # some sequence cannot grow: preemption, step by step
        num_taken = num_taken_next
        duration_s = decode_time_s(context_tokens)
        times_s.append(now_s)
        durations_s.append(duration_s)
        num_blocks_taken.append(num_taken)
        num_waiting.append(len(scheduler.waiting))
        now_s += duration_s
        context_tokens += num_seqs
    num_rounds = len(times_s)
    if num_rounds == 0:
        return None
    usage = allocator.usage()  # before the stretch's appends
    allocator.append_rounds(seq_ids, num_rounds)
    steps.extend(
        _stretch_columns(
            usage, rounds, block_size, num_seqs, memory_blocked,
            times_s, durations_s, num_blocks_taken, num_waiting,
        )
    )
    done = []
    for seq in running:
        seq.num_generated += num_rounds
        if seq.num_generated >= seq.request.output_tokens:  # seq.is_done
            done.append(seq)
    # Released in batch order, as the step-by-step loop does.
    num_finished = sum(
        finish_sequence(seq, now_s, scheduler, allocator, samples) for seq in done
    )
    return now_s, num_rejected + num_finished


def _stretch_columns(
    usage: MemoryUsage,
    rounds: DecodeRounds,
    block_size: int,
    num_seqs: int,
    memory_blocked: bool,
    times_s: list[float],
    durations_s: list[float],
    num_blocks_taken: list[int],
    num_waiting: list[int],
) -> dict[str, list]:
    """The step records of the stretch's iterations (the usage after each one's appends)."""
    num_rounds = len(times_s)
    held_slots = usage.token_states + usage.reservation + usage.internal_frag
    internal_frag = usage.internal_frag
    token_states: list[int] = []
    reservation: list[int] = []
    internal_frags: list[int] = []
    external_frag: list[int] = []
    free: list[int] = []
    for round_index in range(num_rounds):
        taken_slots = num_blocks_taken[round_index] * block_size
        internal_frag += rounds.internal_frag_slots.get(round_index, 0)
        states = usage.token_states + (round_index + 1) * num_seqs
        free_slots = usage.free - taken_slots
        token_states.append(states)
        internal_frags.append(internal_frag)
        reservation.append(held_slots + taken_slots - states - internal_frag)
        if memory_blocked:  # as MemoryUsage.with_free_blocked
            external_frag.append(usage.external_frag + free_slots)
            free.append(0)
        else:
            external_frag.append(usage.external_frag)
            free.append(free_slots)
    return {
        "time_s": times_s,
        "duration_s": durations_s,
        "batch_size": [num_seqs] * num_rounds,
        "num_prefill_seqs": [0] * num_rounds,
        "num_prefill_tokens": [0] * num_rounds,
        "num_decode_tokens": [num_seqs] * num_rounds,
        "num_waiting": num_waiting,
        "num_swapped": [0] * num_rounds,
        "num_preempted": [0] * num_rounds,
        "memory_blocked": [memory_blocked] * num_rounds,
        "token_states_slots": token_states,
        "reservation_slots": reservation,
        "internal_frag_slots": internal_frags,
        "external_frag_slots": external_frag,
        "free_slots": free,
        "shared_slots": [usage.shared_slots] * num_rounds,
        "saved_slots": [usage.saved_slots] * num_rounds,
    }
