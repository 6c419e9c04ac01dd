"""The fp8 comparison is well posed: paged runs are teacher-forced on the reference's tokens, and
read fp8 K/V back through their per-layer scales (unit, or calibrated as vLLM's
calculate_kv_scales; the pools themselves: test_kv_memory.py)."""

import pytest
import torch
from conftest import compose_config

from kvbench.config import ConfigError
from kvbench.executors.kv_memory import CALIBRATION_DIVISORS, calibrated_scales
from kvbench.tasks.equivalence.cases import Trajectory, shared_prefix_cases
from kvbench.tasks.equivalence.compare import step_diffs
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import TINY_GQA
from kvbench.tasks.equivalence.paged_runner import PagedRunner
from kvbench.tasks.equivalence.prompts import random_prompt_ids
from kvbench.tasks.equivalence.run import run_logit_equivalence
from kvbench.tasks.equivalence.stock_runner import StockRunner
from kvbench.tasks.equivalence.trajectories import (
    blocks_needed,
    paged_trajectories,
    scramble_free_blocks,
)

NUM_STEPS = 6
FP8 = torch.float8_e4m3fn
SMALL = ("experiment=logit_equivalence", "equivalence.model=tiny-llama-gqa",
         "equivalence.num_prompts=2", "equivalence.num_decode_steps=4",
         "equivalence.allocators=[paged]", "equivalence.kv_dtype=fp8", "plots=false")  # fmt: skip


def _forced_stock(model, case, forced: list[int]) -> torch.Tensor:
    """The stock cache's logits [NUM_STEPS + 1, vocab] when fed ``forced`` after the prompt."""
    runner = StockRunner(model)
    logits = [runner.prefill(0, list(case.token_ids))]
    logits += [runner.decode(0, token) for token in forced[:NUM_STEPS]]
    return torch.stack(logits)


def test_a_paged_run_is_fed_the_references_tokens_not_its_own():
    model = load_model(TINY_GQA)
    cases = shared_prefix_cases(random_prompt_ids(2, model.config.vocab_size, seed=0), 1)
    # A reference whose tokens no greedy decode would choose: fixed, arbitrary ids.
    generator = torch.Generator().manual_seed(1)
    forced = {(case.prompt_id, 0): torch.randint(model.config.vocab_size, (NUM_STEPS + 1,),
                                                 generator=generator).tolist()
              for case in cases}  # fmt: skip
    reference = {key: Trajectory(torch.empty(0), tokens) for key, tokens in forced.items()}
    runner = PagedRunner(model, "paged", blocks_needed(cases, NUM_STEPS, 8), 8, "gather")
    scramble_free_blocks(runner.allocator, seed=0)
    paged = paged_trajectories(runner, cases, NUM_STEPS, reference)
    for case in cases:
        key = (case.prompt_id, 0)
        # gather is bit-identical to the stock cache on the same context
        assert torch.equal(paged[key].logits, _forced_stock(model, case, forced[key]))
        # its own greedy choices are recorded, not the tokens it was fed
        assert paged[key].tokens == [int(row.argmax()) for row in paged[key].logits]


def test_calibrated_scales_are_vllms_amax_over_200_for_k_and_100_for_v():
    key = torch.tensor([[0.5, -3.0], [2.0, 1.0]])
    value = torch.tensor([[-8.0, 0.25]])
    assert CALIBRATION_DIVISORS == (200.0, 100.0)
    assert calibrated_scales(key, value) == (3.0 / 200, 8.0 / 100)
    assert calibrated_scales(torch.zeros(3), value)[0] == 1.0  # nothing to scale: 1


def test_a_calibrated_run_labels_its_rows_and_prints_its_scales(tmp_path, capsys):
    cfg, deployment, raw = compose_config(*SMALL, "equivalence.kv_scales=calibrated")
    table = run_logit_equivalence(cfg, deployment, raw, tmp_path)
    assert set(table["kv_scales"]) == {"calibrated"}
    assert table["kl_div"].notna().all() and table["kl_div"].max() > 0
    assert "FP8 (calibrated scales) paged/torch" in capsys.readouterr().out


@pytest.mark.parametrize(("overrides", "expected"), [
    (("equivalence.kv_scales=amax",), "equivalence.kv_scales='amax': allowed are unit, calibrated"),
    (("equivalence.kv_dtype=null", "equivalence.kv_scales=calibrated"),
     "equivalence.kv_scales=calibrated: scales apply to fp8 K/V only"),
])  # fmt: skip
def test_bad_kv_scales_are_one_line_config_errors(overrides, expected):
    with pytest.raises(ConfigError, match=expected) as error:
        compose_config(*SMALL, *overrides)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("backend", ["torch", "sdpa", "gather"])
def test_batched_fp8_pools_read_back_through_their_calibrated_scales(backend):
    """Every backend dequantizes with the layer's scales (about amax / 200 here, far from 1: a
    reader that ignored them would be off by orders of magnitude): the logits stay near the
    stock cache's, off only by e4m3's rounding."""
    from kvbench.tasks.equivalence.padded import StockMemory, padded_trajectories
    from kvbench.tasks.equivalence.run import backend_trajectories

    model = load_model(TINY_GQA)
    cases = shared_prefix_cases(random_prompt_ids(3, model.config.vocab_size, seed=0), 2)
    stock = padded_trajectories(model, StockMemory(model), cases, NUM_STEPS)
    paged = backend_trajectories(model, "paged", backend, cases, NUM_STEPS, 8, 0, stock, FP8,
                                 calibrate_scales=True)  # fmt: skip
    diffs = [diff for key in stock for diff in step_diffs(paged[key], stock[key])]
    assert 0 < max(diff.max_rel_diff for diff in diffs) <= 0.05
    assert sum(diff.argmax_equal for diff in diffs) >= 0.9 * len(diffs)
