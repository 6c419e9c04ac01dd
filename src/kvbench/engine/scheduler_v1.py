"""vLLM v1's scheduling policy, step by step, over kvbench's ``paged`` allocator (no prefix cache).

The first increment of ``scheduler=vllm_v1`` (issue 15): a pure model of one ``schedule()`` of
vLLM 0.32's ``vllm.v1.core.sched.scheduler.Scheduler`` and of the model runner's answer, refereed
step for step by the real scheduler (``kvbench.referee``, tests/test_scheduler_v1_referee.py). It
is not yet wired into ``simulate`` or the config; ``scheduler=vllm_v0`` (``engine/scheduler.py``)
is what runs.

One step, as vLLM does it:

1. Running requests first, in order: each gets ``min(tokens it has not computed, budget left)``
   (chunked prefill, or one decode token). While the allocator cannot grow it by that much, the
   last running request is preempted (its blocks freed, its computed tokens dropped, back at the
   front of the waiting queue: recompute); if that was the request itself, the loop stops.
2. Only if nothing was preempted: waiting requests, first come first served, while the budget
   lasts and fewer than ``max_num_seqs`` run. One is admitted only if its whole input (prompt,
   plus the tokens it generated before a preemption) fits in the free blocks, though it gets only
   what the budget leaves; the first that does not fit stops admission.
3. The model runner: a request whose input is fully computed after the step samples a token; one
   with ``output_tokens`` tokens finishes and frees its blocks.

``max_num_batched_tokens`` is the token budget and ``max_num_seqs`` the batch limit; the pool is
the allocator's (``kvbench.core.kv_capacity.pool_slots``: vLLM's ``num_gpu_blocks`` less its null
block).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass

from kvbench.allocators.paged import PagedAllocator
from kvbench.core.request import Request


@dataclass(frozen=True)
class V1Limits:
    """The limits of one vLLM v1 engine (vLLM's names).

    Attributes:
        max_num_seqs: most requests running at once.
        max_num_batched_tokens: token budget of one step.
        max_model_len: longest prompt + output, in tokens.
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


@dataclass(frozen=True)
class V1Step:
    """What one step scheduled (the fields the referee's ``RefereeStep`` compares).

    Attributes:
        step_index: 0 for the first step.
        scheduled_tokens: (request id, tokens computed this step): running requests first, in
            order, then the ones admitted this step.
        num_blocks_in_use: blocks the allocator holds for requests after scheduling.
        preempted_request_ids: requests preempted in this step, sorted.
        finished_request_ids: requests that produced their last token in this step, sorted.
        num_running: requests running after the step.
        num_waiting: requests waiting (new or preempted) after the step.
    """

    step_index: int
    scheduled_tokens: tuple[tuple[int, int], ...]
    num_blocks_in_use: int
    preempted_request_ids: tuple[int, ...]
    finished_request_ids: tuple[int, ...]
    num_running: int
    num_waiting: int


class _V1Request:
    """A request's progress: tokens it has (prompt + sampled) and tokens computed in KV."""

    __slots__ = ("num_computed_tokens", "num_output_tokens", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.num_computed_tokens = 0
        self.num_output_tokens = 0

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_tokens + self.num_output_tokens


class V1StepScheduler:
    """vLLM v1's policy over a ``paged`` allocator without prefix caching, one step per call."""

    def __init__(self, allocator: PagedAllocator, limits: V1Limits) -> None:
        if allocator.prefix_cache is not None:
            raise ValueError("V1StepScheduler models vLLM without prefix caching: use 'paged'")
        self._allocator = allocator
        self._limits = limits
        self._running: list[_V1Request] = []
        self._queued: deque[_V1Request] = deque()  # waiting: new, and preempted at the front
        self._num_pool_blocks = allocator.num_slots // allocator.block_size
        self._num_steps = 0

    def add(self, request: Request) -> None:
        """Queue a request (vLLM's ``add_request``): it waits behind those queued before."""
        self._queued.append(_V1Request(request))

    @property
    def has_unfinished(self) -> bool:
        """Whether any request runs or waits."""
        return bool(self._running or self._queued)

    def step(self) -> V1Step:
        """Schedule one step and apply the model runner's answer to it."""
        scheduled: list[tuple[_V1Request, int]] = []
        preempted: list[int] = []
        budget = self._schedule_running(scheduled, preempted, self._limits.max_num_batched_tokens)
        if not preempted:
            self._schedule_waiting(scheduled, budget)
        num_blocks_in_use = self._num_pool_blocks - self._allocator.num_free_blocks()
        for state, num_tokens in scheduled:
            state.num_computed_tokens += num_tokens
        finished = self._sample(state for state, _ in scheduled)
        step = V1Step(
            step_index=self._num_steps,
            scheduled_tokens=tuple((s.request_id, n) for s, n in scheduled),
            num_blocks_in_use=num_blocks_in_use,
            preempted_request_ids=tuple(sorted(preempted)),
            finished_request_ids=tuple(sorted(finished)),
            num_running=len(self._running),
            num_waiting=len(self._queued),
        )
        self._num_steps += 1
        return step

    def _schedule_running(
        self, scheduled: list[tuple[_V1Request, int]], preempted: list[int], budget: int
    ) -> int:
        index = 0
        while index < len(self._running) and budget > 0:
            state = self._running[index]
            num_tokens = self._chunk(state, budget)
            while not self._allocator.can_append(state.request_id, num_tokens):
                victim = self._running.pop()  # the last running request: recompute it later
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is state:
                    return budget
            self._allocator.append(state.request_id, num_tokens)
            scheduled.append((state, num_tokens))
            budget -= num_tokens
            index += 1
        return budget

    def _schedule_waiting(self, scheduled: list[tuple[_V1Request, int]], budget: int) -> None:
        while budget > 0 and self._queued and len(self._running) < self._limits.max_num_seqs:
            state = self._queued[0]
            whole_input = min(state.num_tokens, self._limits.max_model_len)
            # vLLM 0.32 (scheduler_reserve_full_isl): the whole input must fit, not just a chunk.
            if not self._allocator.can_admit(state.request, whole_input):
                return
            num_tokens = self._chunk(state, budget)
            self._queued.popleft()
            self._allocator.admit(state.request_id, state.request, num_tokens)
            self._running.append(state)
            scheduled.append((state, num_tokens))
            budget -= num_tokens

    def _chunk(self, state: _V1Request, budget: int) -> int:
        """Tokens the request computes this step: what it lacks, within budget and length."""
        uncomputed = state.num_tokens - state.num_computed_tokens
        room = self._limits.max_model_len - state.num_computed_tokens - 1
        return min(uncomputed, budget, room)

    def _preempt(self, state: _V1Request) -> None:
        self._allocator.free(state.request_id)
        state.num_computed_tokens = 0
        self._queued.appendleft(state)

    def _sample(self, states: Iterable[_V1Request]) -> list[int]:
        finished = []
        for state in states:
            if state.num_computed_tokens < state.num_tokens:
                continue  # mid-prefill: the runner discards its sample
            state.num_output_tokens += 1
            if state.num_output_tokens >= state.request.output_tokens:
                self._running.remove(state)
                self._allocator.free(state.request_id)
                finished.append(state.request_id)
        return finished


def run_v1_steps(
    requests: SequenceOf[Request],
    allocator: PagedAllocator,
    limits: V1Limits,
    arrival_steps: SequenceOf[int] | None = None,
) -> list[V1Step]:
    """Step until every request finishes, as the referee does (``referee.run_referee``).

    ``arrival_steps[i]`` is the step before which request ``i`` is queued (all at step 0 when
    None): the referee's clock, in steps. ValueError when a step can run nothing although
    requests wait (the pool never fits the first of them).
    """
    arrivals = [0] * len(requests) if arrival_steps is None else list(arrival_steps)
    if len(arrivals) != len(requests):
        raise ValueError(f"{len(arrivals)} arrival steps for {len(requests)} requests")
    # Popped from the end: earliest arrival first, ties in request order.
    pending = sorted(range(len(requests)), key=lambda i: (arrivals[i], i), reverse=True)
    scheduler = V1StepScheduler(allocator, limits)
    steps: list[V1Step] = []
    while pending or scheduler.has_unfinished:
        while pending and arrivals[pending[-1]] <= len(steps):
            scheduler.add(requests[pending.pop()])
        step = scheduler.step()
        steps.append(step)
        if not step.scheduled_tokens and not step.num_running and step.num_waiting:
            raise ValueError(f"step {step.step_index}: no waiting request fits the pool")
    return steps
