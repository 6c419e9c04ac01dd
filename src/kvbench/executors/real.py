"""``executor=real``: the engine's scheduled batches run on a real model, timed on the wall clock.

``RealExecutor.run`` turns one scheduled ``Batch`` into a batched forward (``forward.BatchRunner``)
over the allocator's own memory: it copies swapped-out sequences' K/V to swap space before
anything overwrites their freed blocks, performs the allocator's copy-on-writes, copies swapped-in
sequences back, then feeds every decoding sequence its last token and every (re)admitted one its
uncached tokens, and appends each sequence's greedy next token (EOS ignored: a request stops at
its trace's output length, as the engine decides).

``run_real`` is the engine's step-by-step loop (``engine.simulate``) with the wall clock for its
clock: requests arrive at their trace times (the loop sleeps while idle), and an iteration lasts
what scheduling and running it measured, from the end of the iteration before
(``_iteration_start_s``). It returns the same ``SimulationResult``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.allocators.base import Allocator, CopyOnWriteCounter
from kvbench.core.request import Request
from kvbench.engine.arrival_queue import Arrivals
from kvbench.engine.cost_model import DecodeTimeFn, IterationShape, iteration_shape
from kvbench.engine.iteration import IdleWait, end_iteration, record_step
from kvbench.engine.records import EXCEEDS_POOL, SimulationResult, StepRecords
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import Batch, Scheduler, SchedulerLimits
from kvbench.engine.sequence import Sequence
from kvbench.executors.forward import BatchRunner, SeqInput, model_kv_shape
from kvbench.executors.kv_memory import KVMemory, kv_storage_dtype
from kvbench.executors.names import triton_on_the_cpu_problem
from kvbench.executors.token_ids import prompt_ids

Clock = Callable[[], float]
# id(model) -> the most tokens a warm-up prefill ran on it in this process (``warm_up``).
_warmed_tokens: dict[int, int] = {}


class RealExecutor:
    """Runs scheduled batches of one allocator's sequences on ``model``.

    Args:
        model: a transformers causal LM in eval mode (its dtype and device are the pools').
        allocator: the allocator whose memory the pools are (its slots, its block size).
        backend: the paged decode kernel's backend (``sdpa`` or ``torch`` on a CPU, ``triton``
            on a GPU; ``executor.decode_backend``). ``triton`` writes and copies K/V with
            Triton's cache kernels too, as on a GPU (on a CPU, under the interpreter).
        kv_dtype: ``model.kv_dtype``: ``fp8`` stores K/V in e4m3 at unit scales (vLLM's
            ``kv_cache_dtype=fp8`` without calibration), 1 byte per element, as the allocator's
            slots were counted; anything else the model's dtype.
    """

    def __init__(self, model: Any, allocator: Allocator, backend: str = "sdpa",
                 kv_dtype: str | None = None) -> None:  # fmt: skip
        problem = triton_on_the_cpu_problem(backend, model.device.type)
        if problem:
            raise ValueError(problem)
        num_layers, num_kv_heads, head_dim = model_kv_shape(model)
        self.memory = KVMemory(num_layers, num_kv_heads, head_dim, allocator.num_slots,
                               allocator.block_size, model.dtype, model.device,
                               kv_dtype=kv_storage_dtype(kv_dtype),
                               cache_backend="triton" if backend == "triton" else None)  # fmt: skip
        self.runner = BatchRunner(model, self.memory, "paged", backend)
        self.allocator = allocator
        self.vocab_size = int(model.config.vocab_size)
        self._tokens: dict[int, list[int]] = {}  # seq id -> prompt + generated token ids
        # Sequences whose K/V are in the pools after the last forward -> (their table, tokens).
        self._resident: dict[int, tuple[tuple[int, ...], int]] = {}
        self.num_forwards = 0
        # Finished sequences' tokens (prompt + output), when ``keep_outputs`` (tests, checks).
        self.outputs: dict[int, list[int]] = {}
        self.keep_outputs = False

    def warm_up(self, limits: SchedulerLimits | None = None) -> None:
        """Forwards that write nothing, so timed iterations do not pay first-time costs: a
        prefill of the most tokens a step of ``limits`` can compute (16 without), then a decode.

        A process's first forward of a size costs more than the next ones (torch's first calls
        at those shapes and memory touched for the first time are the likely parts): a served
        run's first long prefills ran up to 37 % over the price of a profile, whose points
        are timed warm (docs/sim_to_real_measured.md). vLLM's GPU runner warms up the same way,
        with a forward of its largest batch. What it warms is the process's, so the largest
        prefill runs once per process and model (``_warmed_tokens``), split into sequences of
        at most the model's longest, each reading the same blocks (at most the pool's slots
        less one)."""
        if limits is None:
            num_tokens = longest_tokens = 16
        else:
            num_tokens = min(limits.max_num_batched_tokens,
                             limits.max_num_seqs * limits.max_model_len)  # fmt: skip
            longest_tokens = limits.max_model_len
        seq_tokens = min(num_tokens, longest_tokens, self.memory.num_slots - 1)
        table = tuple(range(-(-(seq_tokens + 1) // self.memory.block_size)))
        model_key = id(self.runner.model)
        if num_tokens > _warmed_tokens.get(model_key, 0):
            lengths = [seq_tokens] * (num_tokens // seq_tokens) + [num_tokens % seq_tokens]
            self.runner.forward([SeqInput(list(range(n)), 0, table, num_unwritten=n)
                                 for n in lengths if n])  # fmt: skip
            _warmed_tokens[model_key] = num_tokens
        self.runner.forward([SeqInput([0], seq_tokens, table, num_unwritten=1)])

    def assume_computed(self, seq_id: int, token_ids: list[int]) -> None:
        """Take ``token_ids`` as the tokens of a sequence the allocator holds, whose K/V are
        taken to be in its blocks already (all but the last token's): how ``task=profile``
        times decode steps at a chosen context without prefilling it first."""
        self._tokens[seq_id] = list(token_ids)

    def forget(self, seq_id: int) -> None:
        """Drop what the executor knows of a sequence (its tokens, its swap space)."""
        self._tokens.pop(seq_id, None)
        self._resident.pop(seq_id, None)
        self.memory.drop_swapped(seq_id)

    def run(self, batch: Batch, scheduler: Scheduler) -> None:
        """Run ``batch`` (scheduled: its slots allocated, ``scheduler``'s queues updated)."""
        self._swap_out_preempted(scheduler)
        self.memory.copy(self.allocator.take_copy_on_writes())
        for seq in batch.swapped_in:
            kv_tokens = len(self._tokens[seq.seq_id]) - 1  # the last token's K/V: this step's
            self.memory.swap_in(seq.seq_id, self._slots(seq.seq_id, kv_tokens))
        inputs = [self._decode_input(seq) for seq in batch.decode + batch.swapped_in]
        inputs += [self._prefill_input(seq) for seq in batch.prefill]
        logits = self.runner.forward(inputs)  # [num_seqs, vocab]
        self.num_forwards += 1
        next_tokens = logits.argmax(dim=-1).tolist()
        self._resident = {}
        for seq, token in zip(batch.decode + batch.swapped_in + batch.prefill, next_tokens,
                              strict=True):  # fmt: skip
            tokens = self._tokens[seq.seq_id]
            tokens.append(int(token))
            if seq.num_generated + 1 >= seq.request.output_tokens:  # its last token: it ends
                del self._tokens[seq.seq_id]
                if self.keep_outputs:
                    self.outputs[seq.seq_id] = tokens
            else:
                self._resident[seq.seq_id] = (self.allocator.block_table(seq.seq_id),
                                              len(tokens) - 1)  # fmt: skip

    def _swap_out_preempted(self, scheduler: Scheduler) -> None:
        """Copy the K/V of sequences preempted by swap since the last forward to swap space
        (their blocks are freed but not yet overwritten); forget recomputed ones' K/V."""
        swapped_ids = {seq.seq_id for seq in scheduler.swapped}
        running_ids = {seq.seq_id for seq in scheduler.running}
        for seq_id, (table, kv_tokens) in self._resident.items():
            if seq_id in swapped_ids:
                positions = torch.arange(kv_tokens)  # [kv_tokens]
                blocks = torch.tensor(table, dtype=torch.int64)  # [blocks]
                block_size = self.memory.block_size
                slots = blocks[positions // block_size] * block_size + positions % block_size
                self.memory.swap_out(seq_id, slots)
            elif seq_id not in running_ids:
                self.memory.drop_swapped(seq_id)  # preempted by recompute: prefilled again
        self._resident = {}

    def _slots(self, seq_id: int, num_tokens: int) -> torch.Tensor:
        """int64 [num_tokens]: the pool slots of the sequence's first ``num_tokens`` tokens."""
        table = torch.tensor(self.allocator.block_table(seq_id), dtype=torch.int64)
        positions = torch.arange(num_tokens)  # [num_tokens]
        block_size = self.memory.block_size
        return table[positions // block_size] * block_size + positions % block_size

    def _decode_input(self, seq: Sequence) -> SeqInput:
        tokens = self._tokens[seq.seq_id]
        return SeqInput([tokens[-1]], len(tokens) - 1, self.allocator.block_table(seq.seq_id))

    def _prefill_input(self, seq: Sequence) -> SeqInput:
        """A (re)admitted sequence: its tokens after the cached prefix (at least its last)."""
        tokens = self._tokens.get(seq.seq_id)
        if tokens is None:  # a first admission
            tokens = self._tokens[seq.seq_id] = prompt_ids(seq.request, self.vocab_size)
        first = seq.num_reused_tokens
        return SeqInput(tokens[first:], first, self.allocator.block_table(seq.seq_id),
                        num_unwritten=seq.num_cached_tokens - first)  # fmt: skip


@dataclass(frozen=True)
class MeasuredTime:
    """A ``CostModel`` that answers the duration just measured: how ``run_real`` records a
    wall-clock iteration through the engine's ``record_step`` (swap copies are inside it)."""

    duration_s: float

    def iteration_time_s(self, shape: IterationShape) -> float:
        """The measured duration, whatever the shape."""
        return self.duration_s

    def swap_time_s(self, num_tokens: int) -> float:
        """0: the executor's swap copies ran inside the measured iteration."""
        return 0.0

    def wake_time_s(self, idle_s: float) -> float:
        """0: waking from an idle wait is inside the measured iteration."""
        return 0.0

    def decode_time_fn(self, num_decode_tokens: int) -> DecodeTimeFn:
        """The measured duration for any context (never called: ``run_real`` has no fast
        path)."""
        return lambda decode_context_tokens: self.duration_s


@dataclass(frozen=True)
class RealRun:
    """What ``run_real`` measured beside the engine's records.

    Attributes:
        result: the steps and requests, as ``simulate`` returns them (measured times).
        kv_pool_bytes: bytes of the pools the allocator's slots live in.
        peak_rss_bytes: the process's largest resident memory sampled after each iteration.
        peak_device_bytes: on a GPU, the most memory torch held allocated on it during the run
            (the model, the pools, activations); None on a CPU.
        num_forwards: forward passes run.
        shapes: each recorded iteration's shape (what a profiled cost model is fitted on).
        idle_before_s: each recorded iteration's idle wait before it, from the end of the
            iteration before (or the run's start) when the loop slept for an arrival in
            between, else 0.0 (what a profile's wake terms are fitted on).
    """

    result: SimulationResult
    kv_pool_bytes: int
    peak_rss_bytes: int
    peak_device_bytes: int | None
    num_forwards: int
    shapes: list[IterationShape]
    idle_before_s: list[float]


def run_real(
    requests: SequenceOf[Request],
    scheduler: Scheduler,
    allocator: Allocator,
    executor: RealExecutor,
    on_finish: Callable[[int], None] | None = None,
    *,
    clock: Clock = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> RealRun:
    """Serve ``requests`` on the wall clock: the engine's step-by-step loop, each iteration run by
    ``executor`` and recorded with its measured duration. ``on_finish`` as in ``simulate``."""
    arrivals = Arrivals(requests)
    steps = StepRecords()
    samples = SampleGroups(next_seq_id=arrivals.first_free_seq_id)
    peak_rss_bytes = resident_bytes()
    device = executor.memory.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    shapes: list[IterationShape] = []
    idle_before_s: list[float] = []
    idle = IdleWait()
    start_s = clock()
    last_end_s: float | None = None  # when the last iteration ended (None: idle since)
    while arrivals.num_pending or scheduler.has_work:
        now_s = clock() - start_s
        next_arrival_s = arrivals.next_arrival_s()
        if not scheduler.has_work and next_arrival_s > now_s:
            idle.begin(0.0 if last_end_s is None else last_end_s)  # the run starts idle at 0
            sleep(next_arrival_s - now_s)  # idle until the next request arrives
            now_s = max(clock() - start_s, next_arrival_s)
            last_end_s = None
        num_ended = arrivals.admit_until(now_s, scheduler, samples)
        batch, rejected = scheduler.schedule(allocator)
        for seq in rejected:
            seq.record.mark_rejected(EXCEEDS_POOL)
        num_ended += len(rejected)
        if batch.sequences:
            now_s = _iteration_start_s(now_s, last_end_s, arrivals.latest_arrival_s)
            idle_before_s.append(idle.end(now_s))
            executor.run(batch, scheduler)
            end_s = last_end_s = clock() - start_s
            decode_context_tokens = sum(seq.num_kv_tokens for seq in batch.decode)
            decode_context_tokens += sum(seq.num_kv_tokens for seq in batch.swapped_in)
            record_step(steps, batch, now_s, decode_context_tokens, scheduler, allocator,
                        MeasuredTime(end_s - now_s))  # fmt: skip
            shapes.append(iteration_shape(batch.prefill, batch.num_decode_tokens,
                                          decode_context_tokens))  # fmt: skip
            num_ended += end_iteration(batch, now_s, end_s, scheduler, allocator, samples)
            peak_rss_bytes = max(peak_rss_bytes, resident_bytes())
        if num_ended and on_finish is not None:
            on_finish(num_ended)
    steps.close()
    arrivals.close()
    copies = allocator.num_copy_on_writes if isinstance(allocator, CopyOnWriteCounter) else 0
    result = SimulationResult(steps=steps, requests=arrivals.records,
                              num_slots=allocator.num_slots, num_copy_on_writes=copies)  # fmt: skip
    peak_device_bytes = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                         else None)  # fmt: skip
    return RealRun(result, executor.memory.pool_bytes, peak_rss_bytes, peak_device_bytes,
                   executor.num_forwards, shapes, idle_before_s)  # fmt: skip


def _iteration_start_s(now_s: float, last_end_s: float | None,
                       latest_arrival_s: float) -> float:  # fmt: skip
    """When a busy loop's iteration starts: at the end of the one before, as the engine's clock
    has it (back to back), so the previous iteration's bookkeeping after its forward (finishing
    sequences, sampling memory: about 0.4 ms a step on a CPU) is priced in this one's duration
    instead of falling between steps unseen. At ``now_s`` after an idle wait, or when the latest
    request queued (``latest_arrival_s``) arrived after the last iteration ended: an iteration
    that may admit it cannot have started before it arrived."""
    if last_end_s is None or latest_arrival_s > last_end_s:
        return now_s
    return last_end_s


def resident_bytes() -> int:
    """The process's resident memory now (Linux ``/proc/self/statm``; else its peak so far)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _page_bytes()
    except OSError:
        import resource
        import sys

        # ru_maxrss is in KiB on Linux, in bytes on macOS.
        unit_bytes = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit_bytes


def _page_bytes() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE")
