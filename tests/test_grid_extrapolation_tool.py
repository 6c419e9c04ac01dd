"""python -m kvbench.tools.grid_extrapolation: a profile refitted on a grid's small batches,
priced on its larger ones."""

from __future__ import annotations

import pytest
from conftest import priced_grid_table

from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, WAKE_TERMS
from kvbench.tools import grid_extrapolation

# A device whose iterations cost exactly what these linear terms say (every other term 0).
LINEAR = dict.fromkeys((*PROFILE_TERMS, *WAKE_TERMS, *SWAP_TERMS), 0.0) | {
    "fixed_s": 0.02, "per_seq_s": 1e-3, "per_token_s": 5e-4, "per_context_token_s": 2e-6,
    "wake_per_sqrt_idle_s": 0.01}  # fmt: skip


def _table(slowdown: float, feature: str = "num_decode_tokens", past: int = 32):
    """The cpu grid's points (with prompts of 1,024 tokens too) timed on that device, those of
    more than ``past`` ``feature`` ``slowdown`` x."""
    return priced_grid_table(LINEAR, "profile_grid.prefill_prompts=[16,64,256,1024]",
                             scale=lambda shape: slowdown if getattr(shape, feature) > past
                             else 1.0)  # fmt: skip


def test_a_linear_device_is_priced_exactly_within_and_past_the_grid():
    table = grid_extrapolation.extrapolation_table(_table(1.0), "num_decode_tokens", 32)
    assert table.index.tolist() == [*range(1, 17), 32, 64, 128, 256]
    assert table["num_points"].tolist() == [9] * 17 + [8, 5, 4]
    assert table["small_grid_pct"].max() < 1e-6 and table["full_grid_pct"].max() < 1e-6


def test_batches_costlier_than_the_small_grid_s_line_are_mispriced_by_it_alone():
    table = grid_extrapolation.extrapolation_table(_table(1.25), "num_decode_tokens", 32)
    small, full = table["small_grid_pct"], table["full_grid_pct"]
    assert small.loc[:32].max() < 1e-6  # fitted on these: exact
    # Extrapolated: priced at 1 / 1.25 of what they took.
    assert small.loc[64:].tolist() == pytest.approx([20.0] * 3)
    assert (full.loc[64:] < small.loc[64:]).all() and (full.loc[:32] > 0.1).any()


def test_prefills_longer_than_the_small_grid_s_are_priced_past_it():
    table = grid_extrapolation.extrapolation_table(_table(1.25, "num_prefill_tokens", 512),
                                                   "num_prefill_tokens", 512)  # fmt: skip
    # Prefill-only points: 1-2 prompts of 16-1,024 tokens.
    assert table.index.tolist() == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert table["small_grid_pct"].loc[:512].max() < 1e-6
    assert table["small_grid_pct"].loc[1024:].tolist() == pytest.approx([20.0] * 2)


def test_a_table_with_nothing_larger_is_refused_in_one_line(tmp_path, capsys):
    _table(1.0).to_parquet(tmp_path / "profile.parquet")
    assert grid_extrapolation.main([str(tmp_path), "--fit-max", "256"]) == 2
    assert capsys.readouterr().err == (
        "grid_extrapolation: no num_decode_tokens past 256 in the table (its values: 1, 2, 3, 4, "
        "5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 32, 64, 128, 256); profile a grid past it "
        "(profile_grid.decode_batches, "
        "profile_grid.prefill_prompts) or give another --fit-max\n")
    assert grid_extrapolation.main([str(tmp_path), "--feature", "num_prefill_tokens",
                                    "--fit-max", "512"]) == 0  # fmt: skip
    assert "small_grid_pct" in capsys.readouterr().out
    # 0: only the prefills (0 decode tokens) would be fitted, every decode batch extrapolated.
    assert grid_extrapolation.main([str(tmp_path), "--fit-max", "0"]) == 2
    assert capsys.readouterr().err.startswith("grid_extrapolation: no num_decode_tokens up to 0 "
                                              "in the table (its values: 1, 2,")


@pytest.mark.parametrize(("marker", "run", "feature", "fit_max"), [
    ("grid-extrapolation", "decode_batches/amd-epyc-2026-12-06", "num_decode_tokens", 32),
    ("grid-extrapolation-prefill", "warm_up/amd-epyc-2026-12-06/profile_wide",
     "num_prefill_tokens", 512),
])  # fmt: skip
def test_the_docs_tables_are_what_the_tool_makes_of_the_committed_profiles(marker, run, feature,
                                                                          fit_max):
    """docs/sim_to_real_measured.md's blocks = the tool on the committed AMD EPYC profiles."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    table = grid_extrapolation.extrapolation_table(
        grid_extrapolation.read_profile_table(root / "results/reference" / run), feature, fit_max)
    text = (root / "docs" / "sim_to_real_measured.md").read_text()
    block = text.split(f"<!-- {marker}: begin -->\n```\n")[1].split("```\n")[0]
    assert block == table.to_string(float_format="{:.1f}".format) + "\n"
