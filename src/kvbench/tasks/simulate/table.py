"""Turn engine records into the tables kvbench writes: steps, requests, summary.

Column definitions (formula, unit): ``docs/metrics.md``. Pure: pandas in, pandas out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from kvbench.allocators.base import USAGE_CATEGORIES
from kvbench.core.specs import Deployment
from kvbench.engine.records import REJECT_REASONS, STEP_DTYPES, RequestRecord, SimulationResult
from kvbench.engine.step_totals import StepTotals
from kvbench.tables.record_columns import records_frame

GB = 1e9


def steps_frame(result: SimulationResult, deployment: Deployment) -> pd.DataFrame:
    """One row per iteration: time, batch, queue, every usage category in slots and GB."""
    return step_table(result.steps.columns, deployment)


def step_table(
    columns: Mapping[str, Sequence[float | int | bool] | np.ndarray], deployment: Deployment
) -> pd.DataFrame:
    """``steps_frame`` of step records given column by column (a whole run, or a streamed
    chunk of one).

    Each column becomes one typed array first (``STEP_DTYPES``, else int64: the dtypes pandas
    infers from the engine's values): pandas inferring the type of every Python value of a
    list costs ten times more.
    """
    arrays: dict[str, np.ndarray] = {
        name: np.asarray(values, dtype=STEP_DTYPES.get(name, np.int64))
        for name, values in columns.items()
    }
    bytes_per_slot = deployment.slots_to_bytes(1)
    for category in (*USAGE_CATEGORIES, "shared"):
        slots = arrays[f"{category}_slots"].astype(np.float64)
        arrays[f"{category}_gb"] = slots * bytes_per_slot / GB
    return pd.DataFrame(arrays, copy=False)


def requests_frame(result: SimulationResult) -> pd.DataFrame:
    """One row per request with its latencies (s) and normalized latency (s/token); the columns
    are ``RequestRecord``'s fields, read field by field (``records_frame``)."""
    return add_request_latencies(records_frame(result.requests, RequestRecord))


def add_request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Request records (one row each, as ``RequestRecord``) plus their derived latency columns."""
    if requests.empty:
        return requests
    requests["ttft_s"] = requests["first_token_s"] - requests["arrival_s"]
    requests["e2e_latency_s"] = requests["finish_s"] - requests["arrival_s"]
    decode_tokens = (requests["output_tokens"] - 1).where(requests["output_tokens"] > 1)
    requests["tpot_s"] = (requests["finish_s"] - requests["first_token_s"]) / decode_tokens
    # Undefined (NaN) for a request with no output token, so it never puts inf into a mean.
    requests["normalized_latency_s_per_token"] = requests["e2e_latency_s"] / requests[
        "output_tokens"
    ].where(requests["output_tokens"] > 0)
    return requests


def _time_weighted_pct(totals: StepTotals, column: str, num_slots: int) -> float:
    if totals.duration_s == 0 or num_slots == 0:
        return float("nan")
    return totals.weighted[column] / totals.duration_s / num_slots * 100


def _percentile(values: pd.Series, q: float) -> float:
    values = values.dropna()
    return float(np.percentile(values, q)) if len(values) else float("nan")


def summarize(
    requests: pd.DataFrame, result: SimulationResult, deployment: Deployment
) -> dict[str, float | int]:
    """The run's summary row: utilization breakdown, batch size, throughput, latency.

    Step-based figures come from ``result.steps.totals()``, so they need no step table (the steps
    may have been streamed out).
    """
    finished = requests[requests["status"] == "finished"]
    num_slots = result.num_slots
    totals = result.steps.totals()
    row: dict[str, float | int] = {
        "num_requests": len(requests),
        "num_finished": len(finished),
        "num_rejected": int((requests["status"] == "rejected").sum()),
        **_rejections_by_reason(requests),
        "num_output_clipped": int(requests["output_clipped"].sum()),
        "num_zero_output": int((requests["output_tokens"] == 0).sum()),
        "num_preemptions": int(requests["num_preemptions"].sum()),
        "num_swaps": int(requests["num_swaps"].sum()),
        "cow_copies": result.num_copy_on_writes,
        "num_steps": totals.num_steps,
        "num_kv_slots": num_slots,
        "kv_pool_gb": deployment.slots_to_bytes(num_slots) / GB,
    }
    for category in USAGE_CATEGORIES:
        row[f"{category}_pct"] = _time_weighted_pct(totals, f"{category}_slots", num_slots)
    row["shared_pct"] = _time_weighted_pct(totals, "shared_slots", num_slots)
    held_pct = 100 - row["free_pct"]  # held: not free (docs/metrics.md, the words)
    row["token_states_pct_of_held"] = (
        row["token_states_pct"] / held_pct * 100 if held_pct > 0 else float("nan")
    )
    row["kv_held_gb"] = row["kv_pool_gb"] * held_pct / 100
    row["token_states_gb"] = row["kv_pool_gb"] * row["token_states_pct"] / 100
    row.update(_sharing(totals, requests, deployment))
    row["mean_batch_size"] = (
        totals.batch_size_sum / totals.num_steps if totals.num_steps else float("nan")
    )
    row.update(_throughput(finished))
    for name, column in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_latency_s")):
        row[f"{name}_p50_s"] = _percentile(finished[column], 50)
        row[f"{name}_p99_s"] = _percentile(finished[column], 99)
    return row


def _rejections_by_reason(requests: pd.DataFrame) -> dict[str, int]:
    """``num_rejected_<reason>`` for every reason the engine gives (0 where none)."""
    counts = requests.loc[requests["status"] == "rejected", "reject_reason"].value_counts()
    return {f"num_rejected_{reason}": int(counts.get(reason, 0)) for reason in REJECT_REASONS}


def _sharing(
    totals: StepTotals, requests: pd.DataFrame, deployment: Deployment
) -> dict[str, float]:
    """What sharing saved: peak saved slots, the paper's Fig. 15 saving, prefix-cache hits."""
    saved_slot_s = totals.weighted["saved_slots"]
    without_sharing = saved_slot_s + totals.weighted["in_use_slots"]
    admitted = requests[requests["admit_s"].notna()]
    prompt_tokens = admitted["prompt_tokens"].sum()
    saved_slots = totals.max_saved_slots
    return {
        "shared_slots": totals.weighted["shared_slots"] / totals.duration_s
        if totals.duration_s > 0
        else float("nan"),
        "saved_slots": saved_slots,
        "saved_gb": deployment.slots_to_bytes(saved_slots) / GB,
        "memory_saving_pct": float(100 * saved_slot_s / without_sharing)
        if without_sharing > 0
        else float("nan"),
        "prefix_hit_rate": float(admitted["cached_prompt_tokens"].sum() / prompt_tokens)
        if prompt_tokens > 0
        else float("nan"),
        "prefix_block_hit_rate": _block_hit_rate(admitted),
        **_hit_rates_by_tier(admitted, prompt_tokens),
    }


def _hit_rates_by_tier(admitted: pd.DataFrame, prompt_tokens: int) -> dict[str, float]:
    """``prefix_hit_rate`` split by where the hit tokens were: the GPU cache or the CPU tier."""
    if prompt_tokens <= 0:
        return {"prefix_gpu_hit_rate": float("nan"), "prefix_cpu_hit_rate": float("nan")}
    cached = admitted["cached_prompt_tokens"].sum()
    cpu_cached = admitted["cpu_cached_prompt_tokens"].sum()
    return {"prefix_gpu_hit_rate": float((cached - cpu_cached) / prompt_tokens),
            "prefix_cpu_hit_rate": float(cpu_cached / prompt_tokens)}  # fmt: skip


def _block_hit_rate(admitted: pd.DataFrame) -> float:
    """Prompt blocks found in the prefix cache / prompt blocks (a partial last block counted),
    over admitted requests; NaN without a ``block_size`` column or without prompts."""
    if "block_size" not in admitted.columns or admitted.empty:
        return float("nan")
    block_size = admitted["block_size"]
    prompt_blocks = (-(-admitted["prompt_tokens"] // block_size)).sum()
    hit_blocks = (admitted["cached_prompt_tokens"] // block_size).sum()
    return float(hit_blocks / prompt_blocks) if prompt_blocks > 0 else float("nan")


def _throughput(finished: pd.DataFrame) -> dict[str, float]:
    if finished.empty:
        nan = float("nan")
        return {
            "duration_s": nan,
            "request_throughput": nan,
            "output_token_throughput": nan,
            "normalized_latency_s_per_token": nan,
        }
    duration_s = float(finished["finish_s"].max() - finished["arrival_s"].min())
    return {
        "duration_s": duration_s,
        "request_throughput": len(finished) / duration_s,
        "output_token_throughput": float(finished["output_tokens"].sum()) / duration_s,
        "normalized_latency_s_per_token": float(finished["normalized_latency_s_per_token"].mean()),
    }
