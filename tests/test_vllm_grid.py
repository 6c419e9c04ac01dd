"""The grid a profile of real vLLM is fitted on (``tasks.sim_to_real.vllm_grid``) and the pure parts
of ``experiment=sim_to_vllm`` around it: points the engine could not hold are left out, mixed
points' decodes outlast the prompts joining them, the grid's parts alternate with the replays,
every replay is held out from the grid profile, and the steps table shows drift on one time line.
vLLM itself runs in the peer tests (test_sim_to_vllm.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS
from kvbench.engine.simulate_v1 import chunks_shape
from kvbench.referee.vllm_engine import EngineRun, EngineStep
from kvbench.tasks.sim_to_real.fair_instrument import profile_tables
from kvbench.tasks.sim_to_real.vllm import (
    GridRun,
    VllmRunRecord,
    drift_lines,
    vllm_steps_frame,
)
from kvbench.tasks.sim_to_real.vllm_grid import (
    GRID_REPEATS,
    VllmGridPoint,
    interleave,
    length_scales,
    mixed_decode_steps,
    vllm_grid,
)

# sim_to_vllm's engine: 32 free blocks of 32 tokens, 16 sequences, 256 tokens a step.
ENGINE = {"num_free_blocks": 32, "block_size": 32, "max_num_seqs": 16,
          "max_num_batched_tokens": 256, "max_model_len": 256}  # fmt: skip


def test_every_grid_point_fits_the_engine_at_once():
    points = vllm_grid(**ENGINE)
    for point in points:
        requests = [request for wave in point.waves(0) for request in wave]
        blocks = sum(-(-(r.prompt_tokens + r.output_tokens) // 32) for r in requests)
        assert blocks <= 32 and len(requests) <= 16
        assert all(r.prompt_tokens + r.output_tokens <= 256 for r in requests)
    # 16 decodes of a 224-token prompt would need 128 blocks: left out, not preempted.
    assert VllmGridPoint(16, 224, 6) not in points
    assert VllmGridPoint(16, 32, 6) in points


def test_the_grid_spans_the_shapes_the_replays_need():
    points = vllm_grid(**ENGINE)
    decodes = [p for p in points if p.decode_seqs and not p.prefill_prompts]
    # Every count of the stair terms (1-8 rows), and 16.
    assert {p.decode_seqs for p in decodes} == {1, 2, 3, 4, 5, 6, 7, 8, 16}
    assert min(p.decode_prompt_tokens for p in decodes) <= 32
    assert max(p.decode_prompt_tokens + p.decode_steps for p in decodes) >= 224
    prefills = [p for p in points if not p.decode_seqs]
    # Four 192-token prompts: 768 tokens, chunked by the 256-token budget over three steps.
    assert max(sum(p.prefill_prompts) for p in prefills) > 2 * 256
    assert any(p.decode_seqs and p.prefill_prompts for p in points)


def test_a_longer_context_gets_the_grid_at_its_lengths_too():
    # experiment=sim_to_vllm_long: a 1,024-token model, 64 free blocks, 512 tokens a step.
    engine = ENGINE | {"num_free_blocks": 64, "max_num_batched_tokens": 512, "max_model_len": 1024}
    assert length_scales(256) == (1,) and length_scales(300) == (1,)
    assert length_scales(1024) == (1, 4)
    points = vllm_grid(**engine)
    assert len(points) == len(set(points))
    # Every point of a 256-token model on the same engine is still measured, in its order.
    short = vllm_grid(**(engine | {"max_model_len": 256}))
    assert [p for p in points if p in short] == short and len(points) > len(short)
    decodes = [p for p in points if p.decode_seqs and not p.prefill_prompts]
    # Decodes at 896-token prompts (the short grid's longest, 224, times 4), where the pool
    # holds them: two sequences of 29 blocks, not three.
    assert VllmGridPoint(2, 896, 6) in points and VllmGridPoint(3, 896, 6) not in points
    assert max(p.decode_prompt_tokens for p in decodes) == 896
    prefills = [p for p in points if not p.decode_seqs]
    assert max(max(p.prefill_prompts) for p in prefills) == 768
    assert VllmGridPoint(2, 384, 4, (768,)) in points  # a mixed point at 4x the lengths


def test_a_mixed_points_decodes_outlast_the_prompts_joining_them():
    # 8 decodes leave 248 tokens a step: two 192-token prompts take two steps, then two more.
    assert mixed_decode_steps(8, (192, 192), 256) == 4
    point = VllmGridPoint(8, 32, 4, (192, 192))
    decodes, joining = point.waves(100)
    assert [r.request_id for r in decodes] == list(range(100, 108))
    assert {r.output_tokens for r in decodes} == {5}  # the prefill's token and 4 decodes
    assert [(r.request_id, r.prompt_tokens, r.output_tokens) for r in joining] == [
        (108, 192, 1), (109, 192, 1)]  # fmt: skip
    assert VllmGridPoint(prefill_prompts=(16, 16)).waves(0)[0][1].request_id == 1
    assert len(VllmGridPoint(prefill_prompts=(16,)).waves(0)) == 1


def test_the_grids_parts_repeat_every_point_in_different_parts():
    points = vllm_grid(**ENGINE)
    parts = interleave(points, 7)
    assert len(parts) == 7
    dealt = [repr(point) for part in parts for point in part]
    assert sorted(dealt) == sorted(map(repr, points * GRID_REPEATS))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for point in points:
        holding = [index for index, part in enumerate(parts) if point in part]
        assert len(holding) == min(GRID_REPEATS, 7)
    # Each part holds points of every kind, so each samples the machine alike.
    for part in parts:
        assert any(not p.decode_seqs for p in part) and any(p.decode_seqs for p in part)


@pytest.mark.parametrize("num_points", [13, 14, 15, 21])  # 14, 21: multiples of the parts
def test_a_points_copies_fall_in_different_parts_for_any_grid_length(num_points):
    parts = interleave(list(range(num_points)), 7)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for point in range(num_points):
        holding = [index for index, part in enumerate(parts) if point in part]
        assert len(holding) == GRID_REPEATS


def _run(start_unix_s: float, durations_s: list[float]) -> EngineRun:
    shape = chunks_shape([(40, 40, 1)])
    steps = tuple(EngineStep(0.1 * i, d, ((0, 1),), shape, 2) for i, d in enumerate(durations_s))
    return EngineRun(steps, (), 0.0, start_unix_s)


def test_the_steps_table_puts_grid_and_replays_on_one_time_line_and_shows_drift():
    coefficients = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0) | {"fixed_s": 0.1}
    grid = [GridRun(0, 0, VllmGridPoint(1, 40, 1), _run(1000.0, [0.1, 0.1])),
            GridRun(0, 1, VllmGridPoint(1, 40, 1), _run(1100.0, [0.12, 0.12]))]  # fmt: skip
    replays = [VllmRunRecord("alpaca", 8.0, [], _run(1050.0, [0.11]))]
    steps = vllm_steps_frame(replays, grid, coefficients, coefficients, 32)
    assert list(steps["phase"]) == ["grid", "grid", "replay", "grid", "grid"]
    assert steps["unix_time_s"].is_monotonic_increasing
    assert steps.loc[1, "unix_time_s"] == pytest.approx(1000.1)
    assert (steps["grid_fitted_s"] == 0.1).all()
    lines = drift_lines(steps)
    assert [line.split(" (")[0] for line in lines] == ["- grid part 0", "- alpaca @ 8 req/s",
                                                       "- grid part 1"]  # fmt: skip
    assert lines[0].endswith("1.000") and lines[1].endswith("1.100")
    assert lines[2].endswith("1.200") and "from minute 1.7" in lines[2]
    _assert_documented(steps.columns)


def _assert_documented(columns) -> None:
    """Every column is defined in docs/metrics.md (the rule for every parquet column)."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    assert [column for column in columns if f"`{column}`" not in docs] == []


def test_the_fair_profiles_stand_side_by_side_per_step():
    profile = pd.DataFrame([
        ("vllm", "torch_op", "aten::addmm", 100, 1.0, 10, 100.0, 10.0),
        ("kvbench_real", "torch_op", "aten::linear", 40, 2.0, 20, 100.0, 2.0),
        ("kvbench_real", "torch_op", "aten::index_select", 20, 1.0, 20, 50.0, 1.0),
        ("vllm", "python", "a.py:1(f)", 5, 0.5, 10, 50.0, 0.5),
        ("kvbench_real", "python", "b.py:2(g)", 5, 0.2, 20, 10.0, 0.25),
    ], columns=["engine", "profiler", "name", "num_calls", "self_s", "num_steps",
                "self_ms_per_step", "calls_per_step"])  # fmt: skip
    text = profile_tables(profile)
    assert "(10 vLLM steps, 20 kvbench steps)" in text
    assert "| 1 | `aten::addmm` | 100.00 | 10.0 | `aten::linear` | 100.00 | 2.0 |" in text
    assert "| 2 |  |  |  | `aten::index_select` | 50.00 | 1.0 |" in text
    assert "| 1 | `a.py:1(f)` | 50.00 | 0.5 | `b.py:2(g)` | 10.00 | 0.2 |" in text
    _assert_documented(profile.columns)


def test_every_replay_is_held_out_from_the_grid_profile_and_the_fit_slice_from_its_own():
    from conftest import compose_config

    from kvbench.core.request import Request
    from kvbench.referee.vllm_engine import EngineRequest
    from kvbench.tasks.sim_to_real.vllm import compare_all

    cfg, deployment, _ = compose_config("experiment=sim_to_vllm")
    requests = [Request(0, 0.0, 40, 3), Request(1, 0.05, 20, 2)]
    times = (EngineRequest(0, 0.0, 0.1, 0.3, 3), EngineRequest(1, 0.05, 0.2, 0.3, 2))
    runs = [VllmRunRecord(name, 1.0, requests, EngineRun((), times, 0.0))
            for name in ("alpaca", "sharegpt")]  # fmt: skip
    coefficients = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0) | {"fixed_s": 0.1}
    table, pairs = compare_all(runs, {"grid": coefficients, "alpaca": coefficients}, cfg,
                               deployment)  # fmt: skip
    assert list(zip(table["profile"], table["workload"], table["held_out"], strict=True)) == [
        ("grid", "alpaca", True), ("grid", "sharegpt", True),
        ("alpaca", "alpaca", False), ("alpaca", "sharegpt", True)]  # fmt: skip
    assert list(table["source"]) == ["vllm_grid"] * 2 + ["vllm_fit_slice"] * 2
    # 0.1 s a step: request 0's prefill, then two decodes, ends at 0.3 s as measured.
    assert table["e2e_mape_pct"].iloc[0] == pytest.approx(0.0, abs=1e-6)
    assert len(pairs) == 8 and set(pairs["profile"]) == {"grid", "alpaca"}
    _assert_documented(table.columns)
