"""task=profile_check: a profile's grid, sampled per kind, timed again on a real (tiny) model and
compared with the profile's prices; drift only when systematic and beyond the fit's own error."""

import json
from datetime import UTC, datetime

import pandas as pd
import pytest
import torch
from conftest import compose_config, forbid_model_load
from scipy.stats import binomtest
from test_profile import TINY_GRID

from kvbench.config import ConfigError
from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS
from kvbench.tasks.profile.check import (
    check_lines,
    compare,
    point_kind,
    recorded_grid,
    run_profile_check,
    sample_points,
)
from kvbench.tasks.profile.grid import iteration_grid
from kvbench.tasks.profile.profile_file import write_profile
from kvbench.tasks.profile.run import run_profile

SMOLLM2 = ("model=smollm2-135m", "model.dtype=fp32", "hardware=cpu", "executor.weights=random",
           "executor.num_threads=1", "plots=false", "summary_table=false")  # fmt: skip
# SmolLM2's shape cut to 2 of its 30 layers, for the tests that run the model: they check what
# the task times and writes, which a shallower model does alike, in a fraction of the time.
SHALLOW = (*SMOLLM2, "model.num_layers=2")


def _cpu_grid():
    cfg, deployment, _ = compose_config("task=profile", *SMOLLM2)
    return iteration_grid(cfg.profile_grid, deployment.model.kv_bytes_per_token)


def test_points_are_drawn_per_kind_in_the_grid_s_order_the_same_every_check():
    points = _cpu_grid()
    sample = sample_points(points, 6)
    kinds = [point_kind(point) for point in sample]
    # The cpu grid has 170 decode, 12 prefill and 4 mixed points (and 6 wake-ups, never drawn).
    assert (kinds.count("decode"), kinds.count("prefill"), kinds.count("mixed")) == (6, 6, 4)
    assert sample == sample_points(points, 6)
    positions = [points.index(point) for point in sample]
    assert positions == sorted(positions)
    decodes = [point for point in sample if point_kind(point) == "decode"]
    # Drawn, not strided: the decode points span more than one block size and batch.
    assert len({p.block_size for p in decodes}) > 1 and len({len(p.decode_contexts)
                                                             for p in decodes}) > 1
    assert sample_points(points, 6, seed=1) != sample


def test_more_points_per_kind_than_the_grid_has_takes_every_one_but_the_wake_ups():
    points = _cpu_grid()
    sample = sample_points(points, 1000)
    assert len(sample) == sum(point.wait_s == 0 for point in points) == 186
    assert {point_kind(point) for point in sample} == {"decode", "prefill", "mixed"}


def _table(measured_s, predicted_s):
    measured = pd.Series(measured_s, dtype=float)
    predicted = pd.Series(predicted_s, dtype=float)
    return pd.DataFrame({"measured_s": measured, "predicted_s": predicted,
                         "abs_pct_error": (predicted - measured).abs() / measured * 100})


def test_the_figures_of_a_check():
    # Ratios measured / priced: 0.5, 0.8, 0.9, 1.0 (a tie), 1.2, 2.0.
    table = _table([0.5, 0.8, 0.9, 1.0, 1.2, 2.0], [1.0] * 6)
    check = compare(table, fit_median_abs_pct_error=8.0)
    assert check.num_points == 6 and check.num_slower == 2
    assert check.median_ratio == pytest.approx(0.95)
    assert check.ratio_quartiles == pytest.approx((0.825, 1.15))
    assert check.sign_test_p == pytest.approx(binomtest(2, 5).pvalue)  # the tie left out
    assert check.median_abs_pct_error == pytest.approx(median_error([0.5, 0.8, 0.9, 1.0, 1.2, 2.0]))
    assert not check.drifted


def median_error(measured_s):
    errors = sorted(abs(1.0 - m) / m * 100 for m in measured_s)
    return (errors[2] + errors[3]) / 2


def test_drift_is_a_shift_both_systematic_and_beyond_the_fit_s_own_error():
    faster = _table([0.80, 0.82, 0.78, 0.85, 0.79, 0.81, 0.83, 0.80], [1.0] * 8)
    assert compare(faster, fit_median_abs_pct_error=8.7).drifted
    # The same shift within a fit that misses by more: nothing it did not already miss.
    assert not compare(faster, fit_median_abs_pct_error=25.0).drifted
    # A shift of the median that is not systematic: half the points either way.
    scattered = _table([0.5, 0.6, 0.7, 0.8, 0.8, 1.1, 1.2, 1.3], [1.0] * 8)
    check = compare(scattered, fit_median_abs_pct_error=8.7)
    assert check.median_ratio == pytest.approx(0.8) and check.sign_test_p > 0.05
    assert not check.drifted
    # Too few points to tell: 5 of 5 slower is p = 0.0625.
    assert not compare(_table([1.5] * 5, [1.0] * 5), fit_median_abs_pct_error=8.7).drifted
    with pytest.raises(ValueError, match="no points were timed"):
        compare(_table([], []), 8.7)


def test_a_profile_s_recorded_grid_is_timed_and_the_config_fills_what_it_lacks():
    cfg, _, _ = compose_config("task=profile", *SMOLLM2)
    grid = recorded_grid({"decode_batches": [3], "a_setting_since_dropped": 1}, cfg.profile_grid)
    assert grid.decode_batches == [3] and grid.prefill_prompts == cfg.profile_grid.prefill_prompts
    assert recorded_grid(None, cfg.profile_grid) == cfg.profile_grid


def test_task_profile_check_times_a_profile_s_points_and_finds_a_doctored_one_drifted(tmp_path):
    cfg, deployment, raw = compose_config("task=profile", *SHALLOW, *TINY_GRID)
    run_profile(cfg, deployment, raw, tmp_path / "profile")
    (path,) = (tmp_path / "profile").glob("profile_*.json")
    profile = json.loads(path.read_text())
    written = datetime.fromisoformat(profile["written_utc"])
    assert abs((datetime.now(UTC) - written).total_seconds()) < 600
    # The same profile pricing every step at 10x: this machine runs them at a tenth of that.
    doctored = tmp_path / "doctored.json"
    profile["coefficients"] = {k: 10 * v for k, v in profile["coefficients"].items()}
    doctored.write_text(json.dumps(profile))
    lines, ratios, tables = {}, {}, {}
    for name, profile_path in (("fitted", path), ("doctored", doctored)):
        cfg, deployment, raw = compose_config(
            "task=profile_check", f"executor.profile={profile_path}",
            "profile_check.points_per_kind=3", *SHALLOW)  # fmt: skip
        table = run_profile_check(cfg, deployment, raw, tmp_path / name)
        # The tiny grid's 12 decode, 4 prefill and 1 mixed points: 3, 3 and 1 drawn.
        assert len(table) == 7 and (table["idle_before_s"] == 0).all()
        assert (table["measured_s"] > 0).all()
        assert pd.read_parquet(tmp_path / name / "profile_check.parquet").shape == table.shape
        lines[name] = (tmp_path / name / "report.md").read_text()
        ratios[name] = (table["measured_s"] / table["predicted_s"]).median()
        tables[name] = table
    assert "7 points of its grid (3 decode, 3 prefill, 1 mixed" in lines["fitted"]
    assert "h ago)" in lines["fitted"]
    assert "slower than priced at 0 of 7 (sign test p = 0.016)" in lines["doctored"]
    # Both checks time the same points; the doctored one prices each at 10x. (Their two timings
    # are not compared: under CI's two workers this machine ran the second check up to 1.7x
    # slower than the first.)
    shape_columns = ["kind", "block_size", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
                     "decode_context_tokens", "swap_tokens"]  # fmt: skip
    assert tables["doctored"][shape_columns].equals(tables["fitted"][shape_columns])
    assert tables["doctored"]["predicted_s"].to_numpy() == pytest.approx(
        10 * tables["fitted"]["predicted_s"].to_numpy(), rel=1e-9)
    assert (f"drifted: this machine runs the profile's steps at {ratios['doctored']:.2f}x"
            in lines["doctored"])  # fmt: skip


def test_a_profile_of_fp8_k_v_is_checked_on_fp8_pools_and_only_for_fp8_runs(tmp_path,
                                                                              kv_memories):
    coefficients = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 1e-3)
    path = tmp_path / "profile.json"
    write_profile(path, {"model": "smollm2-135m", "dtype": "fp32", "kv_dtype": "fp8",
                         "fit": {"median_abs_pct_error": 3.0}, "coefficients": coefficients,
                         "grid": {"decode_batches": [2], "decode_mean_contexts": [16],
                                  "prefill_prompts": [8], "mixed_prompts": [8]}})  # fmt: skip
    for kv_dtype in ("fp8", "null"):
        cfg, deployment, raw = compose_config(
            "task=profile_check", f"executor.profile={path}", "profile_check.points_per_kind=2",
            f"model.kv_dtype={kv_dtype}", *SHALLOW)  # fmt: skip
        if kv_dtype == "null":
            with pytest.raises(ValueError, match=r"profile stored K/V in fp8, this run in fp32"):
                run_profile_check(cfg, deployment, raw, tmp_path / "fp32")
            continue
        table = run_profile_check(cfg, deployment, raw, tmp_path / "fp8")
        assert len(table) == 6  # two decode, two prefill and two mixed points
    # A pool for each point in each of the grid's 3 rounds.
    assert [memory.keys[0].dtype for memory in kv_memories] == [torch.float8_e4m3fn] * 6 * 3


def test_the_report_says_a_profile_s_age_and_which_grid_was_timed():
    document = {"model": "smollm2-135m", "dtype": "fp32", "device": "Intel(R) Xeon(R) Processor"}
    points = sample_points(_cpu_grid(), 3)
    check = compare(_table([0.9, 0.92, 0.95, 0.9, 0.93, 0.94, 0.91, 0.92, 0.96], [1.0] * 9), 8.7)
    differences = ["device Intel(R) Xeon(R) Processor (here AMD EPYC)"]
    lines = check_lines("old.json", document, check, points, 3, grid_recorded=False,
                        differences=differences)  # fmt: skip
    assert "Intel(R) Xeon(R) Processor, its time not recorded; fit median |error| 8.7 %" in lines[0]
    assert "9 points of this config's profile_grid (the profile does not record its grid) " \
        "(3 decode, 3 prefill, 3 mixed;" in lines[1]
    assert "timed in 3 rounds" in lines[1] and "slower than priced at 0 of 9" in lines[1]
    # Faster at every point (p = 0.004), by 0.92x: within the fit's 8.7 %.
    assert lines[2] == "holds: a systematic shift to 0.92x its prices, within the fit's own " \
        "8.7 % median error"
    assert lines[3].startswith("measured on device Intel(R) Xeon(R) Processor (here AMD EPYC): ")
    written = {**document, "written_utc": "2026-12-03T10:00:00+00:00"}
    now = datetime(2026, 12, 3, 12, 30, tzinfo=UTC)
    lines = check_lines("new.json", written, check, points, 3, grid_recorded=True,
                        differences=[], now=now)  # fmt: skip
    assert "written 2026-12-03T10:00:00+00:00 (2.5 h ago)" in lines[0]
    assert "9 points of its grid (3 decode" in lines[1] and len(lines) == 3
    # A time written by hand without a zone is taken as UTC.
    naive = {**document, "written_utc": "2026-12-03T11:00:00"}
    lines = check_lines("hand.json", naive, check, points, 3, grid_recorded=True,
                        differences=[], now=now)  # fmt: skip
    assert "(1.5 h ago)" in lines[0]


@pytest.mark.parametrize(("profile", "message"), [
    ({"model": "llama-3-8b"}, r"measured on model llama-3-8b, this run is model=smollm2-135m"),
    ({"model": "smollm2-135m", "dtype": "fp32"}, r"records no fit\.median_abs_pct_error"),
])  # fmt: skip
def test_a_profile_it_cannot_check_is_refused_before_the_model_loads(tmp_path, monkeypatch,
                                                                      profile, message):
    from kvbench.tasks.profile import check

    coefficients = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 1e-3)
    path = tmp_path / "profile.json"
    write_profile(path, {**profile, "coefficients": coefficients})
    cfg, deployment, raw = compose_config("task=profile_check", f"executor.profile={path}",
                                          *SMOLLM2)  # fmt: skip

    forbid_model_load(monkeypatch, check)
    with pytest.raises(ValueError, match=message):
        check.run_profile_check(cfg, deployment, raw, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_task_profile_check_needs_a_profile_and_points():
    with pytest.raises(ConfigError, match=r"set executor\.profile=FILE"):
        compose_config("task=profile_check", *SMOLLM2)
    # 1 point of each kind: 3 points, whose sign test never reaches p < 0.05 (2 / 2**3 = 0.25).
    for points in (0, 1):
        with pytest.raises(ConfigError, match=rf"profile_check\.points_per_kind={points}: must be "
                                              r">= 2 \(its sign test needs 6 points"):
            compose_config("task=profile_check", "executor.profile=x.json",
                           f"profile_check.points_per_kind={points}", *SMOLLM2)  # fmt: skip


def test_the_cli_runs_task_profile_check():
    from kvbench.cli import _task

    assert _task("profile_check") is run_profile_check
