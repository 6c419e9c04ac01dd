"""Rows of ``paper_executed.parquet``: each allocator's throughput, batch and KV memory, measured
on the real model and simulated (profiled, roofline), with paged's ratios over the baselines.

A run's figures (``run_figures``) come from the engine's own records whatever priced its
iterations, so the measured and the simulated rows are computed by the same code. Column
definitions: docs/metrics.md, ``paper_executed.parquet``. Pure: pandas in, pandas out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvbench.core.specs import Deployment
from kvbench.engine.records import SimulationResult
from kvbench.tasks.report.markdown_table import markdown_table
from kvbench.tasks.simulate.table import GB, requests_frame, summarize

MEASURED = "measured"
SOURCES = (MEASURED, "profiled", "roofline")
# What requests hold, memory in use: slots storing tokens, reserved for them, or never to be used.
IN_USE_CATEGORIES = ("token_states", "reservation", "internal_frag")
# The run figures a table row holds (medians over a source's runs).
FIGURES = (
    "output_token_throughput",
    "mean_batch_size",
    "kv_in_use_gb",
    "kv_used_gb",
    "peak_kv_in_use_gb",
    "duration_s",
    "normalized_latency_s_per_token",
    "num_finished",
)
# A measured run's machine probes: a decode step's measured time over the profile's price of it,
# the mean of the probes timed just before and just after the run (``run.PROBES``: 4 sequences
# of 128-384 tokens, 16 of 32-96).
PROBE_COLUMNS = ("probe_4_seqs_over_profile", "probe_16_seqs_over_profile")
# A table row's labels: (request_rate, source, allocator).
RowKey = tuple[float, str, str]
# paged's throughput over each baseline's: the paper's "x times the throughput".
BASELINES = ("naive_max", "naive_oracle")
PAGED = "paged"


def run_figures(result: SimulationResult, deployment: Deployment) -> dict[str, float]:
    """One run's figures: output tokens/s, mean batch, KV in use by requests and storing tokens
    (GB, time-weighted over the run's iterations), the most KV in use at once (GB), its duration
    and normalized latency."""
    summary = summarize(requests_frame(result), result, deployment)
    pool_gb = float(summary["kv_pool_gb"])
    in_use_pct = sum(float(summary[f"{category}_pct"]) for category in IN_USE_CATEGORIES)
    columns = result.steps.columns
    in_use_slots = sum(np.asarray(columns[f"{category}_slots"], dtype=np.float64)
                       for category in IN_USE_CATEGORIES)  # fmt: skip
    peak_in_use_slots = float(np.max(in_use_slots)) if len(columns["token_states_slots"]) else 0.0
    return {
        "output_token_throughput": float(summary["output_token_throughput"]),
        "mean_batch_size": float(summary["mean_batch_size"]),
        "kv_in_use_gb": pool_gb * in_use_pct / 100,
        "kv_used_gb": pool_gb * float(summary["token_states_pct"]) / 100,
        "peak_kv_in_use_gb": deployment.slots_to_bytes(peak_in_use_slots) / GB,
        "duration_s": float(summary["duration_s"]),
        "normalized_latency_s_per_token": float(summary["normalized_latency_s_per_token"]),
        "num_finished": float(summary["num_finished"]),
    }


def paper_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (request rate, source, allocator) from ``runs`` (one row per run:
    ``request_rate``, ``source``, ``allocator``, ``round`` and ``FIGURES``): the medians over
    the runs, the throughput's spread over them, and paged's throughput over each baseline's at
    the same rate and source; the probes' medians where ``runs`` has them (NaN for the
    simulated rows)."""
    grouped = runs.groupby(["request_rate", "source", "allocator"], sort=False)
    medians = [*FIGURES, *(column for column in PROBE_COLUMNS if column in runs)]
    table = grouped[medians].median().reset_index()
    throughput = grouped["output_token_throughput"]
    table["num_runs"] = grouped.size().to_numpy()
    table["output_token_throughput_spread_pct"] = (
        (throughput.max() - throughput.min()) / throughput.median() * 100
    ).to_numpy()
    # Every row's throughput by (rate, source, allocator): what each ratio divides.
    keys: list[RowKey] = list(zip(table["request_rate"], table["source"], table["allocator"],
                                  strict=True))  # fmt: skip
    by_key = dict(zip(keys, table["output_token_throughput"], strict=True))
    for baseline in BASELINES:
        table[f"paged_over_{baseline}"] = [
            _ratio(by_key, (rate, source, PAGED), (rate, source, baseline))
            for rate, source, _ in keys
        ]
    table["throughput_over_measured"] = [
        _ratio(by_key, (rate, source, allocator), (rate, MEASURED, allocator))
        for rate, source, allocator in keys
    ]
    return table


def _ratio(throughput: dict[RowKey, float], numerator: RowKey, denominator: RowKey) -> float:
    """The throughput of the row keyed ``numerator`` over that of ``denominator`` (keys
    ``(request_rate, source, allocator)``); NaN if either did not run or the denominator served
    nothing. Within a source: paged over a baseline; within an allocator: a simulation over
    the real run."""
    if numerator not in throughput or not throughput.get(denominator, 0.0) > 0:
        return float("nan")
    return float(throughput[numerator] / throughput[denominator])


def markdown_rows(table: pd.DataFrame) -> str:
    """The table as markdown: one row per source and allocator, throughput, batch, memory."""
    header = ["req/s", "source", "allocator", "runs", "output tok/s", "spread %",
              "tok/s / measured", "mean batch", "KV in use GB", "KV used GB", "peak KV in use GB",
              "paged / naive_max", "paged / naive_oracle",
              "probes (4 / 16 seqs) / profile"]  # fmt: skip
    rows: list[Sequence[object]] = [
        [row.request_rate, row.source, row.allocator, int(row.num_runs),
         row.output_token_throughput, row.output_token_throughput_spread_pct,
         row.throughput_over_measured,
         row.mean_batch_size, row.kv_in_use_gb, row.kv_used_gb, row.peak_kv_in_use_gb,
         row.paged_over_naive_max, row.paged_over_naive_oracle, _probes(row)]
        for row in table.itertuples()
    ]  # fmt: skip
    return markdown_table(header, rows, digits=3)


def _probes(row: object) -> str:
    """A row's probes over the profile, "small / large" (blank where not probed)."""
    ratios = [getattr(row, column, float("nan")) for column in PROBE_COLUMNS]
    return "" if any(np.isnan(ratios)) else " / ".join(f"{ratio:.2f}" for ratio in ratios)
