"""Rows of ``kernels.parquet``: one per block size and context length (columns: docs/metrics.md)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvbench.kernels import DecodeBatch, PairTiming

KERNEL_COLUMNS = (
    "device",
    "backend",
    "block_size",
    "batch_size",
    "context_len",
    "paged_ms",
    "contiguous_ms",
    "overhead_pct",
    "achieved_gb_per_s",
    "virtual_contiguous_ms",
    "virtual_overhead_pct",
)


def kernel_row(
    device_name: str,
    backend: str,
    block_size: int,
    context_len: int,
    batch: DecodeBatch,
    timing: PairTiming,
    virtual_timing: PairTiming,
) -> dict[str, Any]:
    """The paged and contiguous kernels' times on one batch, with the overhead and the paged
    kernel's achieved K/V read bandwidth; and the contiguous kernel over vAttention's spans
    (``virtual_timing``: paged vs virtual-contiguous, timed as a pair of its own)."""
    return {
        "device": device_name,
        "backend": backend,
        "block_size": block_size,
        "batch_size": batch.query.shape[0],  # [num_seqs, heads, head_dim]
        "context_len": context_len,
        "paged_ms": timing.paged_ms,
        "contiguous_ms": timing.contiguous_ms,
        "overhead_pct": 100.0 * (timing.paged_ms / timing.contiguous_ms - 1.0),
        # bytes / (ms x 1e6) = GB/s
        "achieved_gb_per_s": batch.kv_bytes / (timing.paged_ms * 1e6),
        "virtual_contiguous_ms": virtual_timing.contiguous_ms,
        "virtual_overhead_pct": 100.0 * (virtual_timing.paged_ms / virtual_timing.contiguous_ms
                                         - 1.0),
    }  # fmt: skip


def kernel_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows measured so far, in the table's column order."""
    return pd.DataFrame(rows, columns=list(KERNEL_COLUMNS))
