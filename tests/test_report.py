"""`python -m kvbench.report`: aggregates runs (single and grid) into tables, charts, markdown."""

import subprocess
import sys

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.report import write_report
from kvbench.report.docs_blocks import block
from kvbench.study import run_study

TINY = (
    "workload=fixed", "workload.num_requests=30", "workload.prompt_tokens=200",
    "workload.output_tokens=100", "model=opt-13b", "hardware=a100-40gb",
    "hardware.kv_cache_gib=2", "hardware.gpu_memory_utilization=1.0", "progress=false",
    "plots=false",
)  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    studies = {
        "sweep": (*TINY, "request_rates=[1,8,32]", "allocators=[naive_max,paged]",
                  "capacity.target_request_rate=10"),
        "blocks": (*TINY, "request_rates=[20]", "allocators=[paged]", "block_sizes=[16,64]",
                   "experiment_name=blocks"),
        "preemption": (*TINY, "request_rates=[20]", "allocators=[paged]", "block_sizes=[16,64]",
                       "preemption_modes=[recompute,swap]", "experiment_name=preemption"),
        "fig2": ("experiment=vllm_fig2", "~workloads.alpaca", "workloads.sharegpt.num_requests=60",
                 "allocators=[naive_max,paged]", "progress=false", "plots=false"),
    }  # fmt: skip
    rows = 0
    for name, overrides in studies.items():
        cfg, deployment, raw = compose_config(*overrides)
        rows += len(run_study(cfg, deployment, raw, root / name))
    return root, rows


def test_report_aggregates_every_summary_into_tables_charts_and_markdown(results, tmp_path):
    root, rows = results
    tables = write_report([root], tmp_path)
    operating = tables.summary["experiment"].str.endswith("_operating").sum()
    assert len(tables.summary) == rows + operating  # every row, the capacity measurements too
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == len(tables.summary)
    assert set(pd.read_parquet(tmp_path / "knees.parquet")["allocator"]) == {"naive_max", "paged"}
    assert len(pd.read_parquet(tmp_path / "capacity.parquet")) == 2
    for chart in ("latency_vs_rate_default", "latency_vs_block_size", "recompute_vs_swap",
                  "capacity_cost", "usage_breakdown", "batch_size"):  # fmt: skip
        assert (tmp_path / f"{chart}.png").stat().st_size > 0, chart
    text = (tmp_path / "reproduction.md").read_text()
    for heading in ("## Table 1", "## Fig. 2", "## Fig. 13", "## Fig. 12", "## Fig. 18b",
                    "## Fig. 19", "## Fig. 15", "## Capacity and cost"):  # fmt: skip
        assert heading in text, heading


def test_report_refreshes_only_the_generated_blocks_of_a_doc(results, tmp_path):
    root, _ = results
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Hand-written intro\n\n{block('fig12', 'STALE-BODY')}\n\nHand-written end.\n")
    write_report([root], tmp_path / "out", docs_path=doc)
    text = doc.read_text()
    assert text.startswith("# Hand-written intro") and text.endswith("Hand-written end.\n")
    assert "STALE-BODY" not in text and "## Fig. 12" in text


def test_cli_reports_and_rejects_missing_or_empty_folders(results, tmp_path):
    root, _ = results
    done = subprocess.run([sys.executable, "-m", "kvbench.report", str(root), "--out",
                           str(tmp_path / "r")], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "summary rows" in done.stdout and (tmp_path / "r" / "reproduction.md").exists()
    missing = subprocess.run([sys.executable, "-m", "kvbench.report", str(tmp_path / "nope")],
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 2 and "no such folder" in missing.stderr
    (tmp_path / "empty").mkdir()
    command = [sys.executable, "-m", "kvbench.report", str(tmp_path / "empty"), "--out",
               str(tmp_path / "e")]  # fmt: skip
    empty = subprocess.run(command, capture_output=True, text=True)
    assert empty.returncode == 3 and "no summary.parquet" in empty.stderr


def test_every_column_the_report_and_the_study_write_is_documented(results, tmp_path):
    from test_metrics_docs import _documented

    root, _ = results
    write_report([root], tmp_path)
    for table in ("results", "knees", "capacity"):
        columns = pd.read_parquet(tmp_path / f"{table}.parquet").columns
        undocumented = [column for column in columns if not _documented(column)]
        assert not undocumented, f"{table}.parquet columns missing from docs/metrics.md"
