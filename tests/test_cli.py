"""The Hydra app: a small run end to end, and one clear line for each kind of bad config."""

import subprocess
import sys

import pandas as pd
import pytest

from kvbench.tables.parquet import read_metadata

SMALL_RUN = [
    "workload=fixed",
    "workload.num_requests=30",
    "workload.prompt_tokens=100",
    "workload.output_tokens=47",
    "model=opt-13b",
    "hardware=a100-40gb",
    "progress=false",
]


def run_kvbench(*overrides, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *overrides],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def test_small_run_writes_tables_plots_and_provenance(tmp_path):
    out = tmp_path / "run"
    done = run_kvbench(*SMALL_RUN, f"hydra.run.dir={out}", "plot_formats=[png,pdf]")
    assert done.returncode == 0, done.stderr
    summary = pd.read_parquet(out / "summary.parquet")
    assert sorted(summary["allocator"]) == sorted(
        ["naive_max", "naive_pow2", "naive_oracle", "paged", "paged_prefix"]
    )
    assert (summary["num_finished"] == 30).all()
    steps = pd.read_parquet(out / "steps.parquet")
    requests = pd.read_parquet(out / "requests.parquet")
    for table in (steps, requests):
        assert {"allocator", "workload", "request_rate"} <= set(table.columns)
    assert set(requests["peak_slots"][requests["allocator"] == "paged"]) == {160}
    assert set(requests["peak_slots"][requests["allocator"] == "naive_max"]) == {2048}
    for name in ("usage_breakdown", "memory_over_time", "batch_size"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 0
        assert (out / "plots" / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    assert not list(out.glob("plots/*.svg"))  # only the formats asked for
    metadata = read_metadata(out / "summary.parquet")
    assert metadata["git_commit"]
    assert "prompt_tokens: 100" in metadata["config_yaml"]
    assert (out / ".hydra" / "config.yaml").exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+workload.bogus=1", "unknown key workload.bogus"),
        ("workload.bogus=1", "unknown key workload.bogus: allowed keys here are name,"),
        ("scheduler.max_num_seqs=many", "scheduler.max_num_seqs='many'"),
        ("allocator.block_size=24", "allocator.block_size=24: must be a power of two"),
        ("workload.request_rate=-1", "request_rate=-1"),
        ("allocators=[paged,best_fit]", "allocators contains 'best_fit'"),
        ("model=llama-3.1-405b", "llama-3.1-405b does not fit"),
        ("executor=real", "model=opt-13b: executor=real runs a real model and this machine has "
                          "weights for smollm2-135m only; give a local Hugging Face folder"),
    ],
)
def test_bad_config_exits_nonzero_with_one_clear_line(override, expected, tmp_path):
    done = run_kvbench(*SMALL_RUN, override, f"hydra.run.dir={tmp_path / 'bad'}")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert expected in lines[0]
    assert not (tmp_path / "bad" / "summary.parquet").exists()


def test_unknown_catalog_entry_names_the_choices():
    done = run_kvbench("model=gpt-5")
    assert done.returncode != 0
    assert "gpt-5" in done.stderr
    assert "llama-2-70b" in done.stderr  # Hydra lists the available options


def test_trace_workload_replays_a_file(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "120,40\n" * 12)
    out = tmp_path / "run"
    done = run_kvbench(
        "workload=trace", f"workload.path={trace}", "workload.arrival=poisson",
        "workload.request_rate=4", "model=opt-13b", "hardware=a100-40gb", "allocators=[paged]",
        "progress=false", f"hydra.run.dir={out}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = pd.read_parquet(out / "summary.parquet")
    assert summary["num_finished"].tolist() == [12]


def test_malformed_trace_gives_one_line_naming_file_and_row(tmp_path):
    trace = tmp_path / "broken.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n120,40\n7,-2\n")
    done = run_kvbench(
        "workload=trace", f"workload.path={trace}", "model=opt-13b", "hardware=a100-40gb",
        "progress=false", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "broken.csv: line 3" in lines[0]


@pytest.mark.parametrize("kind", ["missing file", "directory"])
def test_a_trace_that_is_not_a_file_is_one_line_and_exit_4(tmp_path, kind):
    path = tmp_path / "nowhere.csv" if kind == "missing file" else tmp_path
    done = run_kvbench("workload=trace", f"workload.path={path}", *SMALL_RUN[4:],
                       f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert done.returncode == 4, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvbench: file error:"), done.stderr
    assert str(path) in lines[0]
    fix = ("expected an existing file (workload.path=FILE)" if kind == "missing file"
           else "Is a directory; expected a file, not a folder")  # fmt: skip
    assert lines[0].endswith(fix)
