"""kvbench.tools.profile_ratio: two profiles' measured times compared at the points both timed,
grouped by what each point exercises."""

from pathlib import Path

import pandas as pd
import pytest

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, ProfiledCostModel
from kvbench.tasks.profile.table import iteration_row, profile_frame, swap_row
from kvbench.tools import profile_ratio

MODEL = ProfiledCostModel(dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 1e-3), 16)
DECODES = [IterationShape(0, 0, 4, context) for context in (256, 1024, 4096, 16384)]
PREFILL = IterationShape(64, 2080, 0, 0, num_prefill_seqs=1)
MIXED = IterationShape(64, 2080, 8, 512, num_prefill_seqs=1)


def _table(decode_s, prefill_s, swap_s, wake_s=0.05, extra=()):
    rows = [iteration_row(shape, 16, 0.0, seconds, 0.0, MODEL)
            for shape, seconds in zip(DECODES, decode_s, strict=True)]  # fmt: skip
    rows += [iteration_row(PREFILL, 16, 0.0, prefill_s, 0.0, MODEL),
             iteration_row(MIXED, 16, 0.0, prefill_s, 0.0, MODEL),
             iteration_row(PREFILL, 16, 0.5, wake_s, 0.0, MODEL),
             swap_row(2048, 16, swap_s, 0.0, MODEL), *extra]  # fmt: skip
    return profile_frame(rows)


def test_each_group_is_the_ratio_of_the_times_measured_at_the_same_points():
    base = _table([0.01, 0.02, 0.04, 0.08], 0.1, 0.02)
    # Another setting: decode slower the more context it reads, swaps four times faster; and a
    # point the base never timed, which is left out.
    extra = [iteration_row(IterationShape(0, 0, 32, 512), 16, 0.0, 9.0, 0.0, MODEL)]
    other = _table([0.01, 0.03, 0.08, 0.2], 0.1, 0.005, extra=extra)
    table = profile_ratio.ratio_table(base, other)
    assert list(table.index) == [
        "decode, 1-512 context tokens", "decode, 513-2048 context tokens",
        "decode, 2049-8192 context tokens", "decode, > 8192 context tokens", "prefill", "mixed",
        "wake-up", "swap 2048 tokens",
    ]  # fmt: skip
    assert table["num_points"].tolist() == [1] * 8
    assert table["ratio_median"].tolist() == pytest.approx([1.0, 1.5, 2.0, 2.5, 1.0, 1.0, 1.0,
                                                            0.25])  # fmt: skip


def _small_decodes(seconds):
    """Decode batches of 1-5 sequences, 64 context tokens each, timed at ``seconds``."""
    return profile_frame([iteration_row(IterationShape(0, 0, batch, 64 * batch), 16, 0.0, s,
                                        0.0, MODEL)
                          for batch, s in enumerate(seconds, start=1)])  # fmt: skip


def test_quartiles_are_over_a_group_s_points():
    base, other = _small_decodes([1.0] * 5), _small_decodes([1.0, 2.0, 3.0, 4.0, 5.0])
    (group,) = profile_ratio.ratio_table(base, other).itertuples()
    assert (group.num_points, group.ratio_p25, group.ratio_median, group.ratio_p75) == (
        5, 2.0, 3.0, 4.0)


def test_the_tool_reads_run_folders_and_names_what_it_cannot_compare(tmp_path, capsys):
    for name, decode_s in (("fp32", [0.01, 0.02, 0.04, 0.08]), ("fp8", [0.01, 0.03, 0.08, 0.2])):
        (tmp_path / name).mkdir()
        _table(decode_s, 0.1, 0.02).to_parquet(tmp_path / name / "profile.parquet")
    assert profile_ratio.main([str(tmp_path / "fp32"), str(tmp_path / "fp8")]) == 0
    out = capsys.readouterr().out
    assert "at the 8 points both timed (8 and 8 in all)" in out
    assert "decode, > 8192 context tokens" in out and "2.50" in out
    assert profile_ratio.main([str(tmp_path / "fp32"), str(tmp_path / "none")]) == 2
    assert "none: no profile.parquet; give a `python -m kvbench task=profile` run folder" in (
        capsys.readouterr().err)
    pd.DataFrame({"kind": ["swap"]}).to_parquet(tmp_path / "other.parquet")
    assert profile_ratio.main([str(tmp_path / "fp32"), str(tmp_path / "other.parquet")]) == 2
    assert "not a task=profile table (no column block_size)" in capsys.readouterr().err
    disjoint = _table([0.01] * 4, 0.1, 0.02).assign(block_size=64)
    with pytest.raises(ValueError, match="share no grid point"):
        profile_ratio.ratio_table(_table([0.01] * 4, 0.1, 0.02), disjoint)


@pytest.mark.parametrize(("base", "other"), [("noise_fp32", "noise_fp8"),
                                             ("zeros_fp8", "noise_fp8"),
                                             ("zeros_fp32", "noise_fp32"),
                                             ("table_fp32", "table_fp8")])  # fmt: skip
def test_the_tables_the_docs_quote_are_the_tool_s_on_the_committed_profiles(base, other):
    root = Path(__file__).resolve().parents[1]
    runs = root / "results" / "reference" / "fp8_kv" / "amd-epyc-2026-12-06"
    table = profile_ratio.ratio_table(profile_ratio.read_profile_table(runs / f"profile_{base}"),
                                      profile_ratio.read_profile_table(runs / f"profile_{other}"))
    text = (root / "docs" / "sim_to_real_measured.md").read_text()
    assert f"```\n{table.to_string(float_format='{:.2f}'.format)}\n```" in text
