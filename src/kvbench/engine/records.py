"""What the engine returns: per-step records (columnar) and one record per request."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.allocators.base import MemoryUsage

STEP_COLUMNS = (
    "step",
    "time_s",
    "duration_s",
    "batch_size",
    "num_prefill_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_waiting",
    "num_swapped",
    "num_preempted",
    "memory_blocked",
    "token_states_slots",
    "reservation_slots",
    "internal_frag_slots",
    "external_frag_slots",
    "free_slots",
    "shared_slots",
    "saved_slots",
)


@dataclass
class StepRecords:
    """One entry per engine iteration, stored column by column (cheap to append, to tabulate)."""

    columns: dict[str, list[float | int | bool]] = field(
        default_factory=lambda: {name: [] for name in STEP_COLUMNS}
    )

    def append(
        self,
        *,
        time_s: float,
        duration_s: float,
        batch_size: int,
        num_prefill_seqs: int,
        num_prefill_tokens: int,
        num_decode_tokens: int,
        num_waiting: int,
        num_swapped: int,
        num_preempted: int,
        memory_blocked: bool,
        usage: MemoryUsage,
    ) -> None:
        """Record one iteration that started at ``time_s`` and lasted ``duration_s``."""
        values = (
            len(self.columns["step"]),
            time_s,
            duration_s,
            batch_size,
            num_prefill_seqs,
            num_prefill_tokens,
            num_decode_tokens,
            num_waiting,
            num_swapped,
            num_preempted,
            memory_blocked,
            usage.token_states,
            usage.reservation,
            usage.internal_frag,
            usage.external_frag,
            usage.free,
            usage.shared_slots,
            usage.saved_slots,
        )
        for name, value in zip(STEP_COLUMNS, values, strict=True):
            self.columns[name].append(value)

    def __len__(self) -> int:
        return len(self.columns["step"])


@dataclass
class RequestRecord:
    """The life of one request (times in seconds from the start of the run; NaN = never)."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    admit_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    num_swaps: int = 0
    peak_slots: int = 0
    status: str = "pending"  # finished | rejected
    reject_reason: str = ""


@dataclass
class SimulationResult:
    """Everything one ``simulate`` call produced."""

    steps: StepRecords
    requests: list[RequestRecord]
    num_slots: int
    num_copy_on_writes: int = 0
