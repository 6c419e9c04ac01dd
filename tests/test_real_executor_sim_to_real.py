"""experiment=sim_to_real's error table: per-request median absolute percentage errors and the
run figures' signed errors, computed on runs whose truth is known."""

import math

import pandas as pd
import pytest

from kvbench.tasks.sim_to_real.run import error_summary
from kvbench.tasks.sim_to_real.table import error_row, request_pairs


def _requests(e2e, ttft, status=None):
    rows = len(e2e)
    return pd.DataFrame({
        "request_id": range(rows), "status": status or ["finished"] * rows,
        "e2e_latency_s": e2e, "ttft_s": ttft, "tpot_s": [value / 10 for value in e2e],
    })  # fmt: skip


def test_errors_are_medians_over_requests_finished_in_both():
    measured = _requests([1.0, 2.0, 4.0, 8.0], [0.1, 0.2, 0.4, 0.8])
    predicted = _requests([1.1, 1.0, 4.0, 100.0], [0.1, 0.2, 0.5, 0.8],
                          status=["finished", "finished", "finished", "rejected"])
    pairs = request_pairs(measured, predicted)
    assert list(pairs["request_id"]) == [0, 1, 2]  # request 3 did not finish in both
    figures = {"output_token_throughput": 100.0, "mean_batch_size": 4.0,
               "peak_kv_in_use_slots": 200.0}  # fmt: skip
    guess = {"output_token_throughput": 90.0, "mean_batch_size": 5.0,
             "peak_kv_in_use_slots": 200.0}  # fmt: skip
    row = error_row(pairs, figures, guess)
    assert row["e2e_mape_pct"] == pytest.approx(10.0)  # |errors| 10 %, 50 %, 0 %: median 10
    assert row["ttft_mape_pct"] == pytest.approx(0.0)  # 0 %, 0 %, 25 %
    assert row["output_token_throughput_error_pct"] == pytest.approx(-10.0)
    assert row["mean_batch_size_error_pct"] == pytest.approx(25.0)
    assert row["peak_kv_in_use_slots_error_pct"] == 0.0
    assert row["num_compared"] == 3


def test_error_summary_names_held_out_slices():
    table = pd.DataFrame([
        {"source": "fit_slice", "workload": w, "held_out": w != "a", "e2e_mape_pct": e,
         "ttft_mape_pct": 1.0, "tpot_mape_pct": 2.0, "output_token_throughput_error_pct": 3.0,
         "mean_batch_size_error_pct": -1.0, "peak_kv_in_use_slots_error_pct": 0.0}
        for w, e in (("a", 1.0), ("b", 4.0), ("b", 6.0))
    ])  # fmt: skip
    lines = error_summary(table)
    assert lines[0].startswith("- fit_slice, a (fit slice): median over runs of E2E 1.0 %")
    assert lines[1].startswith("- fit_slice, b (held out): median over runs of E2E 5.0 %")
    assert not math.isnan(float(lines[1].split("E2E ")[1].split(" %")[0]))
