"""`python -m kvbench.tasks.report` over sim_to_real / sim_to_vllm runs: errors across runs, each
predictor paired with the engine's own repeat."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from scipy.stats import binomtest

from kvbench.tasks.report import write_report
from kvbench.tasks.report.sim_to_real_runs import RUN_DIR_KEYS, run_names, slice_cells
from kvbench.tasks.sim_to_real.table import repeat_pairs, repeat_split


def _rows(run: str, errors: dict[tuple[str, str, float], float]) -> pd.DataFrame:
    """One run's table: E2E ``errors`` keyed by (source, workload, rate), TTFT twice and TPOT
    half of each; the fit slice is alpaca."""
    return pd.DataFrame([
        {"run_dir": run, "source": source, "workload": workload, "request_rate": rate,
         "allocator": "paged", "held_out": source == "real_repeat" or workload != "alpaca",
         "e2e_mape_pct": error, "ttft_mape_pct": 2 * error, "tpot_mape_pct": error / 2}
        for (source, workload, rate), error in errors.items()
    ])  # fmt: skip


def _two_runs() -> pd.DataFrame:
    # Run 1: the grid nearer than the repeat on both held-out rows; run 2: on one of two.
    one = _rows("/r/run1", {("interleaved_grid", "alpaca", 1.0): 2.0,
                            ("interleaved_grid", "sharegpt", 1.0): 5.0,
                            ("interleaved_grid", "sharegpt", 4.0): 7.0,
                            ("real_repeat", "sharegpt", 1.0): 10.0,
                            ("real_repeat", "sharegpt", 4.0): 9.0})  # fmt: skip
    two = _rows("/r/run2", {("interleaved_grid", "alpaca", 1.0): 4.0,
                            ("interleaved_grid", "sharegpt", 1.0): 20.0,
                            ("interleaved_grid", "sharegpt", 4.0): 6.0,
                            ("real_repeat", "sharegpt", 1.0): 3.0,
                            ("real_repeat", "sharegpt", 4.0): 6.0})  # fmt: skip
    return pd.concat([one, two], ignore_index=True)


def test_each_run_s_slices_are_its_median_errors_the_fit_slice_in_parentheses():
    cells = slice_cells(_two_runs())
    assert list(cells.columns) == ["run 1", "run 2"]
    assert cells.loc["interleaved_grid"].tolist() == ["(2.0) / 6.0 %", "(4.0) / 13.0 %"]
    assert cells.loc["real_repeat"].tolist() == ["– / 9.5 %", "– / 4.5 %"]


def test_a_predictor_is_paired_with_the_repeat_of_its_own_run_only():
    pairs = repeat_pairs(_two_runs(), "real_repeat", RUN_DIR_KEYS).set_index("source")
    grid = pairs.loc["interleaved_grid"]
    # 4 held-out rows (the alpaca fit slice is not); nearer in run 1's two, a tie in run 2.
    assert (grid.num_pairs, grid.num_nearer, grid.num_ties) == (4, 2, 1)
    assert grid.sign_test_p == pytest.approx(binomtest(2, 3).pvalue)
    assert (grid.median_profile_pct, grid.median_repeat_pct) == (6.5, 7.5)
    assert grid.median_ratio == pytest.approx(6.5 / 7.5)
    # TTFT and TPOT over the same rows (here 2x and half of each E2E error).
    assert (grid.median_ttft_pct, grid.median_ttft_repeat_pct) == (13.0, 15.0)
    assert (grid.median_tpot_pct, grid.median_tpot_repeat_pct) == (3.25, 3.75)
    assert "real_repeat" not in pairs.index
    assert "num_clusters" not in pairs.columns  # no clusters asked for


def test_whole_runs_are_compared_by_their_medians():
    pairs = repeat_pairs(_two_runs(), "real_repeat", RUN_DIR_KEYS, cluster_keys=("run_dir",))
    grid = pairs.set_index("source").loc["interleaved_grid"]
    # Run 1: medians 6.0 against 9.5, nearer; run 2: 13.0 against 4.5, not.
    assert (grid.num_clusters, grid.num_clusters_nearer, grid.num_clusters_tied) == (2, 1, 0)
    assert grid.clusters_sign_test_p == pytest.approx(binomtest(1, 2).pvalue)
    assert grid.num_pairs == 4  # the pairs' own figures unchanged
    # Within one run the clusters can be its jobs (a slice at a rate): both of run 1's nearer.
    jobs = repeat_pairs(_two_runs(), "real_repeat", RUN_DIR_KEYS,
                        cluster_keys=("run_dir", "workload", "request_rate"))  # fmt: skip
    assert (jobs.num_clusters[0], jobs.num_clusters_nearer[0], jobs.num_clusters_tied[0]) \
        == (4, 2, 1)


def test_runs_are_named_from_the_folder_holding_them():
    assert run_names(["/a/b/run1", "/a/b/run2"]) == ["run1", "run2"]
    assert run_names(["/a/x/run", "/a/y/run"]) == ["x/run", "y/run"]
    assert run_names(["/a/b/run1"]) == ["run1"]


def test_the_report_over_sim_to_real_runs_alone_writes_their_section(tmp_path):
    table = _two_runs()
    for run, rows in table.groupby("run_dir"):
        folder = tmp_path / "runs" / run.rsplit("/", 1)[1]
        folder.mkdir(parents=True)
        rows.drop(columns="run_dir").to_parquet(folder / "sim_to_real.parquet")
    tables = write_report([tmp_path / "runs"], tmp_path / "out")
    assert tables.summary.empty and not tables.empty
    text = (tmp_path / "out" / "sim_to_real_runs.md").read_text()
    assert "kvbench's real executor: `sim_to_real.parquet`, 2 runs" in text
    assert "| interleaved_grid | 2 of 4 (1 tied) |" in text and "Runs: 1 `run1`, 2 `run2`" in text
    assert "| 0.87 | 13.0 % (15.0 %) | 3.2 % (3.8 %) |" in text
    assert not (tmp_path / "out" / "reproduction.md").exists()  # no summary: no paper figures
    command = [sys.executable, "-m", "kvbench.tasks.report", str(tmp_path / "runs"), "--out",
               str(tmp_path / "cli")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "2 sim-to-real runs" in done.stdout


def test_the_docs_block_is_what_the_report_makes_of_the_committed_runs():
    """docs/sim_to_real_measured.md's table across runs = the report on the committed AMD EPYC
    runs."""
    from test_report import _block_body

    from kvbench.tasks.report.aggregate import load_tables
    from kvbench.tasks.report.sim_to_real_runs import ENGINE_TABLES, sim_to_real_runs_section

    root = Path(__file__).resolve().parents[1]
    runs = root / "results" / "reference" / "sim_to_real_runs" / "amd-epyc-2026-12-03"
    tables = {name: load_tables([runs], name) for name, _, _ in ENGINE_TABLES}
    assert [tables[name]["run_dir"].nunique() for name, _, _ in ENGINE_TABLES] == [5, 5]
    expected = sim_to_real_runs_section(tables)
    text = (root / "docs" / "sim_to_real_measured.md").read_text()
    assert _block_body(text, "sim_to_real_runs") == expected.strip()


ROOT = Path(__file__).resolve().parents[1]


def _committed_report(runs: Path) -> tuple[dict[str, pd.DataFrame], str]:
    """The committed runs' tables by file name, and the report's section on them with its
    headings one level down (as docs/sim_to_real_measured.md nests them under a day)."""
    from kvbench.tasks.report.aggregate import load_tables
    from kvbench.tasks.report.sim_to_real_runs import ENGINE_TABLES, sim_to_real_runs_section

    tables = {name: load_tables([runs], name) for name, _, _ in ENGINE_TABLES}
    section = sim_to_real_runs_section(tables).strip()
    return tables, "#" + section.replace("\n### ", "\n#### ")


def _measured_section(heading: str) -> str:
    """docs/sim_to_real_measured.md's section under ``heading``, to the next section."""
    text = (ROOT / "docs" / "sim_to_real_measured.md").read_text()
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _span(table: pd.DataFrame, source: str) -> str:
    """The lowest and highest of ``source``'s held-out slice medians over the runs."""
    held_out = table[(table["source"] == source) & table["held_out"]]
    medians = held_out.groupby(["run_dir", "workload"])["e2e_mape_pct"].median()
    return f"{medians.min():.1f}-{medians.max():.1f} %"


def _docs_row(label: str) -> list[str]:
    """The cells after the first of docs/sim_to_real.md's table row labelled ``label``."""
    text = (ROOT / "docs" / "sim_to_real.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip().strip("*") for cell in line.split("|")[2:-1]]


EVENING = "## A steady evening on an AMD EPYC (2026-12-07)"


@pytest.mark.parametrize(("run", "heading", "num_runs"), [
    ("intel-xeon-2026-12-04", "## Again on an Intel Xeon (2026-12-04)", 2),
    ("amd-epyc-2026-12-05", "## Again on an AMD EPYC (2026-12-05)", 2),
    ("amd-epyc-2026-12-06", "## Signed stairs, on an AMD EPYC (2026-12-06)", 3),
    ("amd-epyc-2026-12-07", "## Again on an AMD EPYC (2026-12-07)", 2),
    ("amd-epyc-2026-12-07-evening", EVENING, 1),
])  # fmt: skip
def test_a_later_machines_tables_in_the_docs_are_what_the_report_makes_of_its_runs(
    run, heading, num_runs
) -> None:  # type: ignore[no-untyped-def]
    """docs/sim_to_real_measured.md's tables under ``heading`` = the report on the runs of each
    experiment committed for that machine (its headings one level down, under that section)."""
    tables, expected = _committed_report(ROOT / "results" / "reference" / "sim_to_real_runs" / run)
    assert [table["run_dir"].nunique() for table in tables.values()] == [num_runs] * 2
    assert expected in _measured_section(heading)


def test_the_fp8_sim_to_real_table_in_the_docs_is_what_the_report_makes_of_its_runs():
    """docs/sim_to_real_measured.md's fp8 section: the report on the committed fp32 and fp8
    sim_to_real runs (no sim_to_vllm beside them: it refused fp8 then)."""
    tables, expected = _committed_report(ROOT / "results" / "reference" / "fp8_kv"
                                         / "amd-epyc-2026-12-06")  # fmt: skip
    assert tables["sim_to_real.parquet"]["run_dir"].nunique() == 2
    assert expected in _measured_section("## fp8 K/V on an AMD EPYC (2026-12-06)")


def test_the_fp8_sim_to_vllm_table_in_the_docs_is_what_the_report_makes_of_its_runs():
    """docs/sim_to_real_measured.md's section on fp8 in real vLLM: the report on the committed
    fp32 and fp8 sim_to_vllm runs, and the fair-instrument figures it quotes."""
    runs = ROOT / "results" / "reference" / "fp8_kv" / "amd-epyc-2026-12-07"
    tables, expected = _committed_report(runs)
    assert tables["sim_to_vllm.parquet"]["run_dir"].nunique() == 2
    section = _measured_section("## fp8 K/V in real vLLM (2026-12-07)")
    assert expected in section
    for kv_dtype in ("fp32", "fp8"):
        fair = pd.read_parquet(runs / f"sim_to_vllm_{kv_dtype}" / "fair_instrument.parquet")
        for row in fair.iloc[:2].itertuples():  # vLLM, then kvbench on vLLM's matmuls
            for figure in (row.output_tokens_per_s, row.median_decode_step_s * 1e3):
                assert f"{figure:.1f}" in section, (kv_dtype, row.engine, figure)


@pytest.mark.parametrize(("run", "row"), [
    ("amd-epyc-2026-12-03", "AMD EPYC, 2026-12-03 (5)"),
    ("intel-xeon-2026-12-04", "Intel Xeon, 2026-12-04 (2)"),
    ("amd-epyc-2026-12-05", "AMD EPYC, 2026-12-05 (2)"),
    ("amd-epyc-2026-12-06", "AMD EPYC, 2026-12-06, signed stairs (3)"),
    ("amd-epyc-2026-12-07", "AMD EPYC, 2026-12-07 (2)"),
    ("amd-epyc-2026-12-07-evening", "AMD EPYC, 2026-12-07 evening, steady (1)"),
])  # fmt: skip
def test_where_the_figures_stand_spans_each_machines_committed_runs(
    run, row
) -> None:  # type: ignore[no-untyped-def]
    """docs/sim_to_real.md's summary row of a machine and day = the lowest and highest of its
    committed runs' held-out slice medians, per predictor."""
    from kvbench.tasks.report.aggregate import load_tables

    runs = ROOT / "results" / "reference" / "sim_to_real_runs" / run
    real = load_tables([runs], "sim_to_real.parquet")
    vllm = load_tables([runs], "sim_to_vllm.parquet")
    cells = _docs_row(row)
    assert cells[:3] == [_span(real, "interleaved_grid"), _span(real, "interleaved_grid_local"),
                         _span(real, "real_repeat")]  # fmt: skip
    assert cells[4:6] == [_span(vllm, "vllm_grid"), _span(vllm, "vllm_repeat")]


def test_the_warm_up_sim_to_real_table_in_the_docs_is_what_the_report_makes_of_its_runs():
    """docs/sim_to_real_measured.md's first-prefills section: the report on the committed
    sim_to_real runs served with the larger warm-up (no sim_to_vllm beside them)."""
    tables, expected = _committed_report(ROOT / "results" / "reference" / "warm_up"
                                         / "amd-epyc-2026-12-06")  # fmt: skip
    assert tables["sim_to_real.parquet"]["run_dir"].nunique() == 2
    grid_rows = tables["sim_to_real.parquet"].query("source == 'grid_profile'")
    assert (grid_rows["extrapolated_steps_pct"] == 0).all()  # counted against the file's grid
    assert expected in _measured_section("## A served run's first prefills (2026-12-06)")


LONG_RUNS = ROOT / "results" / "reference" / "sim_to_vllm_long" / "amd-epyc-2026-12-07"
MORNING = "## Four times the context against real vLLM (2026-12-07)"
AFTERNOON = "## The fp8 miss at four times the context was the machine's (2026-12-07)"
# Each committed run: its row in docs/sim_to_real.md and the log's section that reports it.
LONG_ROWS = {"short_grid": ("fp32, the grid at 256-token lengths only", MORNING),
             "long_grid": ("fp32, the grid at both lengths", MORNING),
             "long_grid_fp8": ("fp8 K/V, the grid at both lengths", MORNING),
             "long_grid_fp8_2": ("fp8 K/V, the grid at both lengths, 13:32", AFTERNOON),
             "long_grid_2": ("fp32, the grid at both lengths, 13:45", AFTERNOON)}  # fmt: skip


@pytest.mark.parametrize("run", sorted(LONG_ROWS))
def test_the_longer_context_runs_in_the_docs_are_what_their_tables_hold(run) -> None:  # type: ignore[no-untyped-def]
    """experiment=sim_to_vllm_long: docs/sim_to_real.md's row of each committed run (errors per
    predictor, extrapolated steps) and the report on it in docs/sim_to_real_measured.md."""
    row, heading = LONG_ROWS[run]
    tables, expected = _committed_report(LONG_RUNS / run)
    assert expected in _measured_section(heading)
    table = tables["sim_to_vllm.parquet"]
    cells = slice_cells(table)["run 1"]
    grid = table[table["source"] == "vllm_grid"]
    beyond = grid.groupby("workload", sort=False)["extrapolated_steps_pct"].median()
    assert _docs_row(row) == [
        cells["vllm_grid"], cells["vllm_fit_slice"], cells["vllm_repeat"],
        f"{beyond['sharegpt']:.0f} / {beyond['azure_conv']:.0f} %"]  # fmt: skip


REAL_LONG_RUNS = ROOT / "results" / "reference" / "sim_to_real_long" / "amd-epyc-2026-12-07"
MORNING_RUNS = ROOT / "results" / "reference" / "sim_to_real_runs" / "amd-epyc-2026-12-07"
# The committed runs whose steps the docs split: (their steps table, its replays, docs row).
SPLIT_ROWS = [
    (LONG_RUNS / "long_grid" / "vllm_steps.parquet", 6, "fp32, morning (`long_grid`)"),
    (LONG_RUNS / "long_grid_fp8" / "vllm_steps.parquet", 6, "fp8, morning (`long_grid_fp8`)"),
    (LONG_RUNS / "long_grid_fp8_2" / "vllm_steps.parquet", 6,
     "fp8, afternoon (`long_grid_fp8_2`)"),
    (LONG_RUNS / "long_grid_2" / "vllm_steps.parquet", 6, "fp32, afternoon (`long_grid_2`)"),
    (REAL_LONG_RUNS / "real_1" / "real_steps.parquet", 24,
     "kvbench's executor, 11:41 (`real_1`)"),
    (REAL_LONG_RUNS / "real_2" / "real_steps.parquet", 24,
     "kvbench's executor, 12:08 (`real_2`)"),
    (MORNING_RUNS / "real_1" / "real_steps.parquet", 24, "kvbench's executor, 08:50 (`real_1`)"),
    (MORNING_RUNS / "real_2" / "real_steps.parquet", 24, "kvbench's executor, 09:07 (`real_2`)"),
    (MORNING_RUNS / "vllm_1" / "vllm_steps.parquet", 6, "vLLM, 09:02 (`vllm_1`)"),
    (MORNING_RUNS / "vllm_2" / "vllm_steps.parquet", 6, "vLLM, 09:20 (`vllm_2`)"),
]  # fmt: skip


@pytest.mark.parametrize("root", [LONG_RUNS, REAL_LONG_RUNS, MORNING_RUNS])
def test_the_split_tables_in_the_docs_are_what_the_report_makes_of_the_runs_steps(
    root, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """docs/sim_to_real_measured.md's tables of each replay against its repeat: per committed
    run that kept its steps, the row ``python -m kvbench.tasks.report`` writes for it (its
    replays, every one with its repeat, and the ranges of ``repeat_split``'s figures)."""
    write_report([root], tmp_path)
    text = (tmp_path / "sim_to_real_runs.md").read_text()
    section = _measured_section(AFTERNOON).split("### Each replay against its repeat", 1)[1]
    rows = [(steps, count, row) for steps, count, row in SPLIT_ROWS if steps.is_relative_to(root)]
    assert rows
    for steps, num_replays, row in rows:
        line = next(line for line in section.splitlines() if line.startswith(f"| {row} |"))
        ranges = line.strip("| ").split(" | ")[1:]
        assert f"| `{steps.parent.name}` | {num_replays} | {' | '.join(ranges)} |" in text


def test_the_longer_context_sim_to_real_runs_in_the_docs_are_what_their_tables_hold():
    """experiment=sim_to_real_long: docs/sim_to_real.md's row over the committed runs (each
    predictor's span of held-out slice medians) and the report on them in the log."""
    runs = ROOT / "results" / "reference" / "sim_to_real_long" / "amd-epyc-2026-12-07"
    tables, expected = _committed_report(runs)
    table = tables["sim_to_real.parquet"]
    assert table["run_dir"].nunique() == 2
    assert expected in _measured_section(
        "## Four times the context on kvbench's executor (2026-12-07)")
    assert _docs_row("AMD EPYC, 2026-12-07, requests to 256 tokens (2)") == [
        _span(table, "interleaved_grid"), _span(table, "interleaved_grid_local"),
        _span(table, "real_repeat"), _span(table, "fit_slice")]  # fmt: skip


def test_a_replays_error_ranks_with_its_own_share_of_the_miss_as_the_docs_say():
    """docs/sim_to_real_measured.md: Spearman's rho of the grid profile's held-out E2E error per
    replay with the size of the replay's own share, and with what both serves showed alike."""
    from scipy.stats import spearmanr

    def rhos(steps: list[Path], source: str) -> list[str]:
        frames = []
        for path in steps:
            table = pd.read_parquet(path.with_name(
                "sim_to_real.parquet" if path.name == "real_steps.parquet"
                else "sim_to_vllm.parquet"))  # fmt: skip
            split = repeat_split(pd.read_parquet(path))
            keys = [key for key in ("workload", "request_rate", "allocator") if key in split]
            errors = table[table["source"] == source][[*keys, "e2e_mape_pct"]]
            frames.append(split.merge(errors, on=keys, validate="one_to_one"))
        both = pd.concat(frames)
        return [f"{spearmanr(both[column].abs(), both['e2e_mape_pct']).statistic:.2f}"
                for column in ("replay_alone_pct", "shared_over_price_pct")]  # fmt: skip

    real = rhos([steps for steps, _, _ in SPLIT_ROWS if steps.is_relative_to(REAL_LONG_RUNS)],
                "interleaved_grid")  # fmt: skip
    vllm = rhos([steps for steps, _, _ in SPLIT_ROWS if steps.is_relative_to(LONG_RUNS)],
                "vllm_grid")  # fmt: skip
    text = " ".join(_measured_section(AFTERNOON).split())
    assert (f"Spearman's rho {real[0]} over these 48 replays on kvbench's executor and {vllm[0]} "
            f"over the 24 on vLLM above, against {real[1]} and {vllm[1]} with") in text


def test_no_allocators_first_pass_ran_slower_than_its_second_as_the_docs_say(tmp_path):
    """docs/sim_to_real_measured.md: over the four committed sim_to_real runs' replays, what the
    report over many runs says of the passes' order (``pass_order_lines``)."""
    write_report([MORNING_RUNS, REAL_LONG_RUNS], tmp_path)
    report = (tmp_path / "sim_to_real_runs.md").read_text()
    text = " ".join(_measured_section(AFTERNOON).split())
    first_further = re.search(r"further over the price than the repeat's in (\d+) of (\d+) "
                              r"pairs \(sign test p ([\d.]+); "
                              r"medians ([-+\d.]+) and ([-+\d.]+) %\)", report)  # fmt: skip
    further, pairs, p_value, first, repeat = first_further.groups()
    assert pairs == "96"
    assert (f"in only {further} of {pairs} pairs (sign test p {p_value}; medians "
            f"{float(first):.1f} and {repeat} %)") in text
    own = dict(re.findall(r"`(\w+)` ([-+\d.]+) % \(24 replays\)", report))
    assert list(own) == ["naive_max", "naive_oracle", "paged", "paged_prefix"]
    assert (f"the median own share was {float(own['naive_max']):.1f} % under `naive_max`, "
            f"{float(own['naive_oracle']):.1f} % under `naive_oracle`, "
            f"{float(own['paged']):.1f} % under `paged` and {float(own['paged_prefix']):.1f} % "
            f"under `paged_prefix` (24 replays each)") in text


def test_the_steady_evenings_split_and_fair_instrument_in_the_docs_are_its_tables(tmp_path):
    """docs/sim_to_real_measured.md's steady evening: the split's ranges and the passes' order as
    the report over its runs gives them, from the repeat_split tables the runs wrote, and the fair
    instrument's figures."""
    runs = ROOT / "results" / "reference" / "sim_to_real_runs" / "amd-epyc-2026-12-07-evening"
    write_report([runs], tmp_path)
    report = (tmp_path / "sim_to_real_runs.md").read_text()
    text = " ".join(_measured_section(EVENING).split())
    ranges = []
    for engine in ("real_1", "vllm_1"):
        split = pd.read_parquet(runs / engine / "repeat_split.parquet")
        steps = "real_steps.parquet" if engine == "real_1" else "vllm_steps.parquet"
        pd.testing.assert_frame_equal(
            split, repeat_split(pd.read_parquet(runs / engine / steps)))  # fmt: skip
        ranges.append([f"{split[column].min():+.1f} to {split[column].max():+.1f} %"
                       for column in ("replay_over_price_pct", "shared_over_price_pct")])
        assert f"| `{engine}` | {len(split)} | {ranges[-1][0]} | {ranges[-1][1]} |" in report
    (real_steps, real_alike), (vllm_steps, vllm_alike) = ranges
    assert (f"steps ran {real_steps} over the grid's price, what replay and repeat showed "
            f"alike {real_alike}; on vLLM {vllm_steps} and {vllm_alike}") in text
    order = re.search(r"in (\d+ of \d+ pairs \(sign test p [\d.]+; medians [-+\d.]+ and "
                      r"[-+\d.]+ %\))", report).group(1)  # fmt: skip
    assert f"steps ran further over the price than the repeat's in {order}" in text
    fair = pd.read_parquet(runs / "vllm_1" / "fair_instrument.parquet")
    vllm, kvbench_onednn, kvbench_aten = fair.itertuples()
    assert (f"at {kvbench_onednn.ratio_to_vllm:.2f}x vLLM's output tokens/s "
            f"({kvbench_onednn.output_tokens_per_s:.1f} against {vllm.output_tokens_per_s:.1f}; "
            f"{kvbench_aten.ratio_to_vllm:.2f}x through aten's matmuls)") in text
