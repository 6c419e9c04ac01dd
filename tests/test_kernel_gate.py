"""The kernel CI gate: paged/contiguous decode attention ratio vs the committed CPU baseline.

Runs in the default suite (that is how it runs in .ci/run). The second test is the gate's
self-test: with the paged path doing twice the work the gate must fail, so a pass means something.
"""

from kvbench.tools.kernel_gate import load_baseline, main, run_gate


def test_paged_over_contiguous_ratio_is_within_the_baseline_margin():
    verdict = run_gate(load_baseline())
    assert verdict.passed, verdict.message()


def test_gate_fails_when_the_paged_path_is_slowed():
    # Two paged calls per timed call: ratio ~2.3 against a limit of ~1.35; one short attempt.
    verdict = run_gate(load_baseline(), paged_repeats=2, attempts=1, rounds=9)
    assert not verdict.passed, verdict.message()


def test_command_line_exit_status_follows_the_verdict(capsys):
    assert main(["--slow-paged-path", "3", "--attempts", "1", "--rounds", "5"]) == 1
    assert "kernel gate FAIL" in capsys.readouterr().out
