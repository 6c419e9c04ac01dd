"""Running totals of the step records: what the summary needs, without keeping every step.

Folded chunk by chunk at fixed step boundaries (rows ``[i * CHUNK_ROWS, (i + 1) * CHUNK_ROWS)``),
so the totals are the same floats whether the steps were kept in memory or streamed out, and
whichever engine path produced them.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

CHUNK_ROWS = 65_536
# One step column: the values kept in memory, or a typed chunk of them.
StepColumn = SequenceOf[float | int | bool] | npt.NDArray[Any]
# The step columns of the pool's usage (slots), as ``StepRecords`` stores them.
SLOT_COLUMNS = (
    "token_states_slots",
    "reservation_slots",
    "internal_frag_slots",
    "external_frag_slots",
    "free_slots",
    "shared_slots",
    "saved_slots",
)
# Columns whose duration-weighted sums (slots x s) the summary uses; in use = token states +
# reservation + internal fragmentation (docs/metrics.md, the words).
WEIGHTED_COLUMNS = (*SLOT_COLUMNS, "in_use_slots")


@dataclass
class StepTotals:
    """Sums over every step of a run.

    Attributes:
        num_steps: iterations.
        duration_s: their summed duration (s).
        batch_size_sum: summed batch sizes (sequences).
        weighted: column -> sum over steps of column x duration_s (slot-seconds).
        max_saved_slots: the most slots sharing saved at any step.
    """

    num_steps: int = 0
    duration_s: float = 0.0
    batch_size_sum: int = 0
    weighted: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WEIGHTED_COLUMNS, 0.0))
    max_saved_slots: int = 0

    def add_chunk(self, columns: Mapping[str, StepColumn]) -> None:
        """Fold in one chunk of step rows (a whole ``CHUNK_ROWS`` one, or the run's last)."""
        durations_s = np.asarray(columns["duration_s"], dtype=np.float64)
        if not len(durations_s):
            return
        self.num_steps += len(durations_s)
        self.duration_s += float(durations_s.sum())
        self.batch_size_sum += int(np.asarray(columns["batch_size"], dtype=np.int64).sum())
        in_use_slots = (
            np.asarray(columns["token_states_slots"], dtype=np.int64)
            + np.asarray(columns["reservation_slots"], dtype=np.int64)
            + np.asarray(columns["internal_frag_slots"], dtype=np.int64)
        )
        for name in WEIGHTED_COLUMNS:
            slots = in_use_slots if name == "in_use_slots" else np.asarray(columns[name], np.int64)
            self.weighted[name] += float((slots.astype(np.float64) * durations_s).sum())
        saved_slots = np.asarray(columns["saved_slots"], dtype=np.int64)
        self.max_saved_slots = max(self.max_saved_slots, int(saved_slots.max()))
