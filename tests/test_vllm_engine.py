"""Real vLLM serving SmolLM2 on the CPU (``kvbench.referee.vllm_engine``): its settings are checked
before vLLM starts; under ``-m peer``, with the engine's extra packages
(requirements/referee-engine.txt) and SmolLM2 installed, a replay runs every request to its
length and vLLM's engine schedules exactly what its model-free scheduler (the referee) does."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from referee_support import peer

from kvbench.core.request import Request
from kvbench.engine.simulate_v1 import chunks_shape
from kvbench.executors.forward import model_kv_shape
from kvbench.referee.vllm_engine import (
    EngineSettings,
    pool_bytes,
    replay,
    serve_on_vllm,
    start_vllm,
)
from kvbench.referee.vllm_v1 import RefereeLimits, run_referee

SETTINGS = EngineSettings(Path("unused"), num_gpu_blocks=64, max_num_seqs=8,
                          max_num_batched_tokens=64, max_model_len=1024,
                          enable_prefix_caching=True)  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "requests", "problem"),
    [
        (EngineSettings(Path("unused"), num_gpu_blocks=64, block_size=16, max_model_len=1024),
         [Request(0, 0.0, 10, 2)], "block_size=16: vLLM's CPU attention takes multiples of 32"),
        (EngineSettings(Path("unused"), num_gpu_blocks=32, max_model_len=1024),
         [Request(0, 0.0, 10, 2)], "num_gpu_blocks=32: 992 tokens cannot hold one request of "
                                   "max_model_len=1024"),
        (SETTINGS, [Request(7, 0.0, 1000, 25)], "request 7: 1000 + 25 tokens exceed "
                                                "max_model_len=1024"),
        (SETTINGS, [Request(3, 0.0, 10, 0)], "request 3: the engine needs a prompt and at least "
                                             "one output token"),
    ],
)  # fmt: skip
def test_settings_vllm_would_refuse_are_one_line_before_it_starts(settings, requests, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        serve_on_vllm(requests, settings)


@pytest.mark.parametrize(("dtype", "kv_cache_dtype", "element_bytes"),
                         [("float32", "auto", 4), ("bfloat16", "auto", 2),
                          ("float32", "fp8", 1)])  # fmt: skip
def test_the_engine_asks_for_its_pool_s_bytes_at_the_folder_s_kv_shape(tmp_path, dtype,
                                                                        kv_cache_dtype,
                                                                        element_bytes):  # fmt: skip
    from kvbench.tasks.equivalence.models import load_model
    from kvbench.tasks.equivalence.names import TINY_GQA

    model = load_model(TINY_GQA)
    model.save_pretrained(tmp_path)
    num_layers, num_kv_heads, head_size = model_kv_shape(model)
    settings = EngineSettings(tmp_path, num_gpu_blocks=17, dtype=dtype,
                              kv_cache_dtype=kv_cache_dtype)  # fmt: skip
    assert pool_bytes(settings) == (17 * settings.block_size * 2 * num_layers * num_kv_heads
                                    * head_size * element_bytes)  # fmt: skip


def test_fp8_k_v_vllm_cannot_read_here_is_one_line_before_it_starts(tmp_path, monkeypatch):
    import json

    import torch

    from kvbench.referee.vllm_engine import fp8_problem

    settings = EngineSettings(tmp_path, num_gpu_blocks=17, kv_cache_dtype="fp8")
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    for hidden_size, problem in ((256, None), (192, "head sizes that are multiples of 32, and "
                                                    "the model's is 48")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": hidden_size}))
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
        assert (problem is None) == (fp8_problem(settings) is None)
        if problem:
            assert problem in fp8_problem(settings)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert fp8_problem(settings) == (
        "fp8 K/V: vLLM's CPU attention reads fp8 K/V on x86 with AVX-512 or AMX, and this CPU's "
        "vector instructions are AVX2; keep K/V in the model's dtype")
    with pytest.raises(ValueError, match="vector instructions are AVX2"):
        start_vllm(settings)  # refused before vLLM is imported or started
    assert fp8_problem(EngineSettings(tmp_path, 17, kv_cache_dtype="auto")) is None
    assert "allowed are auto and fp8" in fp8_problem(
        EngineSettings(tmp_path, 17, kv_cache_dtype="int8"))


def _engine_installed() -> bool:
    return all(importlib.util.find_spec(name) for name in ("compressed_tensors", "loguru"))


@peer
@pytest.mark.skipif(not _engine_installed(),
                    reason="needs pip install --no-deps -r requirements/referee-engine.txt")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_vllm_serves_smollm2_and_schedules_as_the_referee_does(kv_cache_dtype):
    # fp8: vLLM's own fp8 K/V (e4m3 at unit scales), where this CPU has AVX-512: the schedule
    # does not depend on the K/V's dtype at a pool given in blocks.
    from kvbench.referee.vllm_engine import fp8_problem
    from kvbench.tasks.equivalence.models import smollm2_model_dir

    requests = [Request(i, 0.2 * i, 40 + 17 * i, 4 + i) for i in range(4)] + [
        Request(4, 0.3, 100, 3, prefix_group=0, prefix_tokens=64),
        Request(5, 0.4, 90, 3, prefix_group=0, prefix_tokens=64),
    ]
    settings = EngineSettings(**{**SETTINGS.__dict__, "model_dir": smollm2_model_dir(),
                                 "kv_cache_dtype": kv_cache_dtype})  # fmt: skip
    if fp8_problem(settings):
        pytest.skip(fp8_problem(settings))
    engine = start_vllm(settings)
    assert engine.llm.llm_engine.vllm_config.cache_config.cache_dtype == kv_cache_dtype
    # The first replay warms the shared prefix into the cache; the second must start empty.
    replay(engine, requests)
    run = replay(engine, requests)

    by_id = {request.request_id: request for request in requests}
    assert sorted(times.request_id for times in run.requests) == sorted(by_id)
    for times in run.requests:
        request = by_id[times.request_id]
        assert times.num_output_tokens == request.output_tokens
        assert request.arrival_s <= times.arrival_s < times.first_token_s <= times.finish_s
    assert all(step.duration_s > 0 for step in run.steps)
    assert sum(step.num_decode_tokens for step in run.steps) == sum(
        request.output_tokens - 1 for request in requests)  # fmt: skip

    # The same requests, joining at the steps they joined the engine, through vLLM's scheduler
    # without a model: every step schedules the same tokens for the same requests.
    # (The engine takes the requests that arrived during a step in arrival order, as the referee
    # takes those of one step in list order.)
    in_order = sorted(requests, key=lambda request: request.arrival_s)
    joined_s = {times.request_id: times.arrival_s for times in run.requests}
    arrival_steps = [sum(step.start_s < joined_s[request.request_id] for step in run.steps)
                     for request in in_order]  # fmt: skip
    limits = RefereeLimits(block_size=settings.block_size, num_gpu_blocks=settings.num_gpu_blocks,
                           max_num_seqs=settings.max_num_seqs,
                           max_num_batched_tokens=settings.max_num_batched_tokens,
                           max_model_len=settings.max_model_len,
                           enable_prefix_caching=settings.enable_prefix_caching)  # fmt: skip
    referee = run_referee(in_order, limits, arrival_steps)
    assert [step.scheduled_tokens for step in run.steps] == [
        tuple((in_order[index].request_id, tokens) for index, tokens in step.scheduled_tokens)
        for step in referee  # the referee names a request by its place in the list
    ]
    # The second request of the shared 64-token prefix computed only what it did not hit.
    scheduled_5 = sum(tokens for step in run.steps for rid, tokens in step.scheduled_tokens
                      if rid == 5)  # fmt: skip
    assert scheduled_5 == 90 + 3 - 1 - 64

    # Each recorded step's shape is its requests' chunks with their context (prefix hits
    # included), counted here from the schedule alone: request 5 starts after its 64-token hit.
    computed = dict.fromkeys(by_id, 0)
    computed[5] = 64
    for step in run.steps:
        expected = chunks_shape((by_id[rid].prompt_tokens, computed[rid], tokens)
                                for rid, tokens in step.scheduled_tokens)  # fmt: skip
        assert step.shape == expected
        for rid, tokens in step.scheduled_tokens:
            computed[rid] += tokens
        assert 0 < step.num_blocks_in_use < settings.num_gpu_blocks
