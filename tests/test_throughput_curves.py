"""Knees over summary tables: one bound per curve group, ratios at equal latency."""

import math

import pandas as pd
import pytest

from kvbench.analysis.curves import knee_ratios, knee_sensitivity, knees_frame

LABELS = {"experiment": "e", "workload": "w", "model": "m", "hardware": "h", "num_gpus": 1,
          "block_size": 16, "preemption": "recompute"}  # fmt: skip


def _summary(curves: dict[str, list[tuple[float, float]]], **labels) -> pd.DataFrame:
    rows = [
        {**LABELS, **labels, "allocator": allocator, "request_rate": rate,
         "normalized_latency_s_per_token": latency}
        for allocator, points in curves.items()
        for rate, latency in points
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_every_allocator_of_a_curve_is_held_to_the_same_bound():
    summary = _summary({
        "naive_max": [(1, 0.03), (2, 0.5), (3, 1.0)],
        "paged": [(1, 0.02), (2, 0.03), (3, 0.05), (4, 1.0)],
    })  # fmt: skip
    knees = knees_frame(summary, latency_multiple=4).set_index("allocator")
    assert list(knees["latency_bound_s_per_token"]) == pytest.approx([0.08, 0.08])  # 4 x 0.02
    assert 1 < knees.loc["naive_max", "knee_rate"] < 2
    assert 3 < knees.loc["paged", "knee_rate"] < 4


def test_ratio_is_paged_knee_over_each_allocator_and_censoring_propagates():
    summary = _summary({
        "naive_max": [(1, 0.02), (2, 0.02), (3, 1.0)],
        "paged": [(1, 0.02), (2, 0.02), (3, 0.02)],  # never crosses: knee > 3
    })  # fmt: skip
    knees = knee_ratios(knees_frame(summary, 4)).set_index("allocator")
    assert knees.loc["paged", "knee_ratio"] == 1.0
    assert knees.loc["naive_max", "knee_ratio"] == pytest.approx(3 / knees.loc["naive_max",
                                                                             "knee_rate"])
    assert knees.loc["naive_max", "knee_ratio_bound"] == "lower"  # paged's knee is beyond 3
    assert knees.loc["paged", "knee_ratio_bound"] == "exact"


def test_a_ratio_bound_says_which_knee_is_censored():
    summary = _summary({
        "naive_max": [(1, 0.02), (2, 0.02), (3, 0.02)],  # never crosses
        "naive_oracle": [(1, 0.02), (2, 0.02), (3, 1.0)],
        "paged": [(1, 0.02), (2, 1.0), (3, 1.0)],
    })  # fmt: skip
    bounds = knee_ratios(knees_frame(summary, 4)).set_index("allocator")["knee_ratio_bound"]
    assert bounds["naive_max"] == "upper"  # its knee is beyond 3: paged / it is at most this
    assert bounds["naive_oracle"] == "exact"
    both = _summary({"naive_max": [(1, 0.02), (2, 0.02)], "paged": [(1, 0.02), (2, 0.02)]})
    ratios = knee_ratios(knees_frame(both, 4)).set_index("allocator")
    assert ratios.loc["naive_max", "knee_ratio_bound"] == "unknown"


def test_curves_of_different_deployments_get_their_own_bound_and_reference():
    fast = _summary({"paged": [(1, 0.01), (2, 1.0)], "naive_max": [(1, 0.01), (2, 1.0)]})
    slow = _summary({"paged": [(1, 0.1), (2, 1.0)], "naive_max": [(1, 0.2), (2, 1.0)]},
                    model="big")  # fmt: skip
    knees = knee_ratios(knees_frame(pd.concat([fast, slow]), 4))
    bounds = knees.groupby("model")["latency_bound_s_per_token"].first()
    assert bounds["m"] == pytest.approx(0.04) and bounds["big"] == pytest.approx(0.4)
    big_max = knees[(knees["model"] == "big") & (knees["allocator"] == "naive_max")].iloc[0]
    # paged crosses 0.4 at 1 + log(4)/log(10), naive_max at 1 + log(2)/log(5)
    expected = (1 + math.log(4) / math.log(10)) / (1 + math.log(2) / math.log(5))
    assert big_max["knee_ratio"] == pytest.approx(expected)


def test_single_rate_curves_have_no_knee_and_an_empty_table_stays_empty():
    knees = knees_frame(_summary({"paged": [(2, 0.03)]}), 4)
    assert knees.empty
    assert knee_ratios(knees).empty


def test_absolute_bound_and_unknown_knees():
    summary = _summary({"paged": [(1, 0.5), (2, 0.6)], "naive_max": [(1, 2.0), (2, 3.0)]})
    knees = knee_ratios(knees_frame(summary, 4, max_latency_s_per_token=1.0)).set_index(
        "allocator"
    )
    assert knees.loc["paged", "knee_censored"]
    assert math.isnan(knees.loc["naive_max", "knee_rate"])
    assert math.isnan(knees.loc["naive_max", "knee_ratio"])


def test_sensitivity_has_one_block_per_multiple():
    summary = _summary({"paged": [(1, 0.02), (2, 0.05), (3, 0.5)],
                        "naive_max": [(1, 0.02), (2, 0.5), (3, 1.0)]})  # fmt: skip
    table = knee_sensitivity(summary, (2.0, 10.0))
    assert sorted(table["latency_multiple"].unique()) == [2.0, 10.0]
    paged = table[table["allocator"] == "paged"].set_index("latency_multiple")["knee_rate"]
    assert paged[10.0] > paged[2.0]
