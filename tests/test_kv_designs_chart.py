"""The KV designs chart (``plots/kv_designs_chart.py``): the numbers it draws come from the
sweep's highest rate and each curve's knee, and it passes the layout checks every chart does."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from chart_layout import layout_problems

from kvbench.analysis.curves import knees_frame
from kvbench.plots import kv_designs_chart
from kvbench.plots.figure import save_figure
from kvbench.plots.kv_designs_chart import kv_designs_rows, plot_kv_designs

ALLOCATORS = ("naive_max", "paged", "vattention_64k", "vattention_2m")


def _summary() -> pd.DataFrame:
    """Two rates per curve; every number distinct so a row taken from the wrong rate, dtype or
    allocator shows. naive_max's latency explodes at the high rate (a knee inside the sweep)."""
    rows = []
    for workload_index, workload in enumerate(("sharegpt", "azure_conv")):
        for allocator_index, allocator in enumerate(ALLOCATORS):
            for dtype_index, kv_dtype in enumerate(("bf16", "fp8")):
                for rate in (2.0, 8.0):
                    code = 100 * workload_index + 10 * allocator_index + dtype_index
                    slow = allocator == "naive_max" and kv_dtype == "bf16" and rate == 8.0
                    rows.append({
                        "experiment": "kv_designs", "workload": workload, "model": "llama-3-8b",
                        "hardware": "h100-80gb", "num_gpus": 1, "block_size": 16,
                        "preemption": "recompute", "kv_dtype": kv_dtype, "allocator": allocator,
                        "request_rate": rate,
                        "token_states_pct_of_held": code + rate / 100,
                        "mean_batch_size": 2 * code + rate,
                        "ttft_p50_s": code / 10 + rate,
                        "normalized_latency_s_per_token": 1.0 if slow else 0.01,
                    })  # fmt: skip
    return pd.DataFrame(rows)


def test_the_chart_reads_the_highest_rate_and_each_curves_knee():
    summary = _summary()
    rows = kv_designs_rows(summary, knees_frame(summary, latency_multiple=4.0))
    assert len(rows) == 2 * len(ALLOCATORS) * 2
    assert set(rows["request_rate"]) == {8.0}
    paged_fp8_azure = rows[(rows["workload"] == "azure_conv") & (rows["allocator"] == "paged")
                           & (rows["kv_dtype"] == "fp8")].iloc[0]  # fmt: skip
    assert paged_fp8_azure["token_states_pct_of_held"] == pytest.approx(111.08)
    assert paged_fp8_azure["mean_batch_size"] == pytest.approx(230.0)
    assert paged_fp8_azure["ttft_p50_s"] == pytest.approx(19.1)
    # Never crossed: the knee is the highest rate, censored.
    assert paged_fp8_azure["knee_rate"] == 8.0 and paged_fp8_azure["knee_censored"]
    naive_bf16 = rows[(rows["allocator"] == "naive_max") & (rows["kv_dtype"] == "bf16")]
    assert (naive_bf16["knee_rate"] < 8.0).all() and not naive_bf16["knee_censored"].any()


def test_the_chart_keeps_the_sweeps_allocator_order_the_models_dtype_before_fp8():
    summary = _summary()
    rows = kv_designs_rows(summary.iloc[::-1], pd.DataFrame())
    sharegpt = rows[rows["workload"] == "sharegpt"]
    assert list(dict.fromkeys(sharegpt["allocator"])) == list(ALLOCATORS[::-1])
    assert list(sharegpt["kv_dtype"][:2]) == ["bf16", "fp8"]
    assert rows["knee_rate"].map(math.isnan).all()


def test_the_chart_passes_the_layout_and_colour_checks(tmp_path, monkeypatch):
    summary = _summary()
    problems: dict[str, list[str]] = {}

    def capture(fig, out_dir, name):
        problems[name] = layout_problems(fig)
        save_figure(fig, out_dir, name)

    monkeypatch.setattr(kv_designs_chart, "save_figure", capture)
    plot_kv_designs(kv_designs_rows(summary, knees_frame(summary, 4.0)), tmp_path, "designs")
    assert problems == {"designs": []}
    assert (tmp_path / "designs.png").is_file()
