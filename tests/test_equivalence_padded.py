"""The stock cache and ``gather`` in one right-padded batch (``tasks/equivalence/padded.py``), on
tiny random Llama models: seconds."""

import itertools

import pytest
import torch

from kvbench.tasks.equivalence.cases import shared_prefix_cases
from kvbench.tasks.equivalence.compare import has_nan, step_diffs
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import FP32_REL_TOLERANCE, TINY_GQA, TINY_MHA
from kvbench.tasks.equivalence.padded import PoolMemory, StockMemory, padded_trajectories
from kvbench.tasks.equivalence.prompts import TINY_PREFIX_TOKENS, random_prompt_ids
from kvbench.tasks.equivalence.stock_runner import StockRunner
from kvbench.tasks.equivalence.trajectories import blocks_needed, stock_trajectories

BLOCK_SIZE = 8
NUM_STEPS = 12
NUM_PROMPTS = 3


@pytest.fixture(scope="module", params=[TINY_GQA, TINY_MHA])
def tiny(request):
    """(model, cases, padded stock memory, its trajectories) of one tiny model: 3 prompts of
    24, 31 and 38 tokens sharing 21, 2 samples each."""
    model = load_model(request.param)
    prompts = random_prompt_ids(NUM_PROMPTS, model.config.vocab_size, seed=0)
    cases = shared_prefix_cases(prompts, num_samples=2)
    stock = StockMemory(model)
    return model, cases, stock, padded_trajectories(model, stock, cases, NUM_STEPS)


def _pool_run(tiny, allocator):
    model, cases, _, stock = tiny
    memory = PoolMemory(model, allocator, blocks_needed(cases, NUM_STEPS, BLOCK_SIZE, True),
                        BLOCK_SIZE, seed=0)  # fmt: skip
    return memory, padded_trajectories(model, memory, cases, NUM_STEPS, stock)


def test_the_prompts_differ_in_length_so_rows_are_padded(tiny):
    _, cases, _, _ = tiny
    assert len({len(case.token_ids) for case in cases}) == NUM_PROMPTS


def test_the_padded_batch_decodes_as_one_sequence_at_a_time_does(tiny):
    model, cases, _, padded = tiny
    one_by_one = stock_trajectories(StockRunner(model), cases, NUM_STEPS)
    assert padded.keys() == one_by_one.keys()
    for key, trajectory in padded.items():
        assert not has_nan(trajectory)
        diffs = step_diffs(trajectory, one_by_one[key])
        assert len(diffs) == NUM_STEPS + 1
        assert max(diff.max_rel_diff for diff in diffs) <= FP32_REL_TOLERANCE, key
        assert trajectory.tokens == one_by_one[key].tokens, key


@pytest.mark.parametrize("allocator", ["paged", "paged_prefix"])
def test_gather_over_the_pools_is_bit_identical_to_the_stock_batch(tiny, allocator):
    _, _, _, stock = tiny
    _, paged = _pool_run(tiny, allocator)
    assert paged.keys() == stock.keys()
    for key, trajectory in paged.items():
        assert torch.equal(trajectory.logits, stock[key].logits), key
        assert trajectory.tokens == stock[key].tokens, key


@pytest.mark.parametrize("allocator", ["paged", "paged_prefix"])
def test_the_pools_hold_the_stock_caches_keys_and_values(tiny, allocator):
    # The pools are the only cache: every real position's K/V there equal the stock cache's.
    _, _, stock_memory, _ = tiny
    memory, _ = _pool_run(tiny, allocator)
    is_real = memory.read_slots >= 0  # [rows, width]
    assert not is_real.all()  # some rows are padded
    for layer, stock_layer in enumerate(stock_memory.cache.layers):
        keys, values = memory.memory.gather_padded(layer, memory.read_slots)
        assert keys.shape == stock_layer.keys.shape  # [rows, kv_heads, width, head_dim]
        real = is_real[:, None, :, None].expand_as(keys)
        assert torch.equal(keys[real], stock_layer.keys[real])
        assert torch.equal(values[real], stock_layer.values[real])
        assert not keys[~real].any() and not values[~real].any()


def test_prefix_blocks_are_shared_scattered_and_forks_copy_on_write(tiny):
    _, cases, _, _ = tiny
    memory, paged = _pool_run(tiny, "paged_prefix")
    allocator = memory.allocator
    shared_blocks = TINY_PREFIX_TOKENS // BLOCK_SIZE
    # Every prompt after the first finds the shared blocks, written in the same forward.
    assert allocator.prefix_cache.num_hit_blocks == (NUM_PROMPTS - 1) * shared_blocks
    partial = sum(len(case.token_ids) % BLOCK_SIZE != 0 for case in cases)
    assert partial > 0 and allocator.num_copy_on_writes == partial
    table = allocator.block_table(cases[0].seq_id(0))
    assert any(later != earlier + 1 for earlier, later in itertools.pairwise(table))
    for case in cases:  # the samples really diverge, so the copy mattered
        assert paged[(case.prompt_id, 0)].tokens != paged[(case.prompt_id, 1)].tokens
