"""Where every request of a workload went: the one line a run prints per workload.

Pure: summary rows (``summary.parquet``'s columns) and the built workload's ``attrs`` in, text
out. A benchmark that changed its workload without saying so could not be trusted with a
capacity decision, so the line counts every request: read, served, rejected by reason, clipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.engine.records import REJECT_REASONS
from kvbench.workloads.build import (
    NUM_FILTERED_ROWS_ATTR,
    NUM_READ_ROWS_ATTR,
    NUM_SKIPPED_RECORDS_ATTR,
)


def _count(values: pd.Series) -> str:
    """One number when every run agrees, else the range over runs."""
    low, high = int(values.min()), int(values.max())
    return f"{low:,}" if low == high else f"{low:,}-{high:,} (by run)"


def _source(attrs: Mapping[str, Any]) -> str:
    if NUM_READ_ROWS_ATTR not in attrs:
        return ""
    name = Path(str(attrs.get("source", "trace"))).name
    num_filtered = int(attrs.get(NUM_FILTERED_ROWS_ATTR, 0))
    num_read = int(attrs[NUM_READ_ROWS_ATTR])
    num_skipped = int(attrs.get(NUM_SKIPPED_RECORDS_ATTR, 0))
    skipped = (f"; {num_skipped:,} records without a prompt and its answer skipped before"
               if num_skipped else "")  # fmt: skip
    return (f" from {num_read:,} rows of {name} ({num_filtered:,} removed by its filter"
            f"{skipped})")  # fmt: skip


def workload_accounting(
    workload: str, summary: pd.DataFrame, attrs: Mapping[str, Any] | None = None
) -> str:
    """The line for one workload's runs (rows of ``summary`` with that ``workload``).

    ``attrs`` are the built workload frame's (``build_workload``): a trace's rows read and
    filtered. Counts that differ between runs (``exceeds_pool`` depends on the allocator) are
    shown as their range.
    """
    runs = summary[summary["workload"] == workload]
    rejected = [
        f"{reason} {_count(runs[f'num_rejected_{reason}'])}"
        for reason in REJECT_REASONS
        if runs[f"num_rejected_{reason}"].max() > 0
    ]
    rejected_text = f" ({', '.join(rejected)})" if rejected else ""
    return (
        f"kvbench: workload {workload}: {_count(runs['num_requests'])} requests"
        f"{_source(attrs or {})}; served {_count(runs['num_finished'])}, rejected "
        f"{_count(runs['num_rejected'])}{rejected_text}; outputs clipped to the model's context "
        f"{_count(runs['num_output_clipped'])}"
    )
