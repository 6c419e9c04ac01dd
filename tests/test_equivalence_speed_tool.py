"""python -m kvbench.tools.equivalence_speed: logit_equivalence's passes timed one sequence at a
time and batched, each with the criterion it met."""

from __future__ import annotations

import pytest
import torch

from kvbench.tasks.equivalence.cases import Trajectory
from kvbench.tasks.equivalence.table import Verdict
from kvbench.tools import equivalence_speed


def test_the_summary_is_the_medians_over_rounds_summed_as_each_loop_runs_the_experiment():
    times_s = {
        "one by one: stock": [40.0, 44.0, 42.0],
        "one by one: paged torch": [50.0, 54.0, 60.0],
        "one by one: paged gather": [45.0, 46.0, 47.0],
        "batched: stock": [6.0, 7.0, 8.0],
        "batched: paged torch": [7.0, 8.0, 6.0],
        "batched: paged gather": [9.0, 10.0, 8.0],
    }
    lines = equivalence_speed.summary_lines(times_s, ["paged"])
    assert lines[:3] == [
        "stock: one by one 42.0 s, batched 7.0 s (6.0x)",
        "paged torch: one by one 54.0 s, batched 7.0 s (7.7x)",
        "paged gather: one by one 46.0 s, batched 9.0 s (5.1x)",
    ]
    # 42 + 54 + 46 = 142 against 7 + 7 + 9 = 23.
    assert lines[3] == ("the experiment's passes (stock, torch and gather per allocator): "
                        "142.0 s one by one, 23.0 s batched (6.2x)")  # fmt: skip


def _verdict(max_abs_diff: float, max_rel_diff: float, same_tokens: bool = True) -> Verdict:
    stock = Trajectory(torch.tensor([[10.0, 0.0]]), [0])
    paged = Trajectory(torch.tensor([[10.0 - max_abs_diff, 0.0]]), [0 if same_tokens else 1])
    verdict = equivalence_speed.judged({(0, 0): paged}, {(0, 0): stock})
    # fp32 logits: the differences are the requested ones to fp32's rounding of 10 - diff.
    assert (verdict.max_abs_diff, verdict.max_rel_diff) == pytest.approx(
        (max_abs_diff, max_rel_diff), rel=0.01)
    return verdict


def test_a_pass_past_the_tolerance_or_with_other_tokens_fails_and_zero_is_bit_identical():
    lines = equivalence_speed.criterion_lines({
        "batched: paged torch": _verdict(2e-5, 2e-6),
        "batched: paged gather": _verdict(0.0, 0.0),
        "batched: paged_prefix torch": _verdict(3e-4, 3e-5),
        "batched: stock": _verdict(4e-5, 4e-6, same_tokens=False),
    })  # fmt: skip
    assert lines == [
        "batched: paged torch: max_rel_diff 2.0e-06, continuations identical, against its stock "
        "cache (PASS)",
        "batched: paged gather: max_rel_diff 0.0e+00, continuations identical, against its stock "
        "cache (PASS, bit-identical)",
        "batched: paged_prefix torch: max_rel_diff 3.0e-05, continuations identical, against its "
        "stock cache (FAIL)",
        "batched: stock: max_rel_diff 4.0e-06, continuations DIFFER, against the one-by-one stock "
        "cache (FAIL)",
    ]


def test_the_tool_times_every_pass_and_each_meets_the_criterion(capsys):
    argv = ["--model", "tiny-llama-gqa", "--prompts", "2", "--steps", "3", "--rounds", "2",
            "--threads", "1"]  # fmt: skip
    assert equivalence_speed.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "tiny-llama-gqa: 2 prompts x 2 samples x 3 steps, block size 8, 2 rounds" in lines[0]
    parts = ["stock"] + [f"{allocator} {backend}" for allocator in ("paged", "paged_prefix")
                         for backend in equivalence_speed.BACKENDS]  # fmt: skip
    loop_parts = [f"{loop}: {part}" for loop in ("one by one", "batched") for part in parts]
    timed = [line.split(": ", 1)[1].rsplit(" ", 2)[0] for line in lines[1:21]]
    assert timed == loop_parts * 2
    assert [line.split(":")[0] for line in lines[21:26]] == parts
    assert lines[26].startswith("the experiment's passes (stock, ")
    criteria = lines[27:]
    assert [line.rsplit(": max_rel_diff", 1)[0] for line in criteria] == [
        *loop_parts[1:5], *loop_parts[6:], "batched: stock"
    ]
    assert all(line.endswith("(PASS)") or line.endswith("(PASS, bit-identical)")
               for line in criteria)  # fmt: skip
    # gather reads the same K/V through the stock SDPA as its stock cache: bit-identical, batched
    # too (the padded batch is the stock cache's own).
    gathers = [line for line in criteria if " gather:" in line]
    assert len(gathers) == 4 and all(line.endswith("(PASS, bit-identical)") for line in gathers)


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--steps", "0"], ["--prompts", "0"],
                                  ["--samples", "0"], ["--block-size", "0"]])
def test_a_count_below_one_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        equivalence_speed.main(argv)
    assert exit_info.value.code == 2
    assert f"argument {argv[0]}: 0 is too small; expected >= 1" in capsys.readouterr().err
