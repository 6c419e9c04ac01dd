"""Iteration-level continuous batching (Orca, vLLM): FCFS admission (or SGLang's longest prefix
match first, ``policy="lpm"``), preemption of the latest.

Each iteration the scheduler (1) gives every running sequence a slot for its next token, earliest
arrival first, preempting the latest-arrived running sequence while one cannot grow; (2) if nothing
was preempted, swaps preempted sequences back in, then admits waiting requests first come, first
served while the allocator admits them and the batch stays within ``max_num_seqs`` and
``max_num_batched_tokens``. Prefill of new requests and decode of running ones share an iteration
(Orca's iteration-level batching). A request that can never run (longer than the model, or than the
whole pool) is rejected with a recorded reason; no request is lost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Final

from kvbench.allocators.base import Allocator
from kvbench.core.request import Request
from kvbench.engine.records import (
    EMPTY_PROMPT,
    EXCEEDS_MAX_MODEL_LEN,
    PROMPT_EXCEEDS_MAX_MODEL_LEN,
    PROMPT_EXCEEDS_MAX_NUM_BATCHED_TOKENS,
)
from kvbench.engine.sequence import Sequence

PREEMPTION_MODES = ("recompute", "swap")
# Admission order of the waiting queue: first come, first served, or longest prefix match first
# (SGLang's lpm: the request whose prompt the prefix cache holds most of goes first; ties and
# allocators without a prefix cache keep arrival order).
FCFS = "fcfs"
LPM = "lpm"
POLICIES = (FCFS, LPM)


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's policy knobs.

    Attributes:
        max_model_len: longest sequence (prompt + output) the model serves, in tokens.
        max_num_seqs: most sequences in one iteration.
        max_num_batched_tokens: most tokens (prefill + decode) in one iteration.
        preemption: ``recompute`` (drop the KV, prefill again later) or ``swap`` (copy it to a CPU
            pool over PCIe and back).
        swap_capacity_tokens: size of the CPU swap pool, in tokens.
        policy: the waiting queue's admission order, one of ``POLICIES``.
    """

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    preemption: str = "recompute"
    swap_capacity_tokens: int = 0
    policy: str = FCFS


@dataclass
class Batch:
    """What one iteration runs, decided by ``Scheduler.schedule``."""

    decode: list[Sequence] = field(default_factory=list)
    prefill: list[Sequence] = field(default_factory=list)
    swapped_in: list[Sequence] = field(default_factory=list)
    num_preempted: int = 0
    num_swap_out_tokens: int = 0
    num_swap_in_tokens: int = 0
    num_cpu_load_tokens: int = 0  # cached prefix tokens admissions load from the CPU tier
    memory_blocked: bool = False

    @property
    def sequences(self) -> list[Sequence]:
        """Every sequence that produces a token this iteration."""
        return self.decode + self.swapped_in + self.prefill

    @property
    def num_seqs(self) -> int:
        """How many sequences produce a token this iteration (``len(sequences)``, no list)."""
        return len(self.decode) + len(self.swapped_in) + len(self.prefill)

    @property
    def num_decode_tokens(self) -> int:
        """Sequences that decode one token this iteration (running and swapped back in)."""
        return len(self.decode) + len(self.swapped_in)


def _cached_prefix_tokens(allocator: Allocator, seq_id: int) -> int:
    """Prompt tokens the allocator found cached at admission (0 without a prefix cache)."""
    prefix_cache = allocator.prefix_cache
    return prefix_cache.cached_prefix_tokens(seq_id) if prefix_cache is not None else 0


def group_seats(seq: Sequence, max_num_seqs: int) -> int:
    """Seats a waiting sequence takes in the batch: a request not started yet takes one for
    each sample or beam it forks into after its first token (vLLM v0 counts a sequence group's
    most running sequences at admission), at most ``max_num_seqs`` (a group wider than the batch
    still runs, alone); a sequence that has generated (preempted, or a fork waiting) one."""
    if seq.num_generated:
        return 1
    return min(max(seq.request.num_samples, seq.request.beam_width), max_num_seqs)


def rejection_reason(request: Request, limits: SchedulerLimits) -> str:
    """Why ``request`` can never run under ``limits`` (one of ``records.REJECT_REASONS``), or ''
    if it can: the checks made when it arrives. The pool's limit (``EXCEEDS_POOL``) is found at
    admission, not here."""
    max_model_len = limits.max_model_len
    if request.prompt_tokens == 0:
        return EMPTY_PROMPT
    if request.prompt_tokens >= max_model_len:  # no room left for one output token
        return PROMPT_EXCEEDS_MAX_MODEL_LEN
    if request.total_tokens > max_model_len:
        return EXCEEDS_MAX_MODEL_LEN
    if request.prompt_tokens + 1 > limits.max_num_batched_tokens:
        return PROMPT_EXCEEDS_MAX_NUM_BATCHED_TOKENS
    return ""


class Scheduler:
    """FCFS continuous-batching scheduler over one allocator.

    The only owner of its queues: the rest of the engine reads them (``waiting``, ``running``,
    ``swapped``, read-only) and changes them through its methods.
    """

    def __init__(self, limits: SchedulerLimits) -> None:
        if limits.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption={limits.preemption!r}: allowed {PREEMPTION_MODES}")
        if limits.policy not in POLICIES:
            raise ValueError(f"policy={limits.policy!r}: allowed {POLICIES}")
        self.limits = limits
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in arrival order: the last one is preempted first
        self._swapped: deque[Sequence] = deque()
        # The same queues, read-only for everyone else (plain attributes rather than
        # properties: the fast path reads them every iteration). Never rebound.
        self.waiting: Final[SequenceOf[Sequence]] = self._waiting
        """Sequences waiting for (re)admission, head first (read-only)."""
        self.running: Final[SequenceOf[Sequence]] = self._running
        """Running sequences in arrival order (read-only)."""
        self.swapped: Final[SequenceOf[Sequence]] = self._swapped
        """Sequences swapped out to the CPU pool, first out first (read-only)."""
        self.num_swapped_tokens = 0

    def rejection_reason(self, seq: Sequence) -> str:
        """Why a request can never run here (one of ``records.REJECT_REASONS``), or '' if it
        can. The pool's limit (``EXCEEDS_POOL``) is found at admission, not here."""
        return rejection_reason(seq.request, self.limits)

    def add(self, seq: Sequence) -> None:
        """Queue an arrived request."""
        self._waiting.append(seq)

    @property
    def has_work(self) -> bool:
        """Whether any sequence is running, waiting or swapped out."""
        return bool(self._running or self._waiting or self._swapped)

    def schedule(
        self, allocator: Allocator, *, bulk_appends: bool = False
    ) -> tuple[Batch, list[Sequence]]:
        """Decide the next iteration; returns it and the requests rejected for good.

        ``bulk_appends`` grows all running sequences with one ``try_append_round`` call when every
        one of them fits (the same state as appending one by one): the fast path's, when it goes
        step by step."""
        batch = Batch()
        self._grow_running(allocator, batch, bulk_appends)
        rejected: list[Sequence] = []
        if batch.num_preempted == 0:
            rejected = self._swap_in(allocator, batch)
            if not self._swapped:
                rejected += self._admit_waiting(allocator, batch)
        self.run_admitted(batch)
        return batch, rejected

    def schedule_admissions(self, allocator: Allocator) -> tuple[Batch, list[Sequence]]:
        """The admission half of ``schedule``, when every running sequence already holds its next
        token's slot (the lazy batch's cohort round took them) and nothing is swapped out: the
        batch (its ``decode`` a copy of the running sequences) and the requests rejected for
        good. The admitted ones join the running sequences with ``run_admitted``."""
        batch = Batch(decode=list(self._running))
        return batch, self._admit_waiting(allocator, batch)

    def run_admitted(self, batch: Batch) -> None:
        """The sequences ``batch`` swapped in and prefilled join the running ones."""
        self._running.extend(batch.swapped_in)
        self._running.extend(batch.prefill)

    def finish(self, allocator: Allocator, seq: Sequence) -> None:
        """Release a finished sequence."""
        self._running.remove(seq)
        allocator.free(seq.seq_id)

    def fork(self, allocator: Allocator, parent: Sequence, child: Sequence) -> None:
        """A child forked from a running parent (parallel sampling, beam search) runs beside it
        if the allocator forks the parent's KV; else it waits at the head of the queue, to be
        computed like a preempted sequence."""
        if allocator.fork(parent.seq_id, child.seq_id):
            self._running.append(child)
        else:
            self._waiting.appendleft(child)

    def replace_beams(
        self,
        allocator: Allocator,
        dropped: Iterable[Sequence],
        forks: Iterable[tuple[Sequence, Sequence]],
    ) -> None:
        """Beam search's step for one request: free the ``dropped`` running beams and give their
        places in the running order, earliest first, to the ``forks`` ((source, child) pairs: the
        child forked from the running source, sharing its blocks), as many as were dropped.

        Raises:
            RuntimeError: the allocator could not fork (a paged fork needs no new block).
        """
        places = []
        for seq in dropped:  # free first: a fork then never waits on a dropped beam's blocks
            places.append(self._running.index(seq))
            allocator.free(seq.seq_id)
        for place, (source, child) in zip(sorted(places), forks, strict=True):
            if not allocator.fork(source.seq_id, child.seq_id):
                raise RuntimeError("a paged fork needs no new block and cannot fail")
            self._running[place] = child

    def _grow_running(self, allocator: Allocator, batch: Batch, bulk_appends: bool) -> None:
        """Give each running sequence a slot for its next token, preempting the latest arrivals."""
        # One allocator call when every sequence fits (the same state as one append each).
        if bulk_appends and self.running and allocator.try_append_round(
            [seq.seq_id for seq in self.running]
        ):
            batch.decode = list(self.running)
            return
        queue = deque(self.running)
        kept: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            while not allocator.append(seq.seq_id, 1):
                victim = queue.pop() if queue else seq
                self._preempt(allocator, victim, batch)
                if victim is seq:
                    break
            else:
                kept.append(seq)
        self._running[:] = kept  # in place: ``running`` is the same list
        batch.decode = kept

    def _preempt(self, allocator: Allocator, seq: Sequence, batch: Batch) -> None:
        batch.num_preempted += 1
        num_tokens = seq.num_kv_tokens
        allocator.free(seq.seq_id)
        room = self.limits.swap_capacity_tokens - self.num_swapped_tokens
        swapped = self.limits.preemption == "swap" and num_tokens <= room
        seq.record.mark_preempted(swapped)
        if swapped:
            self.num_swapped_tokens += num_tokens
            batch.num_swap_out_tokens += num_tokens
            self._swapped.append(seq)
        else:
            # Back to the head of the queue: it arrived before everything that is waiting.
            self._waiting.appendleft(seq)

    def _has_seat(self, batch: Batch) -> bool:
        num_seqs = len(self._running) + len(batch.swapped_in) + len(batch.prefill)
        return num_seqs < self.limits.max_num_seqs

    def _swap_in(self, allocator: Allocator, batch: Batch) -> list[Sequence]:
        """Swap sequences back in, first out first in, while they fit; returns the ones
        rejected for good."""
        rejected: list[Sequence] = []
        while self._swapped and self._has_seat(batch):
            seq = self._swapped[0]
            # The swapped-in sequence decodes its next token this iteration: one more slot.
            if allocator.admit(seq.seq_id, seq.request, seq.num_kv_tokens + 1):
                batch.num_swap_in_tokens += seq.num_kv_tokens
                batch.swapped_in.append(seq)
            elif self._running or batch.swapped_in:
                batch.memory_blocked = True
                return rejected
            else:
                # Nothing else holds memory: it can never come back (``paged_hybrid`` takes
                # blocks for every token in every group, sliding ones too, where it held a
                # window's before).
                rejected.append(seq)
            self._swapped.popleft()
            self.num_swapped_tokens -= seq.num_kv_tokens
        return rejected

    def _admit_waiting(self, allocator: Allocator, batch: Batch) -> list[Sequence]:
        """Admit waiting requests first come, first served into ``batch`` (whose ``decode`` and
        ``swapped_in`` are set, and nothing swapped out waits); returns the ones rejected for
        good. The admitted ones join the running sequences with ``run_admitted``."""
        rejected: list[Sequence] = []
        # Every running sequence decodes a token this iteration, swapped-in ones included.
        token_budget = (self.limits.max_num_batched_tokens - len(batch.decode)
                        - len(batch.swapped_in))  # fmt: skip
        if self.limits.policy == LPM and len(self._waiting) > 1:
            self._sort_by_prefix_match(allocator)
        max_num_seqs = self.limits.max_num_seqs
        num_seats = (len(self._running) + len(batch.swapped_in)
                     + sum(group_seats(seq, max_num_seqs) for seq in batch.prefill))  # fmt: skip
        while self._waiting:
            seq = self._waiting[0]
            seats = group_seats(seq, max_num_seqs)
            if num_seats + seats > max_num_seqs:
                break
            num_prefill_tokens = seq.num_kv_tokens  # prompt, plus generated tokens on recompute
            if num_prefill_tokens > token_budget:
                if num_prefill_tokens > self.limits.max_num_batched_tokens:
                    # Preempted past the budget: it would block the queue forever.
                    raise ValueError(
                        f"request {seq.request.request_id} was preempted holding "
                        f"{num_prefill_tokens} tokens, more than max_num_batched_tokens="
                        f"{self.limits.max_num_batched_tokens} can recompute; set it >= "
                        f"max_model_len={self.limits.max_model_len}, as vLLM v0 requires")
                break
            # Prefill writes the prompt's KV and produces the first token, which takes a slot.
            if allocator.admit(seq.seq_id, seq.request, num_prefill_tokens + 1):
                self._waiting.popleft()
                seq.num_cached_tokens = _cached_prefix_tokens(allocator, seq.seq_id)
                if allocator.prefix_cache is not None:  # its CPU-tier hits load over PCIe
                    num_loaded = allocator.prefix_cache.loaded_prefix_tokens(seq.seq_id)
                    batch.num_cpu_load_tokens += num_loaded
                    seq.record.mark_cpu_hit(num_loaded)
                token_budget -= num_prefill_tokens
                num_seats += seats
                batch.prefill.append(seq)
                continue
            if not self._running and not batch.prefill and not batch.swapped_in:
                # Nothing else holds memory: the request can never fit this pool.
                self._waiting.popleft()
                rejected.append(seq)
                continue
            batch.memory_blocked = True
            break
        return rejected

    def _sort_by_prefix_match(self, allocator: Allocator) -> None:
        """Longest prefix match first (SGLang's ``lpm``): the waiting sequences in decreasing
        order of the tokens the prefix cache holds of them now; a stable sort, so ties keep
        their order (arrival, preempted ones first)."""
        prefix_cache = allocator.prefix_cache
        if prefix_cache is None:
            return
        ordered = sorted(
            self._waiting,
            key=lambda seq: -prefix_cache.match_tokens(seq.request, seq.num_kv_tokens + 1),
        )
        self._waiting.clear()
        self._waiting.extend(ordered)
