"""``simulate``: replay requests through a scheduler, an allocator and a cost model.

The step-by-step reference loop: one iteration at a time. Pure and deterministic — the same
requests, limits, allocator and cost model always give identical records.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as SequenceOf

from kvbench.allocators.base import Allocator, CopyOnWriteCounter
from kvbench.core.request import Request
from kvbench.engine.arrival_queue import Arrivals, RecordSink
from kvbench.engine.beams import Ancestry
from kvbench.engine.cost_model import CostModel
from kvbench.engine.iteration import IdleWait, end_iteration, record_step
from kvbench.engine.lazy_batch import LazyBatch
from kvbench.engine.records import EXCEEDS_POOL, SimulationResult, StepRecords, StepSink
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import Batch, Scheduler

ProgressCallback = Callable[[int], None]
# Called with each iteration's batch and the allocator after scheduling, before the batch runs.
StepObserver = Callable[[Batch, Allocator], None]


def simulate(
    requests: SequenceOf[Request],
    scheduler: Scheduler,
    allocator: Allocator,
    cost_model: CostModel,
    on_finish: ProgressCallback | None = None,
    *,
    on_step: StepObserver | None = None,
    beam_ancestry: Ancestry | None = None,
    fast: bool = True,
    step_sink: StepSink | None = None,
    record_sink: RecordSink | None = None,
) -> SimulationResult:
    """Serve ``requests`` (sorted by arrival) and record every iteration and every request.

    ``on_finish`` is called with the number of requests that just ended (finished or rejected),
    for progress bars; ``on_step`` with every iteration's batch and the allocator, once its slots
    are allocated and before it runs (the kernel benchmark reads block tables there). Observers
    must not change the run: the allocator is the engine's own, to be read only.
    ``beam_ancestry`` is the recorded beam search that requests with ``beam_width`` > 1 replay
    (``kvbench.engine.beams``; the runner passes the shipped table's).

    ``fast`` (the default) lets ``kvbench.engine.lazy_batch`` advance the running batch lazily
    (an iteration then costs what changes in it, not a pass over the batch), with records
    identical to the step-by-step loop's (``fast=False``, the reference); an ``on_step``
    observer needs every iteration's batch and always gets the step-by-step loop.
    ``step_sink`` and ``record_sink`` take the step records (in chunks of columns) and the request
    records (in lists) as they complete, instead of the result keeping them: memory then stays
    bounded by the requests in flight, however long the trace (``StepRecords``, ``Arrivals``).
    """
    arrivals = Arrivals(requests, record_sink)
    steps = StepRecords(sink=step_sink, block_size=allocator.block_size)
    samples = SampleGroups(next_seq_id=arrivals.first_free_seq_id,
                           beam_ancestry=beam_ancestry or {})
    use_fast_path = fast and on_step is None
    idle = IdleWait()
    lazy_batch = None
    if use_fast_path:
        lazy_batch = LazyBatch(arrivals, scheduler, allocator, cost_model, steps, samples, idle)
        if not lazy_batch.enabled:
            lazy_batch = None
    now_s = 0.0
    while arrivals.num_pending or scheduler.has_work:
        if not scheduler.has_work and arrivals.next_arrival_s() > now_s:
            idle.begin(now_s)
            now_s = arrivals.next_arrival_s()  # idle: jump to the next arrival
        num_ended = arrivals.admit_until(now_s, scheduler, samples)
        lazy_step = lazy_batch.step(now_s) if lazy_batch is not None else None
        if lazy_step is not None:
            now_s, num_lazy_ended = lazy_step
            num_ended += num_lazy_ended
        else:
            batch, rejected = scheduler.schedule(allocator, bulk_appends=use_fast_path)
            for seq in rejected:
                seq.record.mark_rejected(EXCEEDS_POOL)
            num_ended += len(rejected)
            if batch.sequences:
                if on_step is not None:
                    on_step(batch, allocator)
                now_s, num_finished = _run_iteration(
                    batch, now_s, scheduler, allocator, cost_model, steps, samples, idle
                )
                num_ended += num_finished
        if num_ended:
            arrivals.flush_ended()
            if on_finish is not None:
                on_finish(num_ended)
    if lazy_batch is not None:
        lazy_batch.deactivate()
    steps.close()
    arrivals.close()
    copies = allocator.num_copy_on_writes if isinstance(allocator, CopyOnWriteCounter) else 0
    return SimulationResult(
        steps=steps,
        requests=arrivals.records,
        num_slots=allocator.num_slots,
        num_copy_on_writes=copies,
    )


def _run_iteration(
    batch: Batch,
    now_s: float,
    scheduler: Scheduler,
    allocator: Allocator,
    cost_model: CostModel,
    steps: StepRecords,
    samples: SampleGroups,
    idle: IdleWait,
) -> tuple[float, int]:
    """Price and record one iteration, advance its sequences; returns (end time, finished)."""
    decode_context_tokens = sum(seq.num_kv_tokens for seq in batch.decode)
    decode_context_tokens += sum(seq.num_kv_tokens for seq in batch.swapped_in)
    duration_s = record_step(steps, batch, now_s, decode_context_tokens, scheduler, allocator,
                             cost_model, idle)  # fmt: skip
    end_s = now_s + duration_s
    return end_s, end_iteration(batch, now_s, end_s, scheduler, allocator, samples)
