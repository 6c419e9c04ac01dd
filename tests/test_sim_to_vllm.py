"""``task=sim_to_vllm``: its config errors, the fit on vLLM's recorded steps, vLLM's request
times as kvbench's table has them; under ``-m peer`` (vLLM and its engine packages installed) the
whole task on a tiny config."""

from __future__ import annotations

import importlib.util
import math
import re

import pandas as pd
import pytest
from conftest import compose_config
from referee_support import peer

from kvbench.config import ConfigError
from kvbench.core.request import Request
from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, iteration_features
from kvbench.engine.simulate_v1 import chunks_shape
from kvbench.referee.vllm_engine import EngineRequest, EngineRun, EngineStep
from kvbench.tasks.sim_to_real.vllm import (
    VllmRunRecord,
    fit_on_vllm_steps,
    measured_requests,
)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("scheduler=vllm_v0", "set scheduler=vllm_v1"),
        ("allocators=[paged,paged_prefix]", "runs one of paged"),
        ("allocator.num_gpu_blocks=null", "set allocator.num_gpu_blocks"),
        ("allocator.block_size=16", "a multiple of 32 (now 16"),
        ("sim_to_vllm.fair_output_tokens=300", "at most model.max_model_len=256"),
        ("model=llama-2-7b", "runs a real model on this machine"),
    ],
)
def test_what_real_vllm_cannot_replay_is_a_one_line_error(override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        compose_config("experiment=sim_to_vllm", override)


def _step(start_s: float, duration_s: float, scheduled: list[tuple[int, ...]]) -> EngineStep:
    """A recorded step of (request id, prompt tokens, computed before, scheduled) entries."""
    return EngineStep(start_s, duration_s, tuple((entry[0], entry[3]) for entry in scheduled),
                      chunks_shape(entry[1:] for entry in scheduled), 4)  # fmt: skip


def test_the_fit_recovers_the_coefficients_vllms_step_times_were_made_of():
    # Step times made of a fixed cost, a per-token and a per-sequence one: the fit finds them.
    shapes = [[(0, 40, 0, 40)], [(0, 40, 40, 1), (1, 90, 0, 64)], [(0, 40, 41, 1)],
              [(0, 40, 42, 1), (1, 90, 64, 26)], [(0, 40, 43, 1), (1, 90, 90, 1)],
              [(2, 10, 0, 10), (1, 90, 91, 1)], [(2, 10, 10, 1)], [(3, 200, 0, 128)]]  # fmt: skip
    steps = []
    for index, scheduled in enumerate(shapes):
        shape = chunks_shape(entry[1:] for entry in scheduled)
        tokens = shape.num_prefill_tokens + shape.num_decode_tokens
        num_seqs = shape.num_decode_tokens + shape.num_prefill_seqs
        steps.append(_step(index, 0.010 + 0.002 * num_seqs + 0.0005 * tokens, scheduled))
    run = VllmRunRecord("w", 1.0, [], EngineRun(tuple(steps), (), 0.0))
    coefficients = fit_on_vllm_steps([run], 32)
    terms = [coefficients[name] for name in PROFILE_TERMS]
    for step in steps:
        features = iteration_features(step.shape, 32)
        guess = sum(c * f for c, f in zip(terms, features, strict=True))
        assert guess == pytest.approx(step.duration_s, rel=1e-3)
    assert [coefficients[name] for name in SWAP_TERMS] == [0.0, 0.0]  # v1 never swaps


def test_vllm_latencies_count_from_the_trace_arrival():
    requests = [Request(7, 1.0, 30, 5), Request(8, 1.5, 20, 1)]
    times = (EngineRequest(7, 1.2, 1.4, 2.0, 5), EngineRequest(8, 1.6, 1.9, 1.9, 1))
    frame = measured_requests(VllmRunRecord("w", 1.0, requests, EngineRun((), times, 0.0)))
    row = frame.set_index("request_id")
    # Handed to the engine at 1.2 (a step was running), arrived at 1.0: the wait counts.
    assert row.loc[7, "ttft_s"] == pytest.approx(0.4)
    assert row.loc[7, "e2e_latency_s"] == pytest.approx(1.0)
    assert row.loc[7, "tpot_s"] == pytest.approx(0.6 / 4)
    assert math.isnan(row.loc[8, "tpot_s"])  # one output token: no time per further token
    assert set(frame["status"]) == {"finished"}


def _engine_installed() -> bool:
    return all(importlib.util.find_spec(name) for name in ("vllm", "compressed_tensors", "loguru"))


@peer
@pytest.mark.skipif(not _engine_installed(),
                    reason="needs pip install --no-deps -r requirements/referee.txt "
                           "-r requirements/referee-engine.txt")  # fmt: skip
def test_the_task_replays_on_vllm_and_predicts_with_kvbench(tmp_path):
    from kvbench.tasks.sim_to_real.vllm import run_sim_to_vllm

    cfg, deployment, raw = compose_config(
        "experiment=sim_to_vllm", "workloads.alpaca.num_requests=4",
        "workloads.sharegpt.num_requests=4", "~workloads.azure_conv",
        "~workload_request_rates.azure_conv", "workload_request_rates.alpaca=[8.0]",
        "workload_request_rates.sharegpt=[8.0]", "sim_to_vllm.fair_num_requests=4",
        "sim_to_vllm.fair_output_tokens=8", "plots=false", "summary_table=false",
    )  # fmt: skip
    table = run_sim_to_vllm(cfg, deployment, raw, tmp_path)
    assert list(table["workload"]) == ["alpaca", "sharegpt"]
    assert list(table["held_out"]) == [False, True]
    assert (table["num_compared"] == 4).all()
    assert table["e2e_mape_pct"].notna().all() and (table["e2e_mape_pct"] >= 0).all()
    fair = pd.read_parquet(tmp_path / "fair_instrument.parquet").set_index("engine")
    assert fair.loc["vllm", "ratio_to_vllm"] == 1.0
    assert (fair["output_tokens"] == 32).all() and (fair["output_tokens_per_s"] > 0).all()
    assert fair.loc["kvbench_real", "torch_threads"] == cfg.executor.num_threads
    assert "ncalls" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "profile_vllm_fitted_on_alpaca.json").exists()
    steps = pd.read_parquet(tmp_path / "vllm_steps.parquet")
    assert set(steps["workload"]) == {"alpaca", "sharegpt"} and (steps["duration_s"] > 0).all()
