"""python -m kvbench.tools.steadiness: how steadily the machine repeats the same work, in figures
that say whether noise averages out over a request's steps or sums."""

from __future__ import annotations

import pytest

from kvbench.tools import steadiness


def test_the_figures_of_known_runs():
    # A speed that drifts one way: every run is near the next (correlation 1).
    drifting = steadiness.steadiness([0.010, 0.011, 0.012, 0.013, 0.014, 0.015, 0.016, 0.017])
    assert drifting.median_ms == pytest.approx(13.5)
    assert drifting.iqr_pct == pytest.approx((15.75 - 11.25) / 13.5 * 100)  # quartiles
    assert (drifting.min_ms, drifting.max_ms) == pytest.approx((10.0, 17.0))
    assert drifting.lag1_correlation == pytest.approx(1.0)
    # Runs that alternate: each is the opposite of the one before (correlation -1).
    alternating = steadiness.steadiness([0.010, 0.020] * 4)
    assert alternating.lag1_correlation == pytest.approx(-1.0)
    steady = steadiness.steadiness([0.010] * 5)
    assert (steady.iqr_pct, steady.lag1_correlation) == (0.0, 0.0)
    with pytest.raises(ValueError, match="at least 4"):
        steadiness.steadiness([0.01, 0.02, 0.03])


def test_the_tool_prints_each_probe(capsys):
    assert steadiness.main(["--repeats", "4", "--threads", "1", "--python-iterations", "1000",
                            "--matmuls", "3"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("4 runs of each probe in a row:")
    assert [line.split(":")[0] for line in lines[1:]] == ["python", "matmul (1 threads)"]
    assert all("interquartile range" in line and "correlation with the next run" in line
               for line in lines[1:])  # fmt: skip


def test_too_few_repeats_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        steadiness.main(["--repeats", "2"])
    assert exit_info.value.code == 2
    assert "--repeats=2: needs at least 4" in capsys.readouterr().err
