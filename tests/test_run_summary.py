"""The summary printed at the end of a run: its cells from a known frame, its layout, its switch."""

import math
import subprocess
import sys

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.tasks.simulate.run import run_study
from kvbench.tasks.simulate.run_summary import (
    FileEntry,
    files_text,
    fixed_width_table,
    rate_text,
    size_text,
    summary_cells,
    summary_text,
)

SMALL = (
    "workload=fixed", "workload.num_requests=30", "workload.prompt_tokens=100",
    "workload.output_tokens=47", "model=opt-13b", "hardware=a100-40gb", "progress=false",
    "allocators=[naive_max,paged]", "plots=false",
)  # fmt: skip
HEADLINE_COLUMNS = ["allocator", "rate req/s", "tokens % held", "held GB", "used GB",
                    "mean batch", "done req/s", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms",
                    "TPOT p99 ms", "rejected"]  # fmt: skip


def summary_row(allocator, rate, **values):
    """A summary row with the columns the table reads (``summary.parquet``'s names)."""
    row = {
        "experiment": "demo", "model": "llama-2-70b", "hardware": "a100-80gb", "num_gpus": 4,
        "workload": "sharegpt", "block_size": 16, "preemption": "recompute", "n": 1,
        "beam_width": 1, "allocator": allocator, "request_rate": rate, "num_requests": 100,
        "kv_pool_gb": 200.0, "free_pct": 90.0, "kv_held_gb": 20.0, "token_states_pct": 2.5,
        "token_states_pct_of_held": 25.0, "token_states_gb": 5.0, "mean_batch_size": 12.34,
        "request_throughput": 1.9, "ttft_p50_s": 0.0418, "ttft_p99_s": 0.188,
        "tpot_p50_s": 0.0256, "tpot_p99_s": 0.0281, "num_rejected": 0,
    }  # fmt: skip
    row.update(values)
    return row


def test_cells_are_the_summary_columns_formatted():
    summary = pd.DataFrame([
        summary_row("naive_max", 2.0),
        summary_row("paged", 2.0, free_pct=97.4, kv_held_gb=5.2, token_states_pct=2.5,
                    token_states_pct_of_held=96.15, num_rejected=3, ttft_p99_s=float("nan")),
    ])  # fmt: skip
    cells = summary_cells(summary)
    assert [column.title for column in cells.columns] == HEADLINE_COLUMNS
    assert cells.rows[0] == ["naive_max", "2", "25.0", "20.0", "5.00", "12.3", "1.90", "0.0418",
                             "0.188", "25.6", "28.1", "0"]  # fmt: skip
    # held GB is kv_held_gb; a missing figure reads "-".
    assert cells.rows[1] == ["paged", "2", "96.2", "5.20", "5.00", "12.3", "1.90", "0.0418",
                             "-", "25.6", "28.1", "3"]  # fmt: skip
    assert cells.num_label_columns == 2


def test_labels_appear_only_when_they_vary():
    one = pd.DataFrame([summary_row("paged", 2.0), summary_row("paged", 4.0)])
    assert "workload" not in [column.name for column in summary_cells(one).columns]
    two = pd.DataFrame([summary_row("paged", 2.0, workload="sharegpt"),
                        summary_row("paged", 2.0, workload="alpaca", block_size=32)])  # fmt: skip
    cells = summary_cells(two)
    assert [column.name for column in cells.columns][:4] == ["allocator", "req/s", "workload",
                                                              "block_size"]  # fmt: skip
    assert [row[2:4] for row in cells.rows] == [["sharegpt", "16"], ["alpaca", "32"]]
    assert cells.num_label_columns == 4


@pytest.mark.parametrize(("rate", "text"), [(0.0, "trace"), (float("inf"), "inf"), (2.5, "2.5"),
                                            (20.0, "20"), (None, "-")])  # fmt: skip
def test_rates_read_as_the_docs_define_them(rate, text):
    assert rate_text(rate) == text


def test_the_table_fits_a_terminal_and_its_columns_line_up():
    rows = [summary_row(allocator, rate, workload=workload, kv_pool_gb=1234.5,
                        ttft_p99_s=123.456, mean_batch_size=256.0)
            for workload in ("sharegpt", "alpaca")
            for rate in (0.5, 2.0, 10.0, 40.0)
            for allocator in ("naive_max", "naive_pow2", "naive_oracle", "paged", "paged_prefix")]
    text = fixed_width_table(summary_cells(pd.DataFrame(rows)))  # fmt: skip
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert max(len(line) for line in lines) <= 120
    # Every figure column is right-aligned: the rows end where the header's last name ends.
    assert {len(line) for line in lines[1:]} == {len(lines[1])}
    assert lines[1].endswith("rejected")


def test_summary_text_says_what_the_run_was_and_defines_the_columns():
    text = summary_text(pd.DataFrame([summary_row("paged", 2.0), summary_row("paged", 4.0)]))
    title = text.splitlines()[0]
    assert title == "demo: llama-2-70b on 4x a100-80gb, sharegpt, 2 runs, KV pool 200.0 GB"
    assert "tokens % held: share of the KV memory an allocator holds" in text
    assert summary_text(pd.DataFrame()) == ""


def test_sizes_and_the_file_listing():
    assert [size_text(n) for n in (0, 512, 35_137, 4_324_041, 2_500_000_000)] == [
        "0 B", "512 B", "35.1 kB", "4.3 MB", "2.5 GB"]  # fmt: skip
    text = files_text("/runs/x", [FileEntry("summary.parquet", 35_137),
                                  FileEntry("plots/usage_breakdown.png", 108_600),
                                  FileEntry("block_size=8,preemption=swap/", 4_300_000, 9)])
    lines = text.splitlines()
    assert lines[0] == "results in /runs/x"
    expected = [("summary.parquet", "35.1 kB"), ("plots/usage_breakdown.png", "108.6 kB"),
                ("block_size=8,preemption=swap/", "9 files, 4.3 MB")]  # fmt: skip
    for line, (path, size) in zip(lines[1:], expected, strict=True):
        assert line.startswith(f"  {path} ") and line.endswith(f" {size}")
    # Paths left-aligned, sizes right-aligned: every line ends in the same column.
    assert {len(line) for line in lines[1:]} == {2 + len(expected[2][0]) + 2 + len(expected[2][1])}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("small")
    cfg, deployment, raw = compose_config(*SMALL, "request_rates=[1,4]")
    return cfg, deployment, raw, out


def test_held_and_used_gb_agree_with_the_share_of_held_memory_a_run_reports(small_run, capsys):
    cfg, deployment, raw, out = small_run
    summary = run_study(cfg, deployment, raw, out)
    capsys.readouterr()
    held_gb = summary["kv_held_gb"]
    for held, pool, free_pct in zip(held_gb, summary["kv_pool_gb"], summary["free_pct"],
                                    strict=True):  # fmt: skip
        assert math.isclose(held, pool * (100 - free_pct) / 100, rel_tol=1e-9)
    ratio = summary["token_states_gb"] / held_gb * 100
    for measured, reported in zip(ratio, summary["token_states_pct_of_held"], strict=True):
        assert math.isclose(measured, reported, rel_tol=1e-9)
    by_allocator = held_gb.groupby(summary["allocator"]).apply(list)
    assert all(paged < naive for paged, naive in zip(by_allocator["paged"],
                                                     by_allocator["naive_max"], strict=True))


def test_the_switch_silences_the_table_and_progress_false_does_not(small_run, capsys):
    cfg, deployment, raw, out = small_run
    assert cfg.progress is False and cfg.summary_table is True
    summary = run_study(cfg, deployment, raw, out)
    printed = capsys.readouterr().out
    assert summary_text(summary) in printed
    assert f"results in {out.resolve()}" in printed and "summary.parquet" in printed
    quiet_cfg, _, quiet_raw = compose_config(*SMALL, "request_rates=[1,4]", "summary_table=false")
    run_study(quiet_cfg, deployment, quiet_raw, out)
    assert capsys.readouterr().out == ""


def test_the_cli_prints_the_table_and_the_files_at_the_end(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "kvbench", *SMALL, "request_rates=[2]",
                           "hydra.run.dir=run"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("default: opt-13b"))
    assert lines[title] == "default: opt-13b on 1x a100-40gb, fixed, 2 runs, KV pool 11.9 GB"
    header = lines[title + 3]
    assert header.split()[:3] == ["allocator", "req/s", "%"]
    rows = {line.split()[0]: line.split() for line in lines[title + 4 : title + 6]}
    summary = pd.read_parquet(out / "summary.parquet").set_index("allocator")
    for allocator, cells in rows.items():
        assert float(cells[2]) == pytest.approx(
            summary.loc[allocator, "token_states_pct_of_held"], abs=0.05)
        assert int(cells[-1]) == summary.loc[allocator, "num_rejected"]
    listing = lines[lines.index("results in run") + 1 :]  # the folder as the user named it
    listed = {line.split()[0] for line in listing}
    assert {"summary.parquet", "steps.parquet", "requests.parquet", "report.md"} <= listed


def test_the_switch_changes_neither_the_fingerprint_nor_a_sweeps_folder_names():
    from hydra import compose, initialize_config_module

    from kvbench.tables.done_marker import config_fingerprint

    _, _, loud = compose_config(*SMALL)
    _, _, quiet = compose_config(*SMALL, "summary_table=false")
    assert config_fingerprint(loud) == config_fingerprint(quiet)
    _, _, other = compose_config(*SMALL, "seed=1")
    assert config_fingerprint(other) != config_fingerprint(loud)
    with initialize_config_module(config_module="kvbench.conf", version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True)
    assert "summary_table" in cfg.hydra.job.config.override_dirname.exclude_keys
