"""``simulate_v1``: replay requests through vLLM v1's policy (``scheduler=vllm_v1``) on the clock.

The loop of ``engine.simulate`` for ``engine.scheduler_v1``: requests join the waiting queue when
the clock passes their arrival (an idle engine jumps to the next one), each step is one
``V1StepScheduler.step`` priced by the cost model, and the records are the same ``RequestRecord``
and ``StepRecords`` rows, so requests.parquet, steps.parquet, the summary and the charts work
unchanged. Pure and deterministic.

A step's price: every prefill chunk's tokens attend to their context (the tokens before them, hits
included, and the chunk's earlier tokens), a decode token to the whole sequence; the step is one
iteration of the cost model with those prefill tokens and decode tokens. A request's first token
comes out at the end of the step whose chunk completes its prompt, its last at the end of the step
that samples it. Under async scheduling (``V1Limits.async_scheduling``) the step that takes that
last token in, and frees the request's memory, is the next one; a step that schedules nothing and
only takes tokens in costs no time and writes no step row (vLLM runs no model for it). With a
CPU tier (``engine.cpu_tier_v1``) its copies run beside the steps for their PCIe time
(``swap_time_s``), one at a time in each direction (``CopyClock``): a load delays its request, a
store the moment its blocks become readable, and a flushed store the step that waits for it.
With ``fast``, the running requests that only decode advance lazily (``engine.decoders_v1``): a
step costs O(what else it schedules), and the steps that only decode run as stretches
(``V1StepScheduler.decode_stretch``, ``_run_decode_stretch``), O(1) a step; the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence as SequenceOf

from kvbench.core.request import Request
from kvbench.engine.arrival_queue import Arrivals
from kvbench.engine.cost_model import CostModel, IterationShape
from kvbench.engine.cpu_tier_v1 import CopyClock, StepCopies
from kvbench.engine.iteration import IdleWait
from kvbench.engine.kv_cache_v1 import V1KVCache
from kvbench.engine.records import (
    EMPTY_PROMPT,
    EXCEEDS_MAX_MODEL_LEN,
    EXCEEDS_POOL,
    PROMPT_EXCEEDS_MAX_MODEL_LEN,
    DecodeRows,
    RequestRecord,
    SimulationResult,
    StepRecords,
    StepSink,
    request_record,
)
from kvbench.engine.scheduler_v1 import (
    DecodeStretch,
    V1Batch,
    V1Limits,
    V1Memory,
    V1Step,
    V1StepScheduler,
)

ProgressCallback = Callable[[int], None]


def v1_rejection_reason(request: Request, limits: V1Limits, num_pool_slots: int) -> str:
    """Why ``request`` can never run under vLLM v1 (one of ``records.REJECT_REASONS``), or ''.

    As vLLM: an empty prompt, or one that leaves no room for an output token within
    ``max_model_len``; a prompt longer than ``max_num_batched_tokens`` is served in chunks. Beyond
    vLLM, which would preempt such a request forever: one whose whole sequence needs more than
    the pool (``num_pool_slots``, in the allocator's own reservation for a contiguous one).
    """
    if request.prompt_tokens == 0:
        return EMPTY_PROMPT
    if request.prompt_tokens >= limits.max_model_len:
        return PROMPT_EXCEEDS_MAX_MODEL_LEN
    if request.total_tokens > limits.max_model_len:
        return EXCEEDS_MAX_MODEL_LEN
    if request.total_tokens > num_pool_slots:
        return EXCEEDS_POOL
    return ""


def simulate_v1(
    requests: SequenceOf[Request],
    memory: V1Memory,
    limits: V1Limits,
    cost_model: CostModel,
    num_pool_slots: int,
    on_finish: ProgressCallback | None = None,
    *,
    step_sink: StepSink | None = None,
    fast: bool = True,
) -> SimulationResult:
    """Serve ``requests`` under vLLM v1's policy over ``memory`` and record every step and request.

    ``num_pool_slots`` is the most one request may ever hold (``v1_rejection_reason``); the
    records are ``simulate``'s (``on_finish`` and ``step_sink`` as there); ``fast=False`` runs
    every token through the KV manager (``V1StepScheduler``'s reference), with identical records.
    """
    scheduler = V1StepScheduler(memory, limits, record_usage=True, fast=fast, lazy=fast)
    arrivals = _Arrivals(requests, scheduler, num_pool_slots)
    record_of = arrivals.record_of
    steps = StepRecords(sink=step_sink, block_size=memory.block_size)
    idle = IdleWait()
    cpu_tier = memory.cpu_tier if isinstance(memory, V1KVCache) else None
    clock = None
    if cpu_tier is not None:
        clock = CopyClock(cost_model.swap_time_s, limits.async_scheduling)
    store_lag = _StoreLag(cost_model)
    flush_wait_s = 0.0
    now_s = 0.0
    while arrivals.num_pending or scheduler.has_unfinished:
        # vLLM schedules once more after its last request finishes, for the CPU tier.
        signals = cpu_tier is not None and cpu_tier.has_finished_to_signal
        if not (scheduler.has_unfinished or signals) and arrivals.next_arrival_s() > now_s:
            idle.begin(now_s)
            now_s = arrivals.next_arrival_s()  # idle: jump to the next arrival
        num_ended = arrivals.take_until(now_s)
        stretch = scheduler.decode_stretch()
        if stretch is not None:
            now_s, num_rejected = _run_decode_stretch(stretch, scheduler, arrivals, cost_model,
                                                      now_s, steps)  # fmt: skip
            num_ended += num_rejected
        elif scheduler.has_unfinished or signals:
            step, start_s = scheduler.step_on(clock, now_s)
            flush_wait_s += start_s - now_s
            now_s = start_s
            if cpu_tier is not None:
                store_lag.submitted(cpu_tier.last_copies)
            if step.scheduled_tokens or step.num_lazy_decodes:
                started_s = now_s
                now_s, num_finished = _record_step(step, scheduler, cost_model, now_s, steps,
                                                   record_of, idle.end(now_s))  # fmt: skip
                store_lag.priced(now_s - started_s)
                num_ended += num_finished
            else:  # no model runs: only the step's admissions and preemptions are recorded
                _record_admitted_and_preempted(scheduler.last_batch, record_of, now_s)
                if step.finished_request_ids:  # async: it only took the last step's tokens in
                    num_ended += _record_finished(scheduler.last_batch, record_of, now_s)
                elif clock is not None and scheduler.has_unfinished and (
                    step.cpu_hit_tokens or step.preempted_request_ids or scheduler.awaits_cpu_tier
                ):
                    # With a CPU tier, a step may compute nothing: it admitted loads, preempted
                    # the last running request beside a loaded one, or waits for a copy a
                    # request needs (the engine idles until the first copy in flight ends or a
                    # request arrives).
                    copy_end_s = clock.next_end_s(now_s)
                    if copy_end_s is not None:
                        now_s = min(copy_end_s, arrivals.next_arrival_s())
                elif scheduler.has_unfinished:
                    # Nothing runs, and the first waiting request does not fit the pool alone: a
                    # contiguous allocator's reservation larger than it, or a hybrid request
                    # whose groups outgrow it as it decodes (it preempted itself and every other
                    # running request, and would again): it never will.
                    rejected = scheduler.drop_first_waiting()
                    record_of.pop(rejected.request_id).mark_rejected(EXCEEDS_POOL)
                    num_ended += 1
        if num_ended and on_finish is not None:
            on_finish(num_ended)
    steps.close()
    return SimulationResult(steps=steps, requests=arrivals.records, num_slots=num_pool_slots,
                            cpu_store_step_ratio_max=store_lag.max_ratio,
                            cpu_flush_wait_s=flush_wait_s)  # fmt: skip


class _Arrivals(Arrivals):
    """The run's requests in arrival order (``Arrivals``), queued as the clock passes them: each
    gets its record, and joins the scheduler's queue unless it can never run (rejected, with
    its reason)."""

    def __init__(
        self, requests: SequenceOf[Request], scheduler: V1StepScheduler, num_pool_slots: int
    ) -> None:
        super().__init__(requests)
        self._scheduler = scheduler
        self._num_pool_slots = num_pool_slots
        self.record_of: dict[int, RequestRecord] = {}  # the queued ones still running or waiting

    def take_until(self, now_s: float) -> int:
        """Queue every request that arrived by ``now_s``; how many were rejected."""
        num_rejected = 0
        limits = self._scheduler.limits
        while (request := self.pop_arrived(now_s)) is not None:
            record = request_record(request)
            self.records.append(record)
            reason = v1_rejection_reason(request, limits, self._num_pool_slots)
            if reason:
                record.mark_rejected(reason)
                num_rejected += 1
            else:
                self.record_of[request.request_id] = record
                self._scheduler.add(request)
        return num_rejected


def _run_decode_stretch(
    stretch: DecodeStretch,
    scheduler: V1StepScheduler,
    arrivals: _Arrivals,
    cost_model: CostModel,
    now_s: float,
    steps: StepRecords,
) -> tuple[float, int]:
    """Run the decode-only steps of ``stretch`` up to its end, to an arrival it would admit, or
    to a step the free blocks cannot hold, writing the rows ``_record_step`` would (O(1) a
    step); (end time, arrivals rejected)."""
    num_seqs = stretch.num_seqs
    decode_time_s = cost_model.decode_time_fn(num_seqs)
    usage = scheduler.usage()  # its free slots: the free queue's blocks
    rows = DecodeRows(steps, usage, stretch.rounds, num_seqs=num_seqs,
                      block_size=scheduler.kv_cache.block_size, num_free_slots=usage.free,
                      memory_blocked=stretch.memory_blocked)  # fmt: skip
    context_tokens = stretch.context_tokens
    num_rejected = 0
    while rows.num_rows < stretch.max_steps:
        if rows.num_rows and arrivals.next_arrival_s() <= now_s:
            if stretch.admits_arrivals:
                break  # the step may admit it: the scheduler decides, step by step
            num_rejected += arrivals.take_until(now_s)  # it waits behind the blocked head
        # No wake-up to charge: the step after an idle wait admits, so no stretch follows one.
        duration_s = decode_time_s(context_tokens)
        if not rows.append(now_s, duration_s, context_tokens, scheduler.num_waiting):
            break  # some request cannot grow: the step preempts, step by step
        now_s += duration_s
        context_tokens += num_seqs
    scheduler.end_decode_stretch(rows.num_rows)
    rows.complete()
    return now_s, num_rejected


def _record_step(
    step: V1Step,
    scheduler: V1StepScheduler,
    cost_model: CostModel,
    now_s: float,
    steps: StepRecords,
    record_of: dict[int, RequestRecord],
    idle_s: float,
) -> tuple[float, int]:
    """Price the step, append its row and update its requests' records; (end time, finished).
    ``idle_s``: the idle wait before it (the cost model's wake-up is charged when > 0)."""
    batch = scheduler.last_batch
    assert batch.usage is not None  # the scheduler records it
    usage = batch.usage.with_free_blocked() if batch.memory_blocked else batch.usage
    shape, num_prefill_seqs = step_shape(batch)
    duration_s = cost_model.iteration_time_s(shape)
    if idle_s > 0:
        duration_s += cost_model.wake_time_s(idle_s)
    end_s = now_s + duration_s
    steps.append(
        time_s=now_s,
        duration_s=duration_s,
        batch_size=len(batch.scheduled) + batch.num_lazy_decodes,
        num_prefill_seqs=num_prefill_seqs,
        num_prefill_tokens=shape.num_prefill_tokens,
        num_decode_tokens=shape.num_decode_tokens,
        prefill_attention_pairs=shape.prefill_attention_pairs,
        decode_context_tokens=shape.decode_context_tokens,
        num_waiting=step.num_waiting,
        num_swapped=0,
        num_preempted=len(batch.preempted),
        memory_blocked=batch.memory_blocked,
        usage=usage,
        prefix_lookups=(step.prefix_query_tokens, step.prefix_hit_tokens,
                        step.resumed_query_tokens, step.resumed_hit_tokens),
    )  # fmt: skip
    _record_admitted_and_preempted(batch, record_of, now_s)
    for seq in batch.sampled:
        if seq.num_generated_tokens == 1:
            record_of[seq.request_id].mark_first_token(end_s)
    # Async, the step's finished requests sampled their last token in the step before it.
    finished_s = now_s if scheduler.limits.async_scheduling else end_s
    return end_s, _record_finished(batch, record_of, finished_s)


class _StoreLag:
    """How long the stores a step copies take against the step (``cpu_store_step_ratio_max``).

    vLLM's worker submits a step's stores at the start of the next step; above 1, they
    outlasted that step, and their blocks became readable a step or more later. Stores submitted
    by steps that compute nothing count with the next computed one (which overstates it)."""

    def __init__(self, cost_model: CostModel) -> None:
        self._cost_model = cost_model
        self._pending_tokens = 0
        self.max_ratio = 0.0

    def submitted(self, copies: StepCopies) -> None:
        """The step about to run copies these stores."""
        self._pending_tokens += sum(num_tokens for _, num_tokens in copies.stores)

    def priced(self, duration_s: float) -> None:
        """The step that copies the pending stores lasted ``duration_s``."""
        if self._pending_tokens:
            store_s = self._cost_model.swap_time_s(self._pending_tokens)
            self.max_ratio = max(self.max_ratio, store_s / duration_s)
        self._pending_tokens = 0


def _record_admitted_and_preempted(
    batch: V1Batch, record_of: dict[int, RequestRecord], now_s: float
) -> None:
    """Note the step's admissions at ``now_s`` (and what they load from the CPU tier) and its
    preemptions: all a step that computed nothing records (no step row: no model ran)."""
    for seq, num_tokens in batch.loaded:
        record_of[seq.request_id].mark_cpu_hit(num_tokens)
    for seq, hit_tokens in batch.admitted:
        record_of[seq.request_id].mark_admitted(now_s, hit_tokens)
    for seq in batch.preempted:
        record_of[seq.request_id].mark_preempted(swapped=False)


def _record_finished(batch: V1Batch, record_of: dict[int, RequestRecord], finished_s: float) -> int:
    """Close the records of the step's finished requests, their last token out at
    ``finished_s``; how many."""
    for seq, held_slots in batch.finished:
        record = record_of.pop(seq.request_id)
        record.mark_held_slots(held_slots)
        record.mark_finished(finished_s)
    return len(batch.finished)


def step_shape(batch: V1Batch) -> tuple[IterationShape, int]:
    """What the step computes (``chunks_shape`` of its scheduled sequences and its lazy
    decodes), and how many sequences it prefills."""
    shape = chunks_shape(
        ((seq.request.prompt_tokens, computed_before, num_tokens)
         for seq, computed_before, num_tokens in batch.scheduled),
        num_decode_tokens=batch.num_lazy_decodes,
        decode_context_tokens=batch.lazy_context_tokens,
    )  # fmt: skip
    return shape, shape.num_prefill_seqs


def chunks_shape(
    scheduled: Iterable[tuple[int, int, int]],
    *,
    num_decode_tokens: int = 0,
    decode_context_tokens: int = 0,
) -> IterationShape:
    """What a step of (prompt tokens, tokens computed before the step, tokens scheduled) per
    request computes, beside ``num_decode_tokens`` decodes of ``decode_context_tokens`` context
    counted apart: prefill chunks with their context, decode tokens. A decode is the one token
    of a request whose input was computed (the last sampled token, or a resumed request's last);
    the rest are prefill (prompt chunks, a preempted request's recomputed input). Also what real
    vLLM's recorded steps are priced by (``referee.vllm_engine``)."""
    num_prefill_tokens = 0
    prefill_attention_pairs = 0
    num_prefill_seqs = 0
    prefill_spans = []  # (KV tokens after the chunk, before it): a sliding layer's exact pairs
    for prompt_tokens, computed_before, num_tokens in scheduled:
        if num_tokens == 1 and computed_before >= prompt_tokens:
            num_decode_tokens += 1
            decode_context_tokens += computed_before + 1
            continue
        num_prefill_seqs += 1
        num_prefill_tokens += num_tokens
        end = computed_before + num_tokens
        # Causal attention: token i sees i + 1 tokens, the cached or earlier ones included.
        before = computed_before
        prefill_attention_pairs += end * (end + 1) // 2 - before * (before + 1) // 2
        prefill_spans.append((end, before))
    return IterationShape(
        num_prefill_tokens=num_prefill_tokens,
        prefill_attention_pairs=prefill_attention_pairs,
        num_decode_tokens=num_decode_tokens,
        decode_context_tokens=decode_context_tokens,
        num_prefill_seqs=num_prefill_seqs,
        prefill_spans=tuple(prefill_spans),
    )


