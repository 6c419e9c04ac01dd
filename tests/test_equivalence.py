"""Paged decode of tiny random Llama models (GQA and MHA) vs transformers' stock cache: seconds."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from kvbench.tasks.equivalence.cases import shared_prefix_cases
from kvbench.tasks.equivalence.compare import has_nan, step_diffs
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import FP32_REL_TOLERANCE, TINY_GQA, TINY_MHA
from kvbench.tasks.equivalence.paged_runner import PagedRunner
from kvbench.tasks.equivalence.prompts import TINY_PREFIX_TOKENS, random_prompt_ids
from kvbench.tasks.equivalence.stock_runner import StockRunner
from kvbench.tasks.equivalence.trajectories import (
    blocks_needed,
    paged_trajectories,
    scramble_free_blocks,
    stock_trajectories,
)

BLOCK_SIZE = 8
NUM_STEPS = 16
NUM_PROMPTS = 3


@pytest.fixture(scope="module", params=[TINY_GQA, TINY_MHA])
def tiny(request):
    """(model, cases, stock trajectories) of one tiny model: 3 prompts sharing 21 tokens, 2
    samples each."""
    model = load_model(request.param)
    prompts = random_prompt_ids(NUM_PROMPTS, model.config.vocab_size, seed=0)
    cases = shared_prefix_cases(prompts, num_samples=2)
    return model, cases, stock_trajectories(StockRunner(model), cases, NUM_STEPS)


def _run(tiny, allocator, mode):
    model, cases, _ = tiny
    num_blocks = blocks_needed(cases, NUM_STEPS, BLOCK_SIZE)
    runner = PagedRunner(model, allocator, num_blocks, BLOCK_SIZE, mode)
    scramble_free_blocks(runner.allocator, seed=0)
    return runner, paged_trajectories(runner, cases, NUM_STEPS)


@pytest.mark.parametrize("allocator", ["paged", "paged_prefix"])
def test_paged_kernel_decode_matches_the_stock_cache(tiny, allocator):
    _, _, stock = tiny
    _, paged = _run(tiny, allocator, "paged")
    assert paged.keys() == stock.keys()
    for key, trajectory in paged.items():
        assert not has_nan(trajectory)
        diffs = step_diffs(trajectory, stock[key])
        assert len(diffs) == NUM_STEPS + 1
        assert max(diff.max_rel_diff for diff in diffs) <= FP32_REL_TOLERANCE, key
        assert all(diff.argmax_equal for diff in diffs), key
        assert trajectory.tokens == stock[key].tokens, key


def test_gather_into_contiguous_is_bit_identical(tiny):
    _, _, stock = tiny
    _, paged = _run(tiny, "paged", "gather")
    for key, trajectory in paged.items():
        assert torch.equal(trajectory.logits, stock[key].logits), key
        assert trajectory.tokens == stock[key].tokens


def test_gather_after_prefix_hits_stays_within_tolerance(tiny):
    # A prefix hit skips computing the shared tokens: their K/V come from another prompt's
    # prefill (a matmul of another shape), so exact equality is not promised here.
    _, _, stock = tiny
    _, paged = _run(tiny, "paged_prefix", "gather")
    for key, trajectory in paged.items():
        diffs = step_diffs(trajectory, stock[key])
        assert max(diff.max_rel_diff for diff in diffs) <= FP32_REL_TOLERANCE
        assert trajectory.tokens == stock[key].tokens


def test_prefix_blocks_are_shared_and_forks_copy_on_write(tiny):
    _, cases, _ = tiny
    runner, paged = _run(tiny, "paged_prefix", "paged")
    shared_blocks = TINY_PREFIX_TOKENS // BLOCK_SIZE
    assert cases[0].prefix_tokens == TINY_PREFIX_TOKENS
    # Every prompt after the first finds the shared blocks (revived from the cached free ones).
    assert runner.allocator.prefix_cache.num_hit_blocks == (NUM_PROMPTS - 1) * shared_blocks
    # Prompts that end inside a block share that partial block with their fork: one copy each.
    partial = sum(len(case.token_ids) % BLOCK_SIZE != 0 for case in cases)
    assert partial > 0 and runner.allocator.num_copy_on_writes == partial
    for case in cases:  # the samples really diverge, so the copy mattered
        assert paged[(case.prompt_id, 0)].tokens != paged[(case.prompt_id, 1)].tokens


def test_block_tables_are_scattered(tiny):
    model, cases, _ = tiny
    runner = PagedRunner(model, "paged", blocks_needed(cases, NUM_STEPS, BLOCK_SIZE), BLOCK_SIZE)
    scramble_free_blocks(runner.allocator, seed=0)
    request = cases[0].request(NUM_STEPS)
    runner.prefill(0, request, list(cases[0].token_ids))
    table = runner.allocator.block_table(0)
    assert len(table) >= 3
    assert any(later != earlier + 1 for earlier, later in itertools.pairwise(table))


# Logit gap (relative to the row's largest |logit|) under which two tokens are a tie: the peer
# batches the prompts as its scheduler thread happens to group them, so its fp32 sums differ from
# one-at-a-time decode in the last bits, and a random tiny model has near-ties a flip can follow.
NEAR_TIE_REL_GAP = 1e-4


def _steps_agreed(ours, peer_tokens: list[int]) -> int:
    """Steps on which kvbench's greedy tokens equal the peer's, up to the first difference, which
    must be a near-tie in kvbench's own logits (after it the two continue differently)."""
    for step, (our_token, peer_token) in enumerate(zip(ours.tokens, peer_tokens, strict=True)):
        if our_token != peer_token:
            logits = ours.logits[step]  # [vocab]
            gap = float((logits[our_token] - logits[peer_token]) / logits.abs().max())
            assert gap <= NEAR_TIE_REL_GAP, (step, our_token, peer_token, gap)
            return step
    return len(peer_tokens)


def test_transformers_continuous_batching_gives_the_same_greedy_tokens(tiny):
    from kvbench.tasks.equivalence.peer import continuous_batching_tokens

    model, cases, _ = tiny
    _, paged = _run(tiny, "paged_prefix", "paged")
    peer_tokens = continuous_batching_tokens(
        model, [case.token_ids for case in cases], NUM_STEPS + 1, BLOCK_SIZE
    )
    agreed = [
        _steps_agreed(paged[(case.prompt_id, 0)], tokens)
        for case, tokens in zip(cases, peer_tokens, strict=True)
    ]
    # A near-tie may end one comparison early, not most of them.
    assert sum(agreed) >= (len(cases) - 1) * (NUM_STEPS + 1), agreed


def test_the_peers_cache_is_sized_to_its_prompts_not_to_the_machines_memory():
    # Unsized, transformers' continuous batching takes 90 % of free memory (12 GB on a CPU here).
    from kvbench.tasks.equivalence.peer import SPARE_BLOCKS, continuous_batching_tokens

    seen = {}

    class Model:
        def generate_batch(self, inputs, generation_config, continuous_batching_config=None):
            seen.update(generation_config=generation_config, batching=continuous_batching_config)
            return {f"req_{i}": SimpleNamespace(generated_tokens=[1]) for i in range(len(inputs))}

    assert continuous_batching_tokens(Model(), [[1] * 10, [2] * 20], 6, 8) == [[1], [1]]
    try:  # transformers >= 5 reads the sizes from this config only
        from transformers import ContinuousBatchingConfig  # noqa: F401

        sizing = seen["batching"]
    except ImportError:
        sizing = seen["generation_config"]
    assert sizing is not None
    assert sizing.num_blocks == SPARE_BLOCKS + 2 + 4 and sizing.max_batch_tokens == 22
    assert getattr(sizing, "page_size", getattr(sizing, "block_size", None)) == 8


@pytest.mark.parametrize(("allocator", "backend"), [("paged", "torch"), ("paged_prefix", "torch"),
                                                    ("paged", "sdpa"), ("paged_prefix", "sdpa"),
                                                    ("paged_prefix", "gather")])  # fmt: skip
def test_batched_decode_through_the_real_executor_matches_the_stock_cache(tiny, allocator,
                                                                          backend):  # fmt: skip
    """All cases at once through executors.forward.BatchRunner: the same criteria as one by
    one (fp32 tolerance, every greedy continuation identical)."""
    from kvbench.tasks.equivalence.batched import batched_trajectories

    model, cases, stock = tiny
    batched = batched_trajectories(model, allocator, backend, cases, NUM_STEPS, BLOCK_SIZE, 0)
    assert batched.keys() == stock.keys()
    for key, trajectory in batched.items():
        diffs = step_diffs(trajectory, stock[key])
        assert len(diffs) == NUM_STEPS + 1
        assert max(diff.max_rel_diff for diff in diffs) <= FP32_REL_TOLERANCE, key
        assert trajectory.tokens == stock[key].tokens, key
