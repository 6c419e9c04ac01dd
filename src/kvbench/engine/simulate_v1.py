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
CPU tier (``engine.cpu_tier_v1``) a load runs beside the steps for its PCIe time (``_LoadClock``);
a step's stores complete with the next step, whatever their size, which ``_StoreLag`` checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence as SequenceOf

from kvbench.core.request import Request
from kvbench.engine.cost_model import CostModel, IterationShape
from kvbench.engine.cpu_tier_v1 import CpuOffloadTier
from kvbench.engine.iteration import IdleWait
from kvbench.engine.kv_cache_v1 import V1KVCache
from kvbench.engine.records import (
    EMPTY_PROMPT,
    EXCEEDS_MAX_MODEL_LEN,
    EXCEEDS_POOL,
    PROMPT_EXCEEDS_MAX_MODEL_LEN,
    RequestRecord,
    SimulationResult,
    StepRecords,
    StepSink,
    request_record,
)
from kvbench.engine.scheduler_v1 import V1Batch, V1Limits, V1Memory, V1Step, V1StepScheduler

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
    pending = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    scheduler = V1StepScheduler(memory, limits, record_usage=True, fast=fast)
    steps = StepRecords(sink=step_sink, block_size=memory.block_size)
    records: list[RequestRecord] = []
    record_of: dict[int, RequestRecord] = {}
    num_arrived = 0
    idle = IdleWait()
    loads = _LoadClock(cost_model, limits.async_scheduling)
    cpu_tier = memory.cpu_tier if isinstance(memory, V1KVCache) else None
    store_lag = _StoreLag(cpu_tier, cost_model) if cpu_tier is not None else None
    now_s = 0.0
    while num_arrived < len(pending) or scheduler.has_unfinished:
        if not scheduler.has_unfinished and pending[num_arrived].arrival_s > now_s:
            idle.begin(now_s)
            now_s = pending[num_arrived].arrival_s  # idle: jump to the next arrival
        num_ended = 0
        while num_arrived < len(pending) and pending[num_arrived].arrival_s <= now_s:
            request = pending[num_arrived]
            num_arrived += 1
            record = request_record(request)
            records.append(record)
            reason = v1_rejection_reason(request, limits, num_pool_slots)
            if reason:
                record.mark_rejected(reason)
                num_ended += 1
            else:
                record_of[request.request_id] = record
                scheduler.add(request)
        if scheduler.has_unfinished:
            loads.before_step(now_s)
            if store_lag is not None:
                store_lag.before_step()
            step = scheduler.step(loads.done)
            loads.started(scheduler.last_batch, now_s)
            if step.scheduled_tokens:
                started_s = now_s
                now_s, num_finished = _record_step(step, scheduler, cost_model, now_s, steps,
                                                   record_of, idle.end(now_s))  # fmt: skip
                if store_lag is not None:
                    store_lag.priced(now_s - started_s)
                num_ended += num_finished
            elif step.finished_request_ids:  # async: it only took the last step's tokens in
                num_ended += _record_finished(scheduler.last_batch, record_of, now_s)
            elif step.cpu_hit_tokens or step.preempted_request_ids or scheduler.awaits_cpu_tier:
                # With a CPU tier, a step may compute nothing: it admitted loads, preempted the
                # last running request beside a loaded one, or waits for a copy a request needs
                # (the engine idles until the first load in flight completes).
                _record_admitted_and_preempted(scheduler.last_batch, record_of, now_s)
                now_s = max(now_s, loads.first_end_s(scheduler.loading_request_ids))
            else:
                # Nothing runs and the first waiting request does not fit the empty pool (a
                # contiguous allocator's reservation larger than it): it never will.
                record_of.pop(scheduler.drop_first_waiting().request_id).mark_rejected(EXCEEDS_POOL)
                num_ended += 1
        if num_ended and on_finish is not None:
            on_finish(num_ended)
    steps.close()
    return SimulationResult(steps=steps, requests=records, num_slots=num_pool_slots,
                            cpu_store_step_ratio_max=store_lag.max_ratio if store_lag else 0.0)


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
        batch_size=len(batch.scheduled),
        num_prefill_seqs=num_prefill_seqs,
        num_prefill_tokens=shape.num_prefill_tokens,
        num_decode_tokens=shape.num_decode_tokens,
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


class _LoadClock:
    """When each load from the CPU tier completes on the clock: it starts with the step that
    admits it (vLLM's worker submits it before the forward pass) and lasts ``swap_time_s`` of
    its tokens; the worker reports it with the first step that ends after it (taken in a step
    later under async scheduling), while the other requests compute."""

    def __init__(self, cost_model: CostModel, async_scheduling: bool) -> None:
        self._cost_model = cost_model
        self._async_scheduling = async_scheduling
        self._end_s: dict[int, float] = {}
        self._answered_by_s = 0.0
        self._last_start_s = 0.0

    def before_step(self, now_s: float) -> None:
        """A step starts at ``now_s``: the answer it takes in first is that of the step that
        ended then (async: of the step before, which ended when the last one started)."""
        self._answered_by_s = self._last_start_s if self._async_scheduling else now_s
        self._last_start_s = now_s

    def done(self, request_id: int) -> bool:
        """Whether the request's load had completed by the answer taken in (asked until it
        has, then forgotten)."""
        if self._end_s[request_id] > self._answered_by_s:
            return False
        del self._end_s[request_id]
        return True

    def started(self, batch: V1Batch, now_s: float) -> None:
        """Note the loads the step just scheduled admitted."""
        for seq, num_tokens in batch.loaded:
            self._end_s[seq.request_id] = now_s + self._cost_model.swap_time_s(num_tokens)

    def first_end_s(self, request_ids: list[int]) -> float:
        """When the first of these loads completes (0.0 for none)."""
        return min((self._end_s[request_id] for request_id in request_ids), default=0.0)


class _StoreLag:
    """How long a step's stores to the CPU tier take against the step that copies them.

    vLLM's worker submits a step's stores at the start of the next step; the tier makes them
    readable with that step's answer, as copies shorter than a step are. The ratio of their
    ``swap_time_s`` to that step's duration checks it: above 1, a store outlasted its step and
    its blocks would become readable later than modelled. Stores issued by steps that compute
    nothing wait for the next computed one (which overstates the ratio)."""

    def __init__(self, tier: CpuOffloadTier, cost_model: CostModel) -> None:
        self._tier = tier
        self._cost_model = cost_model
        self._num_counted_blocks = 0
        self._pending_tokens = 0
        self.max_ratio = 0.0

    def before_step(self) -> None:
        """The stores issued since the last call are copied from this step on."""
        num_new_blocks = self._tier.num_stored_blocks - self._num_counted_blocks
        self._num_counted_blocks += num_new_blocks
        self._pending_tokens += num_new_blocks * self._tier.block_size

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
    """What the step computes (``chunks_shape`` of its scheduled sequences), and how many
    sequences it prefills."""
    shape = chunks_shape(
        (seq.request.prompt_tokens, computed_before, num_tokens)
        for seq, computed_before, num_tokens in batch.scheduled
    )
    return shape, shape.num_prefill_seqs


def chunks_shape(scheduled: Iterable[tuple[int, int, int]]) -> IterationShape:
    """What a step of (prompt tokens, tokens computed before the step, tokens scheduled) per
    request computes: prefill chunks with their context, decode tokens. A decode is the one token
    of a request whose input was computed (the last sampled token, or a resumed request's last);
    the rest are prefill (prompt chunks, a preempted request's recomputed input). Also what real
    vLLM's recorded steps are priced by (``referee.vllm_engine``)."""
    num_prefill_tokens = 0
    prefill_attention_pairs = 0
    num_prefill_seqs = 0
    num_decode_tokens = 0
    decode_context_tokens = 0
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


