"""python -m kvbench.tools.stair_refit: runs of a profile refitted with fewer stairs and with every
one, priced against each other's times."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import priced_grid_table

from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, WAKE_TERMS
from kvbench.tools import stair_refit

ROOT = Path(__file__).resolve().parents[1]
# A device whose matmuls cost 12 ms more on 7 rows and 9 ms more on 11 than on their neighbours.
COSTS = dict.fromkeys((*PROFILE_TERMS, *WAKE_TERMS, *SWAP_TERMS), 0.0) | {
    "fixed_s": 0.05, "per_seq_s": 1e-3, "per_token_s": 5e-4, "per_context_token_s": 2e-6,
    "stair_2_tokens_s": 0.02, "stair_4_tokens_s": -0.01,
    "stair_7_tokens_s": 0.012, "stair_8_tokens_s": -0.012,
    "stair_11_tokens_s": 0.009, "stair_12_tokens_s": -0.009}  # fmt: skip


def _table():
    """The cpu grid's points timed on that device."""
    return priced_grid_table(COSTS)


def test_every_stair_prices_the_bumps_the_older_setting_cannot_see():
    table = _table()
    by_batch, summary = stair_refit.stair_tables({"a": table, "b": table},
                                                 stair_refit.OLDER_STAIRS,
                                                 stair_refit.OLDER_BATCHES)  # fmt: skip
    assert by_batch.index.tolist() == list(range(1, 17))
    every, fewer = by_batch["a", "every"], by_batch["a", "fewer"]
    assert every.abs().max() < 1e-6  # every count timed and priced: exact
    # The older grid's batches are priced exactly by the older fit too; the counts it never
    # timed are priced at the level of the count below: 7 and 11 cheaper than they ran.
    assert fewer.loc[[1, 2, 3, 4, 6, 8, 16]].abs().max() < 1e-6
    assert fewer.loc[7] < -5 and fewer.loc[11] < -3
    assert fewer.loc[[5, 9, 10, 12, 13, 14, 15]].abs().max() < 1e-6
    assert summary["a", "every"]["mean_abs_batch_error_pct"] < 1e-6
    assert summary["a", "fewer"]["mean_abs_batch_error_pct"] > 0.5
    assert by_batch["b", "fewer"].equals(fewer)


def test_the_reference_is_the_other_runs_times_at_the_run_s_level():
    # A run timed 10 % slower throughout: the level is taken out, its fits price the others'
    # times exactly.
    slow = _table()
    slow["measured_s"] *= 1.1
    by_batch, _ = stair_refit.stair_tables({"a": _table(), "slow": slow},
                                           stair_refit.OLDER_STAIRS, stair_refit.OLDER_BATCHES)
    assert by_batch["slow", "every"].abs().max() < 1e-6
    assert by_batch["a", "every"].abs().max() < 1e-6
    # Its 7-sequence points alone 10 % slower: the other run's fit prices them 10 % short of
    # it; its own stairs follow them (a stair is seconds, the bump a share of each point's, so
    # not to the digit).
    bumped = _table()
    bumped.loc[(bumped["num_decode_tokens"] == 7) & (bumped["num_prefill_tokens"] == 0),
               "measured_s"] *= 1.1  # fmt: skip
    by_batch, _ = stair_refit.stair_tables({"a": _table(), "b": bumped},
                                           stair_refit.OLDER_STAIRS, stair_refit.OLDER_BATCHES)
    assert by_batch.loc[7, ("a", "every")] == pytest.approx(100 / 1.1 - 100)
    assert by_batch.loc[7, ("b", "every")] == pytest.approx(10.0, abs=0.5)
    assert by_batch["a", "every"].drop(7).abs().max() < 1e-6


def test_fewer_than_two_runs_is_refused_in_one_line(tmp_path, capsys):
    _table().to_parquet(tmp_path / "profile.parquet")
    assert stair_refit.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "stair_refit: give two or more task=profile runs of the same grid\n")


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--stairs", "2,999", "stair_refit: --stairs 999: no stair prices that count; give counts "
                          "among 2-16\n"),
    ("--batches", "99999", "stair_refit: --batches 99999: the runs time none of these decode "
                           "batches; they time "),
])  # fmt: skip
def test_stairs_or_batches_the_runs_cannot_refit_are_refused(tmp_path, capsys, option, value,
                                                             message):
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        _table().to_parquet(tmp_path / run / "profile.parquet")
    assert stair_refit.main([str(tmp_path / "a"), str(tmp_path / "b"), option, value]) == 2
    assert capsys.readouterr().err.startswith(message)


def test_the_docs_block_is_what_the_tool_prints_on_the_committed_runs(capsys, monkeypatch):
    """docs/sim_to_real_measured.md's block = the tool on the committed AMD EPYC runs."""
    monkeypatch.chdir(ROOT / "results/reference/stair_counts/amd-epyc-2026-12-07")
    assert stair_refit.main(["stairs_1", "stairs_2"]) == 0
    text = (ROOT / "docs" / "sim_to_real_measured.md").read_text()
    block = text.split("<!-- stair-refit: begin -->\n```\n")[1].split("```\n")[0]
    assert block == capsys.readouterr().out
