"""experiment=sim_to_real's error table: per-request median absolute percentage errors and the
run figures' signed errors, computed on runs whose truth is known; and the whole task, served
for real on random SmolLM2-shaped weights, on a small config."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import compose_config

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import missing_terms
from kvbench.tasks.profile.profile_file import write_profile
from kvbench.tasks.sim_to_real import run as sim_to_real
from kvbench.tasks.sim_to_real.real_grid import RealGridPoint
from kvbench.tasks.sim_to_real.run import error_summary
from kvbench.tasks.sim_to_real.table import (
    error_row,
    extrapolated_steps_pct,
    floor_lines,
    pass_order_lines,
    repeat_split,
    repeat_split_lines,
    request_pairs,
    stretch_ratios,
)

METRICS_DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()


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


@pytest.mark.parametrize("kv_dtype", ["null", "fp8"])
def test_the_task_serves_both_passes_and_scores_each_profile_and_the_repeat(
        tmp_path, monkeypatch, shared_traces, kv_memories, kv_dtype):  # fmt: skip
    # A grid of one prefill, one decode and one mixed point under each kernel block size.
    grid = [RealGridPoint(block_size, *shape) for block_size in (1, 16)
            for shape in ((2, 12, 0), (2, 20, 3), (1, 16, 3, (8,)))]  # fmt: skip
    monkeypatch.setattr(sim_to_real, "real_grid", lambda max_num_seqs, max_model_len: grid)
    # A task=profile file of profile_grid=cpu (prompts to 256 tokens, contexts to 1,152), which
    # spans these requests of at most 32 tokens.
    profile_cfg = compose_config("task=profile", "model=smollm2-135m", "hardware=cpu")[0]
    profile = tmp_path / "profile.json"
    coefficients = dict.fromkeys(missing_terms({}), 1e-4)  # every term it must price
    write_profile(profile, {"model": "smollm2-135m", "dtype": "fp32",
                            "kv_dtype": "fp8" if kv_dtype == "fp8" else "fp32",
                            "coefficients": coefficients,
                            "grid": dataclasses.asdict(profile_cfg.profile_grid)})  # fmt: skip
    cfg, deployment, raw = compose_config(
        # 2 of SmolLM2's 30 layers: the task's passes and scores do not need all of them.
        "experiment=sim_to_real", "executor.weights=random", "executor.num_threads=1",
        "model.num_layers=2",
        f"workloads.alpaca.path={shared_traces}/alpaca/alpaca_5000_gpt2bpe_lengths.csv",
        "workloads.alpaca.num_requests=3", "workloads.alpaca.max_total_tokens=32",
        "~workloads.sharegpt", "~workloads.azure_conv", "~workload_request_rates.sharegpt",
        "~workload_request_rates.azure_conv", "workload_request_rates.alpaca=[8.0]",
        "allocators=[naive_oracle,paged]", "plots=false", "summary_table=false",
        f"model.kv_dtype={kv_dtype}", f"executor.profile={profile}")  # fmt: skip
    table = sim_to_real.run_sim_to_real(cfg, deployment, raw, tmp_path)
    # The grid's executors (one per block size) and every replay's store K/V as the run says.
    stored = torch.float8_e4m3fn if kv_dtype == "fp8" else torch.float32
    assert [memory.keys[0].dtype for memory in kv_memories] == [stored] * (2 + 2 * 2)
    fitted = json.loads((tmp_path / "profile_real_grid.json").read_text())
    assert fitted["kv_dtype"] == ("fp8" if kv_dtype == "fp8" else "fp32")
    assert list(table["source"]) == [sim_to_real.INTERLEAVED_GRID_SOURCE] * 2 + [
        sim_to_real.FIT_SOURCE] * 2 + [sim_to_real.LOCAL_GRID_SOURCE] * 2 + [
        sim_to_real.GRID_SOURCE] * 2 + [sim_to_real.REPEAT_SOURCE] * 2  # fmt: skip
    assert list(table["allocator"]) == ["naive_oracle", "paged"] * 5
    assert (table["num_compared"] == 3).all()
    assert table["e2e_mape_pct"].notna().all() and (table["e2e_mape_pct"] >= 0).all()
    steps = pd.read_parquet(tmp_path / "real_steps.parquet")
    assert steps["unix_time_s"].is_monotonic_increasing
    # Grid part 0, the first pass, grid part 1, then the second pass.
    phases = steps["phase"].tolist()
    stretches = [phase for i, phase in enumerate(phases) if i == 0 or phase != phases[i - 1]]
    assert stretches == ["grid", "replay", "grid", "repeat"]
    report = (tmp_path / "report.md").read_text()
    assert "real_repeat, alpaca (held out)" in report and "(repeat)" in report
    assert "- interleaved_grid: nearer the measured run than the repeat in" in report
    assert "## Each replay against its repeat\n\n- alpaca @ 8 req/s, naive_oracle: steps" in report
    split = pd.read_parquet(tmp_path / "repeat_split.parquet")
    pd.testing.assert_frame_equal(split, repeat_split(steps))
    assert split["allocator"].tolist() == ["naive_oracle", "paged"]
    # Every column is defined in the table's own section of docs/metrics.md.
    section = METRICS_DOC.split("## repeat_split.parquet", 1)[1].split("\n## ", 1)[0]
    assert [column for column in split.columns if f"`{column}`" not in section] == []
    # The grid's and the fit slice's steps are known, so are the runs' steps beyond them.
    beyond = table.set_index("source")["extrapolated_steps_pct"]
    assert beyond[sim_to_real.FIT_SOURCE].tolist() == [0.0, 0.0]  # fitted on these very runs
    assert beyond[sim_to_real.INTERLEAVED_GRID_SOURCE].between(0, 100).all()
    assert beyond[sim_to_real.GRID_SOURCE].tolist() == [0.0, 0.0]  # within the file's grid
    assert beyond[sim_to_real.REPEAT_SOURCE].isna().all()


def test_the_floor_counts_the_held_out_runs_a_profile_predicted_nearer_than_the_repeat():
    def row(source, workload, e2e, held_out=True):
        return {"source": source, "workload": workload, "request_rate": 4.0,
                "allocator": "paged", "held_out": held_out, "e2e_mape_pct": e2e,
                "ttft_mape_pct": 2 * e2e, "tpot_mape_pct": e2e / 2}

    table = pd.DataFrame([
        row("grid", "a", 5.0), row("grid", "b", 12.0), row("grid", "c", 3.0),
        row("fit", "a", 1.0, held_out=False), row("fit", "b", 9.0), row("fit", "c", 30.0),
        row("real_repeat", "a", 10.0), row("real_repeat", "b", 10.0),
        row("real_repeat", "c", 4.0),
    ])  # fmt: skip
    lines = floor_lines(table, "real_repeat")
    assert lines == [
        "- grid: nearer the measured run than the repeat in 2 of 3 held-out runs (median E2E "
        "error 5.0 % against the repeat's 10.0 %)",
        "- fit: nearer the measured run than the repeat in 1 of 2 held-out runs (median E2E "
        "error 19.5 % against the repeat's 7.0 %)",
    ]
    assert floor_lines(table[table["source"] != "real_repeat"], "real_repeat") == []


def test_a_step_beyond_the_fitted_steps_in_any_feature_is_extrapolated():
    fitted = [IterationShape(32, 528, 0, 0, num_prefill_seqs=1), IterationShape(0, 0, 4, 160)]
    inside = [IterationShape(16, 136, 2, 80, num_prefill_seqs=1), IterationShape(0, 0, 4, 160)]
    assert extrapolated_steps_pct(inside, fitted) == 0.0
    shapes = [
        *inside,
        IterationShape(48, 1176, 0, 0, num_prefill_seqs=1),  # more prefill tokens and pairs
        IterationShape(0, 0, 6, 120),  # a wider decode batch
        IterationShape(0, 0, 4, 200),  # longer contexts
    ]
    assert extrapolated_steps_pct(shapes, fitted) == pytest.approx(60.0)
    assert math.isnan(extrapolated_steps_pct(shapes, None))  # a profile's steps unknown
    assert math.isnan(extrapolated_steps_pct([], fitted))


def _split_steps(phase, ratios, start_unix_s, allocator="paged"):
    """A run of 20 steps priced 0.1 s each, two per stretch, stretch k measured ``ratios[k]``
    times its price."""
    return pd.DataFrame({
        "phase": phase, "workload": "a", "request_rate": 4.0, "allocator": allocator,
        "unix_time_s": start_unix_s + 0.1 * np.arange(20), "grid_fitted_s": 0.1,
        "duration_s": 0.1 * np.repeat(ratios, 2),
    })  # fmt: skip


@pytest.mark.parametrize(("replay", "repeat", "shared_pct"), [
    ([1.1] * 10, [1.1] * 10, 10.0),  # a price both serves miss alike: the profile's
    ([1.2] * 10, [1.1] * 10, 10.0),  # the part both show: the one nearer 1
    ([1.5] * 2 + [1.0] * 8, [1.0] * 6 + [1.5] * 2 + [1.0] * 2, 0.0),  # slow spells apart
    ([1.1] * 10, [0.9] * 10, 0.0),  # the two serves on either side of the price
    ([0.8] * 10, [0.9] * 10, -10.0),  # both faster than priced
])  # fmt: skip
def test_a_replays_miss_splits_into_what_its_repeat_shares_and_its_own(replay, repeat, shared_pct):
    steps = pd.concat([_split_steps("repeat", repeat, 2000.0), _split_steps("grid", [1.0] * 10, 0),
                       _split_steps("replay", replay, 1000.0)])  # any order in: time order used
    split = repeat_split(steps).iloc[0]
    assert split["replay_over_price_pct"] == pytest.approx((np.mean(replay) - 1) * 100)
    assert split["repeat_over_price_pct"] == pytest.approx((np.mean(repeat) - 1) * 100)
    assert split["shared_over_price_pct"] == pytest.approx(shared_pct)
    assert split["replay_alone_pct"] == pytest.approx((np.mean(replay) - 1) * 100 - shared_pct)


def test_stretches_are_equal_in_priced_time_and_a_replay_needs_its_repeat():
    run = pd.DataFrame({"grid_fitted_s": [0.1] * 10 + [1.0], "duration_s": [0.1] * 10 + [2.0]})
    stretches = stretch_ratios(run)
    assert stretches["priced_s"].tolist() == pytest.approx([0.2] * 5 + [1.0])
    assert stretches["ratio"].tolist() == pytest.approx([1.0] * 5 + [2.0])
    steps = pd.concat([_split_steps("replay", [1.0] * 10, 1000.0, "paged"),
                       _split_steps("replay", [1.1] * 10, 1100.0, "naive_max"),
                       _split_steps("repeat", [1.1] * 10, 2000.0, "naive_max")])  # fmt: skip
    lines = repeat_split_lines(repeat_split(steps))
    assert len(lines) == 1 and lines[0].startswith(
        "- a @ 4 req/s, naive_max: steps +10.0 % over the grid's price, its repeat's +10.0 %")
    assert repeat_split(steps[steps["phase"] == "replay"]).empty


def test_the_report_over_many_runs_gives_each_runs_split_where_it_kept_steps():
    from kvbench.tasks.report.sim_to_real_runs import repeat_split_runs_section

    with_repeat = pd.concat([_split_steps("replay", [1.2] * 10, 1000.0),
                             _split_steps("repeat", [1.0] * 10, 2000.0)]).assign(run_dir="r/one")
    without = _split_steps("replay", [1.1] * 10, 3000.0).assign(run_dir="r/two")
    section = repeat_split_runs_section({"real_steps.parquet": pd.concat([with_repeat, without])})
    assert section.startswith("### kvbench's real executor: each replay against its repeat")
    assert "| `one` | 1 | +20.0 to +20.0 % | +0.0 to +0.0 % | +20.0 to +20.0 % |" in section
    assert "`two`" not in section  # a run without a second pass has nothing to split
    assert repeat_split_runs_section({}) == ""


def test_the_pass_order_counts_the_pairs_whose_first_pass_ran_further_over_the_price():
    split = pd.DataFrame({
        "allocator": ["paged", "paged", "naive_max", "naive_max"],
        "replay_over_price_pct": [5.0, 3.0, 1.0, 2.0],
        "repeat_over_price_pct": [1.0, 1.0, 1.0, 0.0],  # the third pair ties
        "replay_alone_pct": [4.0, 2.0, 0.0, 1.0],
    })  # fmt: skip
    assert pass_order_lines(split) == [
        "- the first pass's steps ran further over the price than the repeat's in 3 of 4 pairs "
        "(1 tied) (sign test p 0.25; medians +2.5 and +1.0 %)",
        "- the replays' own share, median per allocator: `paged` +3.0 % (2 replays), "
        "`naive_max` +0.5 % (2 replays)",
    ]
    assert pass_order_lines(split.drop(columns="allocator"))[1:] == []  # vLLM's: no allocator
    assert pass_order_lines(split.iloc[:0]) == []
