"""python -m kvbench.tools.profile_repeatability: each profile run against the others' times."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, WAKE_TERMS, ProfiledCostModel
from kvbench.tasks.profile.table import iteration_row, profile_frame
from kvbench.tools import profile_repeatability

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = ROOT / "results/reference/profile_rounds/amd-epyc-2026-12-07"
# Every point priced 0.1 s.
PRICE = dict.fromkeys((*PROFILE_TERMS, *WAKE_TERMS, *SWAP_TERMS), 0.0) | {"fixed_s": 0.1}


def _run(measured_s: list[float]) -> pd.DataFrame:
    """A profile table of decode points of 1, 2, ... sequences that took ``measured_s``."""
    model = ProfiledCostModel(PRICE, 16)
    return profile_frame([
        iteration_row(IterationShape(0, 0, batch, 64 * batch), 16, 0.0, seconds, 0.0, model)
        for batch, seconds in enumerate(measured_s, start=1)
    ])  # fmt: skip


def test_each_run_is_held_against_the_median_of_the_others():
    # c ran a slow spell over its last two points, 1.5x; a and b took what the price says.
    table = profile_repeatability.repeatability_table({
        "a": _run([0.1, 0.1, 0.1, 0.1]), "b": _run([0.1, 0.1, 0.1, 0.1]),
        "c": _run([0.1, 0.1, 0.15, 0.15])})  # fmt: skip
    assert table["num_points"].tolist() == [4, 4, 4]
    # a's reference is the median of b and c: 0.1, 0.1, 0.125, 0.125.
    assert table.loc["a", "measured_error_pct"] == pytest.approx(10.0)  # |0.1 / 0.125 - 1| = 20
    assert table.loc["a", "price_error_pct"] == pytest.approx(10.0)
    assert table.loc["a", "price_error_p75_pct"] == pytest.approx(20.0)
    assert table.loc["c", "measured_error_pct"] == pytest.approx(25.0)  # 0.15 against 0.1
    assert table.loc["c", "measured_level"] == pytest.approx(1.25)
    assert table.loc["c", "price_error_pct"] == 0.0  # its price (0.1) is the others' time


def test_runs_of_other_grids_or_too_few_are_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="two or more"):
        profile_repeatability.repeatability_table({"a": _run([0.1])})
    other = _run([0.1, 0.1]).assign(block_size=1)
    with pytest.raises(ValueError, match="no iteration point in common"):
        profile_repeatability.repeatability_table({"a": _run([0.1, 0.1]), "b": other})
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        _run([0.1, 0.2]).to_parquet(tmp_path / name / "profile.parquet")
    assert profile_repeatability.main([str(tmp_path / "x"), str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == ("profile_repeatability: two runs of the same folder name: "
                                       "give distinct run folders\n")  # fmt: skip
    assert profile_repeatability.main([str(tmp_path / "x"), str(tmp_path / "y" /
                                                                 "profile.parquet")]) == 0
    assert "measured_level" in capsys.readouterr().out


def test_the_docs_table_is_what_the_tool_makes_of_the_committed_runs(capsys):
    """docs/sim_to_real_measured.md's block = the tool on the committed AMD EPYC runs."""
    runs = ["back_to_back_1", "rounds_1", "back_to_back_2", "rounds_2"]
    assert profile_repeatability.main([str(ROUNDS / run) for run in runs]) == 0
    text = (ROOT / "docs" / "sim_to_real_measured.md").read_text()
    block = text.split("<!-- profile-repeatability: begin -->\n```\n")[1].split("```\n")[0]
    assert block == capsys.readouterr().out
