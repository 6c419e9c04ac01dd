"""``task=sim_to_vllm``: its config errors, the fit on vLLM's recorded steps, vLLM's request
times as kvbench's table has them; under ``-m peer`` (vLLM and its engine packages installed) the
whole task on a tiny config."""

from __future__ import annotations

import importlib.util
import math
import re

import pandas as pd
import pytest
from conftest import assert_least_squares_optimum, compose_config
from referee_support import peer

from kvbench.config import ConfigError
from kvbench.core.request import Request
from kvbench.engine.profiled import (
    PROFILE_TERMS,
    SWAP_TERMS,
    iteration_features,
    signed_terms,
)
from kvbench.engine.simulate_v1 import chunks_shape
from kvbench.referee.vllm_engine import EngineRequest, EngineRun, EngineStep
from kvbench.tasks.profile.fit import free_signed_terms
from kvbench.tasks.sim_to_real import vllm
from kvbench.tasks.sim_to_real.vllm import (
    REPEAT_SOURCE,
    ReplayJob,
    VllmRunRecord,
    compare_repeats,
    fit_on_vllm_steps,
    measure_interleaved,
    measured_requests,
)
from kvbench.tasks.sim_to_real.vllm_grid import VllmGridPoint, mixed_decode_steps


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("scheduler=vllm_v0", "set scheduler=vllm_v1"),
        ("allocators=[paged,paged_prefix]", "runs one of paged"),
        ("allocator.num_gpu_blocks=null", "set allocator.num_gpu_blocks"),
        ("allocator.block_size=16", "a multiple of 32 (now 16"),
        ("sim_to_vllm.fair_output_tokens=300", "at most model.max_model_len=256"),
        ("model=llama-2-7b", "runs a real model and this machine has weights for smollm2"),
    ],
)
def test_what_real_vllm_cannot_replay_is_a_one_line_error(override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        compose_config("experiment=sim_to_vllm", override)


def test_fp8_k_v_start_vllm_with_its_fp8_cache_where_this_cpu_reads_it(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    cfg, deployment, _ = compose_config("experiment=sim_to_vllm", "model.kv_dtype=fp8")
    settings = vllm.engine_settings(cfg, deployment, tmp_path)
    assert (settings.kv_cache_dtype, settings.dtype) == ("fp8", "float32")
    cfg, deployment, _ = compose_config("experiment=sim_to_vllm")
    assert vllm.engine_settings(cfg, deployment, tmp_path).kv_cache_dtype == "auto"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with pytest.raises(ConfigError, match=r"model.kv_dtype=fp8: vLLM's CPU attention reads fp8 "
                                          r"K/V on x86 with AVX-512 or AMX, and this CPU's vector "
                                          r"instructions are AVX2; set model.kv_dtype=null"):
        compose_config("experiment=sim_to_vllm", "model.kv_dtype=fp8")


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
    coefficients = fit_on_vllm_steps(steps, 32)
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


def _replay(requests: list[Request], slower: float) -> EngineRun:
    """vLLM's run of ``requests`` one at a time, each step 0.1 s x ``slower``."""
    steps, times, now_s = [], [], 0.0
    for request in requests:
        start_s = max(now_s, request.arrival_s)
        for token in range(request.output_tokens):
            # The prompt in the first step, one decode token after each token before.
            computed_before, scheduled = ((0, request.prompt_tokens) if token == 0 else
                                          (request.prompt_tokens + token - 1, 1))  # fmt: skip
            steps.append(_step(start_s + 0.1 * slower * token, 0.1 * slower,
                               [(request.request_id, request.prompt_tokens, computed_before,
                                 scheduled)]))  # fmt: skip
        now_s = start_s + 0.1 * slower * request.output_tokens
        times.append(EngineRequest(request.request_id, start_s, start_s + 0.1 * slower, now_s,
                                   request.output_tokens))  # fmt: skip
    return EngineRun(tuple(steps), tuple(times), 0.0)


def test_a_repeat_on_vllm_scores_vllm_against_itself():
    cfg, _, _ = compose_config("experiment=sim_to_vllm")
    requests = [Request(i, 0.5 * i, 16, 4) for i in range(4)]
    runs = [VllmRunRecord(w, 1.0, requests, _replay(requests, 1.0)) for w in ("a", "b")]
    # a's repeat as fast; b's 20 % slower.
    repeats = [VllmRunRecord("b", 1.0, requests, _replay(requests, 1.2), repeat=True),
               VllmRunRecord("a", 1.0, requests, _replay(requests, 1.0), repeat=True)]
    table, pairs = compare_repeats(runs, repeats, cfg)
    assert set(table["source"]) == set(pairs["source"]) == {REPEAT_SOURCE}
    assert table["held_out"].all() and list(table["workload"]) == ["a", "b"]
    rows = table.set_index("workload")
    assert rows.loc["a", "e2e_mape_pct"] == 0.0 and rows.loc["a", "num_compared"] == 4
    assert rows.loc["b", "e2e_mape_pct"] == pytest.approx(20.0)
    assert rows.loc["b", "output_token_throughput_error_pct"] < 0
    assert rows.loc["a", "mean_batch_size_error_pct"] == 0.0


def test_the_second_pass_replays_every_slice_again_after_the_grids_last_part(monkeypatch):
    served = []

    def fake_replay(engine, requests):
        served.append(("replay", len(requests)))
        return EngineRun((), (), 0.0)

    def fake_waves(engine, waves):
        served.append(("grid", 0))
        return EngineRun((), (), 0.0)

    monkeypatch.setattr(vllm, "replay", fake_replay)
    monkeypatch.setattr(vllm, "run_waves", fake_waves)
    jobs = [ReplayJob("a", 1.0, [Request(0, 0.0, 8, 2)]), ReplayJob("b", 8.0, [])]
    points = [VllmGridPoint(prefill_prompts=(48,)), VllmGridPoint(2, 32, 3),
              VllmGridPoint(1, 32, 3)]  # fmt: skip
    runs, grid_runs, repeat_runs = measure_interleaved(None, jobs, points, repeat_replays=True)
    assert [(r.workload, r.rate, r.repeat) for r in runs + repeat_runs] == [
        ("a", 1.0, False), ("b", 8.0, False), ("a", 1.0, True), ("b", 8.0, True)]
    kinds = [kind for kind, _ in served]
    assert kinds[-3:] == ["grid", "replay", "replay"] and kinds.count("replay") == 4
    assert {run.part for run in grid_runs} == {0, 1, 2}
    assert measure_interleaved(None, jobs, points)[2] == []


def _engine_installed() -> bool:
    return all(importlib.util.find_spec(name) for name in ("vllm", "compressed_tensors", "loguru"))


@peer
@pytest.mark.skipif(not _engine_installed(),
                    reason="needs pip install --no-deps -r requirements/referee.txt "
                           "-r requirements/referee-engine.txt")  # fmt: skip
def test_the_task_replays_on_vllm_and_predicts_with_kvbench(tmp_path, monkeypatch):
    from kvbench.tasks.sim_to_real import vllm
    from kvbench.tasks.sim_to_real.vllm import run_sim_to_vllm

    # A grid of three points (the full one is a minute of vLLM steps), one of each kind.
    monkeypatch.setattr(vllm, "grid_points", lambda settings: TINY_GRID)

    cfg, deployment, raw = compose_config(
        "experiment=sim_to_vllm", "workloads.alpaca.num_requests=4",
        "workloads.sharegpt.num_requests=4", "~workloads.azure_conv",
        "~workload_request_rates.azure_conv", "workload_request_rates.alpaca=[8.0]",
        "workload_request_rates.sharegpt=[8.0]", "sim_to_vllm.fair_num_requests=4",
        "sim_to_vllm.fair_output_tokens=8", "plots=false", "summary_table=false",
    )  # fmt: skip
    table = run_sim_to_vllm(cfg, deployment, raw, tmp_path)
    assert list(table["source"]) == ["vllm_grid"] * 2 + ["vllm_fit_slice"] * 2 + [
        REPEAT_SOURCE] * 2  # the second pass's replays, vLLM against itself
    assert list(table["profile"]) == ["grid", "grid", "alpaca", "alpaca", "", ""]
    assert list(table["workload"]) == ["alpaca", "sharegpt"] * 3
    assert list(table["held_out"]) == [True, True, False, True, True, True]
    assert (table["num_compared"] == 4).all()
    assert table["e2e_mape_pct"].notna().all() and (table["e2e_mape_pct"] >= 0).all()
    beyond = table["extrapolated_steps_pct"].tolist()
    assert beyond[2] == 0.0 and 0 <= beyond[3] <= 100  # the alpaca profile on its own steps
    assert all(math.isnan(value) for value in beyond[4:])  # the repeats: no profile
    fair = pd.read_parquet(tmp_path / "fair_instrument.parquet")
    # vLLM, kvbench on vLLM's matmul library (the configured one), then on aten's, for scale.
    assert list(zip(fair["engine"], fair["linear_backend"], strict=True)) == [
        ("vllm", "onednn"), ("kvbench_real", "onednn"), ("kvbench_real", "aten")]
    assert fair["ratio_to_vllm"].iloc[0] == 1.0
    assert (fair["output_tokens"] == 32).all() and (fair["output_tokens_per_s"] > 0).all()
    assert (fair["torch_threads"].iloc[1:] == cfg.executor.num_threads).all()
    profile = pd.read_parquet(tmp_path / "fair_profile.parquet")
    assert set(zip(profile["engine"], profile["profiler"], strict=True)) == {
        (engine, profiler) for engine in ("vllm", "kvbench_real")
        for profiler in ("torch_op", "python")}  # fmt: skip
    assert (profile["self_ms_per_step"] > 0).all()
    report = (tmp_path / "report.md").read_text()
    assert "torch ops by self CPU time" in report and "aten::" in report
    assert "grid part 2" in report  # the drift: grid part, replay, part, replay, part
    assert "## Each replay against its repeat\n\n- alpaca @ 8 req/s: steps" in report
    split = pd.read_parquet(tmp_path / "repeat_split.parquet")
    assert split["workload"].tolist() == ["alpaca", "sharegpt"] and "allocator" not in split
    assert (tmp_path / "profile_vllm_fitted_on_alpaca.json").exists()
    assert (tmp_path / "profile_vllm_grid.json").exists()
    steps = pd.read_parquet(tmp_path / "vllm_steps.parquet")
    assert set(steps["workload"]) == {"alpaca", "sharegpt", "grid"}
    assert (steps["duration_s"] > 0).all() and steps["unix_time_s"].is_monotonic_increasing
    phases = steps["phase"].tolist()
    assert phases[0] == "grid" and "replay" in phases
    assert phases[-1] == "repeat" and phases[phases.index("repeat") - 1] == "grid"


# One point of each kind, small enough for a peer test.
TINY_GRID = [VllmGridPoint(prefill_prompts=(48, 48)), VllmGridPoint(2, 32, 3),
             VllmGridPoint(2, 32, mixed_decode_steps(2, (64,), 64), (64,))]  # fmt: skip


@peer
@pytest.mark.skipif(not _engine_installed(),
                    reason="needs pip install --no-deps -r requirements/referee.txt "
                           "-r requirements/referee-engine.txt")  # fmt: skip
def test_the_grid_records_vllms_schedule_and_its_fit_prices_its_own_steps():
    from kvbench.referee.vllm_engine import EngineSettings, run_waves, start_vllm
    from kvbench.referee.vllm_v1 import RefereeLimits, run_referee
    from kvbench.tasks.equivalence.models import smollm2_model_dir

    # A 64-token budget: the two 48-token prompts are chunked, the mixed point's prompt joins
    # two decodes in chunks of 62.
    settings = EngineSettings(smollm2_model_dir(), num_gpu_blocks=17, max_num_seqs=8,
                              max_num_batched_tokens=64, max_model_len=256,
                              enable_prefix_caching=True)  # fmt: skip
    engine = start_vllm(settings)
    limits = RefereeLimits(block_size=settings.block_size, num_gpu_blocks=settings.num_gpu_blocks,
                           max_num_seqs=settings.max_num_seqs,
                           max_num_batched_tokens=settings.max_num_batched_tokens,
                           max_model_len=settings.max_model_len,
                           enable_prefix_caching=settings.enable_prefix_caching)  # fmt: skip
    steps = []
    repeats = []  # each point's steps, per pass: the grid served twice
    for point in TINY_GRID * 2:
        waves = point.waves(0)
        requests = [request for wave in waves for request in wave]
        run = run_waves(engine, waves)
        assert sorted(t.num_output_tokens for t in run.requests) == sorted(
            r.output_tokens for r in requests)  # fmt: skip
        # Each wave joins at the step after every earlier request has its first token: the
        # same requests through vLLM's model-free scheduler, joining at those steps, schedule
        # exactly what the engine did, and each recorded shape is that schedule's.
        joined_s = {t.request_id: t.arrival_s for t in run.requests}
        arrival_steps = [sum(step.start_s < joined_s[r.request_id] for step in run.steps)
                         for r in requests]  # fmt: skip
        referee = run_referee(requests, limits, arrival_steps)
        assert [step.scheduled_tokens for step in run.steps] == [
            tuple((requests[index].request_id, tokens) for index, tokens in step.scheduled_tokens)
            for step in referee
        ]  # fmt: skip
        computed = dict.fromkeys(range(len(requests)), 0)
        for step in run.steps:
            assert step.shape == chunks_shape((requests[rid].prompt_tokens, computed[rid], tokens)
                                              for rid, tokens in step.scheduled_tokens)  # fmt: skip
            for rid, tokens in step.scheduled_tokens:
                computed[rid] += tokens
        steps += run.steps
        repeats.append(run.steps)
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)  # a mixed step
    assert any(s.shape.prefill_attention_pairs > s.num_prefill_tokens * (s.num_prefill_tokens + 1)
               // 2 for s in steps)  # a chunk attending to the chunks before it  # fmt: skip
    # The same point served twice schedules the same shapes.
    first, second = repeats[: len(TINY_GRID)], repeats[len(TINY_GRID):]  # fmt: skip
    assert [[s.shape for s in run] for run in first] == [[s.shape for s in run] for run in second]
    # The fit is the best one over these steps' shapes and measured times with every term but
    # the stairs non-negative. How close it comes is the machine's to say (another engine
    # shares the two cores under -n 2): the experiment publishes that error, a test on a shared
    # machine cannot bound it.
    coefficients = fit_on_vllm_steps(steps, settings.block_size)
    fitted = [coefficients[term] for term in PROFILE_TERMS]
    signed = signed_terms(PROFILE_TERMS)
    assert all(value >= 0 for value, is_signed in zip(fitted, signed, strict=True)
               if not is_signed) and any(value > 0 for value in fitted)  # fmt: skip
    features = [iteration_features(s.shape, settings.block_size) for s in steps]
    assert_least_squares_optimum(features, [s.duration_s for s in steps], fitted,
                                 free_signed_terms(features, signed))  # fmt: skip
