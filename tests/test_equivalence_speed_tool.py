"""python -m kvbench.tools.equivalence_speed: logit_equivalence's passes timed one sequence at a
time and batched, each with the criterion it met."""

from __future__ import annotations

import pytest

from kvbench.tools import equivalence_speed


def test_the_summary_is_the_medians_over_rounds_summed_as_each_loop_runs_the_experiment():
    times_s = {
        "stock": [40.0, 44.0, 42.0],
        "paged torch one by one": [50.0, 54.0, 60.0],
        "paged torch batched": [7.0, 8.0, 6.0],
        "paged gather": [45.0, 46.0, 47.0],
    }
    lines = equivalence_speed.summary_lines(times_s, ["paged"])
    assert lines[0] == "paged: torch one by one 54.0 s, batched 7.0 s (7.7x); gather 46.0 s"
    # 42 + 46 + 54 = 142 against 42 + 46 + 7 = 95.
    assert lines[1] == ("the experiment's passes (stock 42.0 s, torch and gather per allocator): "
                        "142.0 s one by one, 95.0 s batched (1.5x)")  # fmt: skip


def test_a_pass_past_the_tolerance_fails_and_zero_is_bit_identical():
    lines = equivalence_speed.criterion_lines(
        {"paged torch batched": 2e-6, "paged gather": 0.0, "paged_prefix torch batched": 3e-5},
        tolerance=1e-5,
    )  # fmt: skip
    assert lines == [
        "paged torch batched: max_rel_diff 2.0e-06 from the stock cache (PASS)",
        "paged gather: max_rel_diff 0.0e+00 from the stock cache (PASS, bit-identical)",
        "paged_prefix torch batched: max_rel_diff 3.0e-05 from the stock cache (FAIL)",
    ]


def test_the_tool_times_every_pass_and_each_meets_the_criterion(capsys):
    argv = ["--model", "tiny-llama-gqa", "--prompts", "2", "--steps", "3", "--rounds", "2",
            "--threads", "1"]  # fmt: skip
    assert equivalence_speed.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "tiny-llama-gqa: 2 prompts x 2 samples x 3 steps, block size 8, 2 rounds" in lines[0]
    parts = [f"{allocator} {name}" for allocator in ("paged", "paged_prefix")
             for name in equivalence_speed.PASSES]  # fmt: skip
    timed = [line.split(": ", 1)[1].rsplit(" ", 2)[0] for line in lines[1:15]]
    assert timed == (["stock", *parts]) * 2
    assert lines[15].startswith("paged: torch one by one ")
    assert lines[17].startswith("the experiment's passes (stock ")
    criteria = lines[18:]
    assert [line.split(":")[0] for line in criteria] == parts
    assert all(line.endswith("(PASS)") or line.endswith("(PASS, bit-identical)")
               for line in criteria)  # fmt: skip
    # gather reads the same K/V through the stock SDPA: bit-identical on prompts without a hit.
    assert criteria[2].endswith("(PASS, bit-identical)")


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--steps", "0"], ["--prompts", "0"]])
def test_a_count_below_one_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        equivalence_speed.main(argv)
    assert exit_info.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err
