"""What the engine returns: per-step records (columnar) and one record per request."""

from __future__ import annotations

import copy
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from kvbench.allocators.base import CohortRounds, MemoryUsage
from kvbench.core.request import Request
from kvbench.engine.step_totals import CHUNK_ROWS, SLOT_COLUMNS, StepTotals

STEP_COLUMNS = (
    "step",
    "time_s",
    "duration_s",
    "batch_size",
    "num_prefill_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    # The rest of the shape the cost model priced (engine.cost_model.IterationShape): what a
    # profile's range is checked against (tasks.profile.grid.steps_beyond).
    "prefill_attention_pairs",
    "decode_context_tokens",
    "num_waiting",
    "num_swapped",
    "num_preempted",
    "memory_blocked",
    *SLOT_COLUMNS,
    # What a step-by-step comparison with vLLM needs (docs/referee.md): blocks held by requests,
    # and the prefix-cache lookups of the requests admitted in the step, resumed ones apart.
    "num_blocks_in_use",
    "prefix_query_tokens",
    "prefix_hit_tokens",
    "resumed_query_tokens",
    "resumed_hit_tokens",
)
# The lookup columns: written by scheduler=vllm_v1 (0 under vllm_v0, whose prefix hits are
# per request: requests.parquet's cached_prompt_tokens).
PREFIX_LOOKUP_COLUMNS = STEP_COLUMNS[-4:]


# Column dtypes of the chunks handed to a sink (every other column is int64).
STEP_DTYPES = {"time_s": np.float64, "duration_s": np.float64, "memory_blocked": np.bool_}
# How each column is held while the engine appends to it: a typed array (``array.array``), 8 or
# 1 bytes a value instead of a Python object, which numpy then reads without converting each
# value (``steps_frame``, the totals, a sink's chunks). A value of the wrong type fails loudly.
_TYPECODES = {"time_s": "d", "duration_s": "d", "memory_blocked": "b"}
StepColumns = dict[str, "array[Any]"]


def empty_step_columns() -> StepColumns:
    """One empty typed array per ``STEP_COLUMNS`` name."""
    return {name: array(_TYPECODES.get(name, "q")) for name in STEP_COLUMNS}

# Takes one chunk of steps: column name -> array of CHUNK_ROWS values (fewer in the last one).
StepSink = Callable[[dict[str, npt.NDArray[Any]]], None]
# Appenders of the columns a stretch of decode-only iterations changes row by row
# (``StepRecords.decode_row_appenders``).
AppendFloat = Callable[[float], None]
AppendInt = Callable[[int], None]
DecodeRowAppenders = tuple[
    AppendFloat, AppendFloat, AppendInt, AppendInt, AppendInt, AppendInt, AppendInt, AppendInt
]


@dataclass
class StepRecords:
    """One entry per engine iteration, stored column by column (cheap to append, to tabulate).

    With a ``sink``, every full chunk of ``CHUNK_ROWS`` steps is folded into the totals and handed
    to the sink (a parquet writer, say), then dropped: memory stays bounded however long the run.
    Without one, ``columns`` keeps every step. ``totals()`` is the same either way.
    """

    columns: StepColumns = field(default_factory=empty_step_columns)
    sink: StepSink | None = None
    # Slots per block of the allocator: num_blocks_in_use is its held slots over this.
    block_size: int = 1
    num_flushed: int = 0  # steps already handed to the sink
    _flushed_totals: StepTotals = field(default_factory=StepTotals)

    def append(
        self,
        *,
        time_s: float,
        duration_s: float,
        batch_size: int,
        num_prefill_seqs: int,
        num_prefill_tokens: int,
        num_decode_tokens: int,
        prefill_attention_pairs: int,
        decode_context_tokens: int,
        num_waiting: int,
        num_swapped: int,
        num_preempted: int,
        memory_blocked: bool,
        usage: MemoryUsage,
        prefix_lookups: tuple[int, int, int, int] = (0, 0, 0, 0),
    ) -> None:
        """Record one iteration that started at ``time_s`` and lasted ``duration_s``;
        ``prefix_lookups`` are (query, hit, resumed query, resumed hit) tokens."""
        columns = self.columns
        step_column = columns["step"]
        step_column.append(self.num_flushed + len(step_column))
        columns["time_s"].append(time_s)
        columns["duration_s"].append(duration_s)
        columns["batch_size"].append(batch_size)
        columns["num_prefill_seqs"].append(num_prefill_seqs)
        columns["num_prefill_tokens"].append(num_prefill_tokens)
        columns["num_decode_tokens"].append(num_decode_tokens)
        columns["prefill_attention_pairs"].append(prefill_attention_pairs)
        columns["decode_context_tokens"].append(decode_context_tokens)
        columns["num_waiting"].append(num_waiting)
        columns["num_swapped"].append(num_swapped)
        columns["num_preempted"].append(num_preempted)
        columns["memory_blocked"].append(memory_blocked)
        columns["token_states_slots"].append(usage.token_states)
        columns["reservation_slots"].append(usage.reservation)
        columns["internal_frag_slots"].append(usage.internal_frag)
        columns["external_frag_slots"].append(usage.external_frag)
        columns["free_slots"].append(usage.free)
        columns["shared_slots"].append(usage.shared_slots)
        columns["saved_slots"].append(usage.saved_slots)
        in_use_slots = usage.token_states + usage.reservation + usage.internal_frag
        columns["num_blocks_in_use"].append(in_use_slots // self.block_size)
        for name, tokens in zip(PREFIX_LOOKUP_COLUMNS, prefix_lookups, strict=True):
            columns[name].append(tokens)
        if self.sink is not None and len(step_column) >= CHUNK_ROWS:
            self._flush_full_chunks()

    def decode_row_appenders(self, memory_blocked: bool) -> DecodeRowAppenders:
        """Appenders for the columns that change between the decode-only iterations of a
        stretch of the fast path, which would otherwise pay a call per iteration: ``time_s``,
        ``duration_s``, ``decode_context_tokens``, ``num_waiting``, ``token_states_slots``,
        ``reservation_slots``, ``internal_frag_slots``, and ``free_slots``
        (``external_frag_slots`` when ``memory_blocked``: ``MemoryUsage.with_free_blocked``).
        Append one value to each per iteration, then ``complete_decode_rows``."""
        columns = self.columns
        return (
            columns["time_s"].append,
            columns["duration_s"].append,
            columns["decode_context_tokens"].append,
            columns["num_waiting"].append,
            columns["token_states_slots"].append,
            columns["reservation_slots"].append,
            columns["internal_frag_slots"].append,
            columns["external_frag_slots" if memory_blocked else "free_slots"].append,
        )

    def complete_decode_rows(
        self,
        num_rows: int,
        *,
        num_seqs: int,
        memory_blocked: bool,
        constant_slots: Mapping[str, int],
    ) -> None:
        """Complete ``num_rows`` decode-only iterations of ``num_seqs`` sequences whose changing
        columns went through ``decode_row_appenders``: the step numbers, the constant columns,
        and ``constant_slots`` (the other slot columns' value in every row). The rows are those
        ``append`` would have written."""
        step_column = self.columns["step"]
        first_step = self.num_flushed + len(step_column)
        step_column.extend(range(first_step, first_step + num_rows))
        constants = {
            "batch_size": num_seqs,
            "num_prefill_seqs": 0,
            "num_prefill_tokens": 0,
            "num_decode_tokens": num_seqs,
            "prefill_attention_pairs": 0,
            "num_swapped": 0,
            "num_preempted": 0,
            "memory_blocked": memory_blocked,
            **constant_slots,
        }
        for name, value in constants.items():
            self.columns[name].extend(repeat(value, num_rows))
        for name in PREFIX_LOOKUP_COLUMNS:
            self.columns[name].extend(repeat(0, num_rows))
        columns = self.columns
        in_use_slots = (
            int(columns["token_states_slots"][row])
            + int(columns["reservation_slots"][row])
            + int(columns["internal_frag_slots"][row])
            for row in range(-num_rows, 0)
        )
        columns["num_blocks_in_use"].extend(slots // self.block_size for slots in in_use_slots)
        if self.sink is not None and len(step_column) >= CHUNK_ROWS:
            self._flush_full_chunks()

    def close(self) -> None:
        """Hand the last, partial chunk to the sink (at the end of the run)."""
        if self.sink is not None and self.columns["step"]:
            self._flush(len(self.columns["step"]))

    def totals(self) -> StepTotals:
        """Sums over every step so far, folded at the fixed chunk boundaries."""
        totals = copy.deepcopy(self._flushed_totals)
        num_rows = len(self.columns["step"])
        for start in range(0, num_rows, CHUNK_ROWS):
            totals.add_chunk(
                {name: values[start : start + CHUNK_ROWS] for name, values in self.columns.items()}
            )
        return totals

    def _flush_full_chunks(self) -> None:
        while len(self.columns["step"]) >= CHUNK_ROWS:
            self._flush(CHUNK_ROWS)

    def _flush(self, num_rows: int) -> None:
        # Typed arrays once, for the totals and the sink alike (a parquet writer takes them
        # without converting each value again).
        chunk: dict[str, npt.NDArray[Any]] = {
            name: np.asarray(values[:num_rows], dtype=STEP_DTYPES.get(name, np.int64))
            for name, values in self.columns.items()
        }
        for values in self.columns.values():
            del values[:num_rows]
        self._flushed_totals.add_chunk(chunk)
        self.num_flushed += num_rows
        assert self.sink is not None
        self.sink(chunk)

    def __len__(self) -> int:
        return self.num_flushed + len(self.columns["step"])


class DecodeRows:
    """The rows of a stretch of decode-only iterations (v0's lazy batch, v1's decode stretches):
    in each, every one of ``num_seqs`` sequences adds a token state, and the round takes the
    blocks and adds the internal fragmentation ``rounds`` says; the usage after each follows
    from ``usage``, the one before the stretch, and a round whose blocks pass
    ``num_free_slots`` cannot run. ``append`` writes a row's changing columns (O(1), through
    ``StepRecords.decode_row_appenders``), ``complete`` the rest.

    ``memory_blocked``: a waiting request does not fit in any of them (``with_free_blocked``:
    the free slots count as external fragmentation)."""

    __slots__ = ("_appenders", "_block_size", "_first_round", "_frag_by_round", "_free_base_slots",
                 "_in_use_slots", "_internal_frag", "_memory_blocked", "_new_blocks",
                 "_num_free_slots", "_num_seqs", "_num_taken_slots", "_steps", "_token_states",
                 "_usage", "num_rows")  # fmt: skip

    def __init__(
        self,
        steps: StepRecords,
        usage: MemoryUsage,
        rounds: CohortRounds,
        *,
        num_seqs: int,
        block_size: int,
        num_free_slots: int,
        memory_blocked: bool,
    ) -> None:
        self._steps = steps
        self._usage = usage
        self._appenders = steps.decode_row_appenders(memory_blocked)
        self._new_blocks = rounds.new_blocks
        self._first_round = rounds.first_round
        self._frag_by_round = rounds.internal_frag_slots
        self._num_seqs = num_seqs
        self._block_size = block_size
        self._memory_blocked = memory_blocked
        self._num_free_slots = num_free_slots
        self._free_base_slots = usage.free + (usage.external_frag if memory_blocked else 0)
        self._token_states = usage.token_states
        self._internal_frag = usage.internal_frag
        self._in_use_slots = usage.token_states + usage.reservation + usage.internal_frag
        self._num_taken_slots = 0
        self.num_rows = 0  # rows appended so far

    def append(self, time_s: float, duration_s: float, context_tokens: int,
               num_waiting: int) -> bool:  # fmt: skip
        """Write the next iteration's row (started at ``time_s``, decoding sequences of
        ``context_tokens`` in all, ``num_waiting`` waiting after it); False, writing nothing,
        when the free slots cannot hold its round's new blocks (a sequence cannot grow: the
        engine preempts, step by step)."""
        num_rows = self.num_rows
        new_blocks = self._new_blocks
        taken_slots = (self._num_taken_slots
                       + new_blocks[num_rows % len(new_blocks)] * self._block_size)  # fmt: skip
        if taken_slots > self._num_free_slots:
            return False
        self._num_taken_slots = taken_slots
        internal_frag = self._internal_frag
        if self._frag_by_round:
            internal_frag += self._frag_by_round.get(self._first_round + num_rows, 0)
            self._internal_frag = internal_frag
        token_states = self._token_states = self._token_states + self._num_seqs
        (append_time_s, append_duration_s, append_context, append_num_waiting,
         append_token_states, append_reservation, append_internal_frag,
         append_free) = self._appenders  # fmt: skip
        append_time_s(time_s)
        append_duration_s(duration_s)
        append_context(context_tokens)
        append_num_waiting(num_waiting)
        append_token_states(token_states)
        append_internal_frag(internal_frag)
        append_reservation(self._in_use_slots + taken_slots - token_states - internal_frag)
        append_free(self._free_base_slots - taken_slots)
        self.num_rows = num_rows + 1
        return True

    def complete(self) -> None:
        """Write the appended rows' constant columns (``StepRecords.complete_decode_rows``):
        external fragmentation (0 free slots when blocked: they changed), shared and saved
        slots."""
        usage = self._usage
        memory_blocked = self._memory_blocked
        self._steps.complete_decode_rows(
            self.num_rows,
            num_seqs=self._num_seqs,
            memory_blocked=memory_blocked,
            constant_slots={
                "free_slots" if memory_blocked else "external_frag_slots": (
                    0 if memory_blocked else usage.external_frag
                ),
                "shared_slots": usage.shared_slots,
                "saved_slots": usage.saved_slots,
            },
        )


# Why a request is never served (RequestRecord.reject_reason); docs/metrics.md defines each.
# vLLM refuses an empty prompt and a prompt with no room for one output token.
EMPTY_PROMPT = "empty_prompt"
PROMPT_EXCEEDS_MAX_MODEL_LEN = "prompt_exceeds_max_model_len"  # prompt >= max_model_len
EXCEEDS_MAX_MODEL_LEN = "exceeds_max_model_len"  # prompt + output > max_model_len
PROMPT_EXCEEDS_MAX_NUM_BATCHED_TOKENS = "prompt_exceeds_max_num_batched_tokens"
EXCEEDS_POOL = "exceeds_pool"  # needs more KV memory than the whole pool holds
REJECT_REASONS = (
    EMPTY_PROMPT,
    PROMPT_EXCEEDS_MAX_MODEL_LEN,
    EXCEEDS_MAX_MODEL_LEN,
    PROMPT_EXCEEDS_MAX_NUM_BATCHED_TOKENS,
    EXCEEDS_POOL,
)


@dataclass(slots=True)
class RequestRecord:
    """The life of one request (times in seconds from the start of the run; NaN = never)."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    requested_output_tokens: int  # the input's output length; > output_tokens when clipped
    output_clipped: bool = False
    admit_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    cached_prompt_tokens: int = 0
    cpu_cached_prompt_tokens: int = 0  # of those, loaded from the CPU tier
    num_preemptions: int = 0
    num_swaps: int = 0
    peak_slots: int = 0
    status: str = "pending"  # finished | rejected
    reject_reason: str = ""  # one of REJECT_REASONS

    # The engine writes a record only through these, one per event of the request's life.

    def mark_admitted(self, now_s: float, cached_prompt_tokens: int) -> None:
        """Note an admission (prefill) at ``now_s``; only the first counts (a recomputed or
        forked sequence keeps the request's first)."""
        if self.admit_s != self.admit_s:  # NaN: first admission
            self.admit_s = now_s
            self.cached_prompt_tokens = cached_prompt_tokens

    def mark_cpu_hit(self, num_tokens: int) -> None:
        """Note the cached prompt tokens its admission loads from the CPU tier; only the first
        admission counts (called before ``mark_admitted``)."""
        if self.admit_s != self.admit_s:  # NaN: first admission
            self.cpu_cached_prompt_tokens = num_tokens

    def mark_first_token(self, end_s: float) -> None:
        """Note that the request's first output token came out at ``end_s``."""
        self.first_token_s = end_s

    def mark_preempted(self, swapped: bool) -> None:
        """Count a preemption of one of the request's sequences (by swap, or recompute)."""
        self.num_preemptions += 1
        if swapped:
            self.num_swaps += 1

    def mark_held_slots(self, num_slots: int) -> None:
        """Note the slots one of its sequences held (the record keeps the peak)."""
        self.peak_slots = max(self.peak_slots, num_slots)

    def mark_finished(self, end_s: float) -> None:
        """Close the record: the request's last sequence finished at ``end_s``."""
        self.finish_s = end_s
        self.status = "finished"

    def mark_rejected(self, reason: str) -> None:
        """Close the record: the request is never served, for ``reason``."""
        self.status = "rejected"
        self.reject_reason = reason


def request_record(request: Request) -> RequestRecord:
    """The record of ``request`` as it arrives: its lengths, and whether its output was clipped
    to fit (``requested_output_tokens`` above ``output_tokens``)."""
    requested_output_tokens = request.requested_output_tokens
    if requested_output_tokens is None:
        requested_output_tokens = request.output_tokens
    return RequestRecord(
        request_id=request.request_id,
        arrival_s=request.arrival_s,
        prompt_tokens=request.prompt_tokens,
        output_tokens=request.output_tokens,
        requested_output_tokens=requested_output_tokens,
        output_clipped=requested_output_tokens > request.output_tokens,
    )


@dataclass
class SimulationResult:
    """Everything one ``simulate`` call produced."""

    steps: StepRecords
    requests: list[RequestRecord]
    num_slots: int
    num_copy_on_writes: int = 0
    # vllm_v1 with a CPU tier: the largest ratio of a step's stores' PCIe time to the step that
    # copies them (simulate_v1._StoreLag); > 1: a store outlasted the step that copied it.
    cpu_store_step_ratio_max: float = 0.0
    # vllm_v1 with a CPU tier: seconds steps waited for flushed stores before computing.
    cpu_flush_wait_s: float = 0.0
