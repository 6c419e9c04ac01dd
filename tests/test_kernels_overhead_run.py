"""``experiment=kernel_overhead`` end to end on the CPU (torch backend), small; its checks."""

from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.config import ConfigError
from kvbench.tables.parquet import read_metadata
from kvbench.tasks.kernel_overhead.run import run_kernel_overhead
from kvbench.tasks.kernel_overhead.table import KERNEL_COLUMNS

METRICS_DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
SMALL = (
    "experiment=kernel_overhead",
    "kernel_bench.block_sizes=[8,32]",
    "kernel_bench.context_lens=[100,256]",
    "kernel_bench.batch_size=3",
    "kernel_bench.repeats=1",
    "kernel_bench.warmup_steps=50",
    "workload.num_requests=150",
    "progress=false",
)


def test_small_run_writes_the_table_the_plot_and_provenance(tmp_path):
    cfg, deployment, raw = compose_config(*SMALL)
    run_kernel_overhead(cfg, deployment, raw, tmp_path)
    table = pd.read_parquet(tmp_path / "kernels.parquet")
    assert list(table.columns) == list(KERNEL_COLUMNS)
    assert sorted(zip(table["block_size"], table["context_len"], strict=True)) == [
        (8, 100), (8, 256), (32, 100), (32, 256)
    ]  # fmt: skip
    assert (table["batch_size"] == 3).all()
    assert set(table["device"]) == {"cpu"} and set(table["backend"]) == {"torch"}
    assert (table[["paged_ms", "contiguous_ms", "achieved_gb_per_s"]] > 0).all().all()
    expected = 100 * (table["paged_ms"] / table["contiguous_ms"] - 1)
    assert table["overhead_pct"].to_numpy() == pytest.approx(expected.to_numpy())
    assert [path.name for path in (tmp_path / "plots").iterdir()] == ["kernel_overhead.png"]
    assert "kernel_bench" in read_metadata(tmp_path / "kernels.parquet")["config_yaml"]


def test_plots_false_draws_no_chart(tmp_path):
    cfg, deployment, raw = compose_config(*SMALL, "kernel_bench.block_sizes=[8]",
                                          "kernel_bench.context_lens=[100]", "plots=false")
    run_kernel_overhead(cfg, deployment, raw, tmp_path)
    assert (tmp_path / "kernels.parquet").is_file() and not (tmp_path / "plots").exists()


def test_every_kernels_column_is_documented():
    section = METRICS_DOC.split("## kernels.parquet", 1)[1]
    assert all(f"`{column}`" in section for column in KERNEL_COLUMNS)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("kernel_bench.block_sizes=[24]", "kernel_bench.block_sizes contains 24"),
        ("kernel_bench.context_lens=[0]", "kernel_bench.context_lens contains 0"),
        ("kernel_bench.batch_size=0", "kernel_bench.batch_size=0: must be >= 1"),
        ("kernel_bench.dtype=fp8", "kernel_bench.dtype='fp8'"),
    ],
)
def test_bad_kernel_bench_values_give_one_line(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[")) as error:
        compose_config("experiment=kernel_overhead", override)
    assert "\n" not in str(error.value)
