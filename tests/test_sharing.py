"""Prefix sharing through the engine: the seed's system-prompt example and prefix-cache hits."""

import pytest
from conftest import compose_config

from kvbench.allocators import make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.tasks.simulate.experiment import run_experiment


def test_system_prompt_of_2000_tokens_for_100_users_saves_99_copies(tmp_path):
    cfg, deployment, raw = compose_config("experiment=system_prompt_sharing", "progress=false")
    summary = run_experiment(cfg, deployment, raw, tmp_path).set_index("allocator")
    block_size = cfg.allocator.block_size
    saved_slots = summary.loc["paged_prefix", "saved_slots"]
    assert abs(saved_slots - 99 * 2000) <= 100 * block_size  # within one block per user
    assert summary.loc["paged", "saved_slots"] == 0
    assert summary.loc["paged_prefix", "saved_gb"] == pytest.approx(
        99 * 2000 * 327_680 / 1e9, rel=0.01
    )  # ~65 GB on Llama-2-70B fp16
    # 99 of 100 requests find the 2,000 prompt tokens cached (of 2,064 each).
    assert summary.loc["paged_prefix", "prefix_hit_rate"] == pytest.approx(99 * 2000 / 206_400)
    assert (summary["num_finished"] == 100).all()


def test_cached_prefix_tokens_are_not_prefilled_again():
    deployment = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12)
    requests = [
        Request(request_id=i, arrival_s=float(i), prompt_tokens=1040, output_tokens=8,
                prefix_group=0, prefix_tokens=1024)
        for i in range(2)
    ]  # fmt: skip
    limits = SchedulerLimits(max_model_len=2048)
    costs = RooflineCostModel(deployment)
    shared = simulate(requests, Scheduler(limits), make_allocator("paged_prefix", 15_728, 16, 2048),
                      costs)  # fmt: skip
    plain = simulate(requests, Scheduler(limits), make_allocator("paged", 15_728, 16, 2048), costs)
    prefill = [n for n in shared.steps.columns["num_prefill_tokens"] if n]
    assert prefill == [1040, 16]  # the second request computes only its own 16 tokens
    assert [r.cached_prompt_tokens for r in shared.requests] == [0, 1024]
    assert shared.requests[1].first_token_s - 1.0 < plain.requests[1].first_token_s - 1.0


@pytest.mark.parametrize("allocator_name", ["naive_oracle", "paged", "paged_prefix"])
def test_parallel_samples_fork_after_the_first_token_and_all_finish(allocator_name):
    deployment = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12)
    requests = [
        Request(request_id=i, arrival_s=0.1 * i, prompt_tokens=40, output_tokens=30, num_samples=4)
        for i in range(5)
    ]
    allocator = make_allocator(allocator_name, 15_728, 16, 2048)
    result = simulate(requests, Scheduler(SchedulerLimits(max_model_len=2048)), allocator,
                      RooflineCostModel(deployment))  # fmt: skip
    assert all(record.status == "finished" for record in result.requests)
    decode_tokens = sum(result.steps.columns["num_decode_tokens"])
    prefill_seqs = sum(result.steps.columns["num_prefill_seqs"])
    assert prefill_seqs == 5  # each prompt is prefilled once
    assert decode_tokens == 5 * 4 * 29  # every sample decodes the 29 tokens after the first
    saved = max(result.steps.columns["saved_slots"])
    if allocator_name == "naive_oracle":
        assert saved == 0  # a contiguous fork copies the extent: nothing shared
    else:
        # 3 siblings share each request's 2 full prompt blocks (and the partial one until the
        # first write copies it): 5 requests x 3 x 2 blocks x 16 slots at least.
        assert saved >= 5 * 3 * 2 * 16
        assert result.num_copy_on_writes == 5 * 3  # one copy of the shared partial block each


def test_a_fork_without_room_is_recomputed_not_lost():
    deployment = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12)
    requests = [Request(request_id=0, arrival_s=0.0, prompt_tokens=100, output_tokens=50,
                        num_samples=3)]  # fmt: skip
    # Room for two 256-slot oracle extents only: the third sample waits for one to finish.
    allocator = make_allocator("naive_oracle", 512, 16, 2048)
    result = simulate(requests, Scheduler(SchedulerLimits(max_model_len=2048)), allocator,
                      RooflineCostModel(deployment))  # fmt: skip
    assert result.requests[0].status == "finished"
    assert sum(result.steps.columns["num_prefill_seqs"]) == 2  # the prompt, then the recompute
