"""A few decode steps of a tiny Llama reading its paged pool through the Triton kernel.

Without CUDA the kernel runs in Triton's CPU interpreter (slow: a few steps only), switched on
by tests/conftest.py.
"""

from kvbench.tasks.equivalence.cases import shared_prefix_cases
from kvbench.tasks.equivalence.compare import step_diffs
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import FP32_REL_TOLERANCE, TINY_GQA
from kvbench.tasks.equivalence.paged_runner import PagedRunner
from kvbench.tasks.equivalence.prompts import random_prompt_ids
from kvbench.tasks.equivalence.stock_runner import StockRunner
from kvbench.tasks.equivalence.trajectories import (
    blocks_needed,
    paged_trajectories,
    scramble_free_blocks,
    stock_trajectories,
)

BLOCK_SIZE = 8
NUM_STEPS = 4


def test_triton_paged_decode_matches_the_stock_cache_with_sharing_and_copy_on_write():
    model = load_model(TINY_GQA)
    prompts = random_prompt_ids(2, model.config.vocab_size, seed=1)
    cases = shared_prefix_cases(prompts, num_samples=2)  # a shared prefix, forks: copy-on-write
    stock = stock_trajectories(StockRunner(model), cases, NUM_STEPS)
    runner = PagedRunner(
        model, "paged_prefix", blocks_needed(cases, NUM_STEPS, BLOCK_SIZE), BLOCK_SIZE, "paged",
        backend="triton",
    )  # fmt: skip
    scramble_free_blocks(runner.allocator, seed=0)
    paged = paged_trajectories(runner, cases, NUM_STEPS)
    for key, trajectory in paged.items():
        diffs = step_diffs(trajectory, stock[key])
        assert max(diff.max_rel_diff for diff in diffs) <= FP32_REL_TOLERANCE, key
        assert trajectory.tokens == stock[key].tokens, key
