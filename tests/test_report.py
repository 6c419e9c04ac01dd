"""`python -m kvbench.tasks.report`: aggregates runs (single and grid) into tables, charts and
markdown."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.tasks.report import sections, write_report
from kvbench.tasks.report.docs_blocks import BEGIN, END, block
from kvbench.tasks.simulate.run import run_study

TINY = (
    "workload=fixed", "workload.num_requests=30", "workload.prompt_tokens=200",
    "workload.output_tokens=100", "model=opt-13b", "hardware=a100-40gb",
    "hardware.kv_cache_gib=2", "hardware.gpu_memory_utilization=1.0", "progress=false",
    "plots=false",
)  # fmt: skip


SAMPLING_WORKLOADS = ("alpaca_n2", "alpaca_n4", "alpaca_n6", "sharegpt_n2", "sharegpt_n4",
                      "sharegpt_n6")  # fmt: skip
DOCS = Path(__file__).resolve().parents[1] / "docs" / "reproduction.md"
REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"


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
        "fig15": ("experiment=parallel_sampling", "progress=false", "plots=false",
                  *(f"workloads.{name}.num_requests=20" for name in SAMPLING_WORKLOADS)),
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
    done = subprocess.run([sys.executable, "-m", "kvbench.tasks.report", str(root), "--out",
                           str(tmp_path / "r")], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "summary rows" in done.stdout and (tmp_path / "r" / "reproduction.md").exists()
    missing = subprocess.run([sys.executable, "-m", "kvbench.tasks.report", str(tmp_path / "nope")],
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 2 and "no such folder" in missing.stderr
    (tmp_path / "empty").mkdir()
    command = [sys.executable, "-m", "kvbench.tasks.report", str(tmp_path / "empty"), "--out",
               str(tmp_path / "e")]  # fmt: skip
    empty = subprocess.run(command, capture_output=True, text=True)
    assert empty.returncode == 3 and "no summary.parquet" in empty.stderr


def test_a_damaged_table_is_left_out_with_a_line_and_the_other_runs_reported(results, tmp_path,
                                                                              capsys):
    from kvbench.tasks.report.__main__ import main

    root, _ = results
    damaged = tmp_path / "killed" / "summary.parquet"
    damaged.parent.mkdir()
    damaged.write_bytes((next(root.rglob("summary.parquet"))).read_bytes()[:2000])
    assert main([str(root), str(damaged.parent), "--out", str(tmp_path / "out")]) == 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kvbench.tasks.report: {damaged}: left out, not a readable parquet "
                           "table (")
    assert (tmp_path / "out" / "reproduction.md").is_file()


def test_a_table_without_the_summary_columns_is_one_line(tmp_path, capsys):
    from kvbench.tasks.report.__main__ import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pd.DataFrame({"scheduler": ["vllm_v0"], "allocator": ["paged"], "step": [0]}).to_parquet(
        run_dir / "summary.parquet")  # fmt: skip
    assert main([str(run_dir), "--out", str(tmp_path / "out")]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kvbench.tasks.report: a table under {run_dir} lacks column '")
    assert line.endswith("(not a kvbench table, or another version's); report its folders apart")


def test_an_output_folder_it_cannot_write_is_one_line(results, tmp_path, capsys):
    from kvbench.tasks.report.__main__ import main

    root, _ = results
    (tmp_path / "a-file").write_text("")
    assert main([str(root), "--out", str(tmp_path / "a-file" / "report")]) == 4
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kvbench.tasks.report: {tmp_path / 'a-file'}")
    assert line.endswith("expected a folder it may write: --out DIR")


@pytest.mark.parametrize("docs", ["missing", "folder", "no blocks"])
def test_a_docs_file_it_cannot_refresh_is_refused_before_any_work(results, tmp_path, capsys,
                                                                   docs):
    from kvbench.tasks.report.__main__ import main

    root, _ = results
    path = tmp_path / "doc.md"
    if docs == "folder":
        path.mkdir()
    elif docs == "no blocks":
        path.write_text("# Hand-written only\n")
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out), "--docs", str(path)]) == (3 if docs == "no blocks"
                                                                         else 4)
    (line,) = capsys.readouterr().err.strip().splitlines()
    problem = {"missing": "no such file", "folder": "a folder",
               "no blocks": "holds no generated block"}[docs]  # fmt: skip
    assert line.startswith(f"kvbench.tasks.report: --docs {path}: {problem}")
    assert not out.exists()


def test_a_folder_of_vllm_v1_runs_only_is_told_apart_from_an_empty_one(tmp_path, capsys):
    from kvbench.tasks.report.__main__ import main

    run_dir = tmp_path / "v1" / "run"
    run_dir.mkdir(parents=True)
    pd.DataFrame({"scheduler": ["vllm_v1"], "allocator": ["paged"]}).to_parquet(
        run_dir / "summary.parquet")  # fmt: skip
    assert main([str(tmp_path / "v1"), "--out", str(tmp_path / "out")]) == 3
    assert "all of scheduler=vllm_v1 runs" in capsys.readouterr().err


def test_every_column_the_report_and_the_study_write_is_documented(results, tmp_path):
    from test_metrics_docs import _documented

    root, _ = results
    write_report([root], tmp_path)
    for table in ("results", "knees", "capacity"):
        columns = pd.read_parquet(tmp_path / f"{table}.parquet").columns
        undocumented = [column for column in columns if not _documented(column)]
        assert not undocumented, f"{table}.parquet columns missing from docs/metrics.md"


def test_the_fig15_block_holds_every_sharing_run_next_to_the_paper(results, tmp_path):
    root, _ = results
    write_report([root], tmp_path)
    text = (tmp_path / "reproduction.md").read_text()
    body = _block_body(text, "fig15")
    assert "Not generated yet" not in body
    for trace in ("alpaca", "sharegpt"):
        for n in (2, 4, 6):
            assert f"| parallel sampling, n = {n} | {trace} |" in body
    assert "6.09, 8.53, 9.79" in body and "16.2-30.5 (range)" in body


def _sharing_row(sharing: str, workload: str, width: int, allocator: str, rate: float,
                 saving: float, throughput: float) -> dict:  # fmt: skip
    return {"experiment": sharing, "workload": workload, "model": "opt-13b", "num_gpus": 1,
            "hardware": "a100-40gb", "block_size": 16, "preemption": "recompute",
            "allocator": allocator, "request_rate": rate,
            "n": width if sharing == "parallel_sampling" else 1,
            "beam_width": width if sharing == "beam_search" else 1,
            "memory_saving_pct": saving, "request_throughput": throughput}  # fmt: skip


def test_fig15_reads_the_saving_at_the_trace_rate_and_the_knee_ratio():
    rows = []
    for rate, saving in ((5.0, 30.0), (10.0, 61.5), (20.0, 45.0)):  # read at 10 req/s
        rows.append(_sharing_row("beam_search", "alpaca_k6", 6, "paged", rate, saving, rate))
        rows.append(_sharing_row("beam_search", "alpaca_k6", 6, "naive_oracle", rate, 0.0,
                                 rate / 2))  # fmt: skip
    rows.append(_sharing_row("parallel_sampling", "sharegpt_n4", 4, "paged", 0.5, 21.8, 0.49))
    knees = pd.DataFrame([
        {"experiment": "beam_search", "workload": "alpaca_k6", "block_size": 16,
         "allocator": allocator, "knee_rate": knee, "knee_censored": False, "min_rate": 5.0,
         "knee_ratio": ratio, "knee_ratio_bound": "exact"}
        for allocator, knee, ratio in (("paged", 22.5, 1.0), ("naive_oracle", 8.3, 2.71))
    ])  # fmt: skip
    body = sections.fig15_section(pd.DataFrame(rows), knees)
    assert "| beam search | alpaca @ 10 req/s | k = 6: 61.5 | 55.16 |" in body
    assert "| parallel sampling | sharegpt @ 0.5 req/s | n = 4: 21.8 | 16.2-30.5 (range) |" in body
    assert ("| beam search, k = 6 | alpaca | 61.50 | 10.00 | 5.00 | 2.00 | 22.5 / 8.3 | 2.71x "
            "| 2.3x |") in body  # fmt: skip
    assert sections.fig15_section(pd.DataFrame(rows[-1:]).assign(n=1), knees) == ""


def _prefix_row(allocator: str, slots: int, block: int, hit: float, ideal: float) -> dict:
    return {"experiment": "prefix_caching", "workload": "mooncake", "model": "qwen2.5-72b",
            "hardware": "h100-80gb", "num_gpus": 8, "num_requests": 3000, "allocator": allocator,
            "num_kv_slots": slots, "kv_pool_gb": slots * 327_680 / 1e9, "block_size": block,
            "prefix_hit_rate": hit, "prefix_block_hit_rate": hit, "ideal_prefix_hit_rate": ideal,
            "ideal_prefix_block_hit_rate": ideal, "mean_batch_size": 10.0,
            "request_throughput": 2.0 + hit, "ttft_p50_s": 1.0, "num_preemptions": 0}  # fmt: skip


def test_prefix_caching_shows_hit_rates_by_pool_and_block_next_to_the_ideal():
    rows = [_prefix_row(allocator, slots, block, hit if allocator == "paged_prefix" else 0.0, 0.33)
            for slots, hit in ((81_920, 0.055), (53_687_091, 0.33))
            for block in (16, 256) for allocator in ("paged", "paged_prefix")]  # fmt: skip
    body = sections.prefix_caching_section(pd.DataFrame(rows))
    assert "| 81,920 | 25.0 | 5.5 / 5.5 | 5.5 / 5.5 |" in body
    assert "| ideal (unbounded, same requests) | – | 33.0 / 33.0 | 33.0 / 33.0 |" in body
    assert "| 53,687,091 | 33.00 | 10.00 | 10.00 | 2.00 | 2.33 | 1.17 |" in body
    other = pd.DataFrame(rows).assign(experiment="system_prompt_sharing")
    assert sections.prefix_caching_section(other) == ""


def _block_body(text: str, name: str) -> str:
    match = re.search(re.escape(BEGIN.format(name=name)) + r"\n(.*?)\n"
                      + re.escape(END.format(name=name)), text, flags=re.S)  # fmt: skip
    assert match, f"no generated block {name}"
    return match.group(1)


@pytest.mark.parametrize("name", ["fig15", "prefix_caching"])
def test_the_docs_blocks_are_what_the_report_makes_of_the_reference_results(name):
    """docs/reproduction.md's sharing blocks = the report on the committed reference tables."""
    summary = pd.read_parquet(REFERENCE / "results.parquet")
    knees = pd.read_parquet(REFERENCE / "knees.parquet")
    expected = (sections.fig15_section(summary, knees) if name == "fig15"
                else sections.prefix_caching_section(summary))  # fmt: skip
    assert expected, f"results/reference holds no {name} runs"
    assert _block_body(DOCS.read_text(), name) == expected.strip()


def test_a_run_s_wall_time_is_counted_once_when_experiments_share_its_marker():
    # A capacity run: its sweep and its operating points (experiment <name>_operating) are
    # folders under one DONE marker.
    summary = pd.DataFrame({
        "experiment": ["capacity_cost", "capacity_cost", "capacity_cost_operating", "other"],
        "run_dir": ["cap/a", "cap/b", "cap/operating/x", "other"],
        "run_complete": [True] * 4,
        "simulation_wall_s": [1.0, 2.0, 3.0, 4.0],
    })  # fmt: skip
    marker = ("cap/DONE", 8.9)
    done = {"cap/a": marker, "cap/b": marker, "cap/operating/x": marker,
            "other": ("other/DONE", 5.0)}  # fmt: skip
    body = sections.runs_section(summary, done)
    assert "| capacity_cost | 2 | 2 | yes | 3.0 | 8.9 |" in body
    assert "| capacity_cost_operating | 1 | 1 | yes | 3.0 | in capacity_cost |" in body
    assert "| other | 1 | 1 | yes | 4.0 | 5.0 |" in body
