"""``python -m kvbench.tools.bench`` runs and its figures hold together (not a timing test)."""

import json
import subprocess
import sys

import pandas as pd
from referee_support import peer

from kvbench.tools.bench import V1_ALLOCATORS, main


def test_bench_streams_a_small_resampled_run(tmp_path, capsys):
    assert main(["--case", "sharegpt_1m", "--num-requests", "400", "--out", str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["num_requests"] == figures["num_finished"] == 400
    assert figures["fast_requests_per_s"] > 0 and figures["peak_rss_mib"] > 0
    steps = pd.read_parquet(tmp_path / "sharegpt_1m" / "steps.parquet")
    requests = pd.read_parquet(tmp_path / "sharegpt_1m" / "requests.parquet")
    assert len(steps) == figures["num_steps"] == figures["steps_parquet_rows"]
    assert steps["step"].tolist() == list(range(len(steps)))
    assert len(requests) == 400 and (requests["status"] == "finished").all()
    assert json.loads((tmp_path / "bench.json").read_text())[0]["case"] == "sharegpt_1m"


def test_bench_names_a_missing_trace(tmp_path, capsys):
    assert main(["--case", "azure", "--azure-trace", str(tmp_path / "nope.csv")]) == 2
    assert "--azure-trace" in capsys.readouterr().err


def test_a_case_that_fails_in_its_process_is_one_line_not_a_hang(tmp_path):
    # The child raised (a rate of 0) and the parent used to wait on its queue forever: run in
    # a process of its own, so that a hang fails the test (TimeoutExpired) instead of the suite.
    done = subprocess.run([sys.executable, "-m", "kvbench.tools.bench", "--case", "sharegpt_1m",
                           "--num-requests", "10", "--request-rate", "0", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("kvbench.tools.bench: case sharegpt_1m failed: ConfigError: "
                           "workload.request_rate=0.0 is invalid")
    assert not (tmp_path / "bench.json").exists()  # nothing measured, nothing written


def _azure_like_trace(tmp_path):
    """40 requests a second apart in the Azure trace's format."""
    trace = tmp_path / "azure_like.csv"
    rows = [f"2023-11-16 18:15:{second:02d}.0,{100 + 37 * second},{20 + 11 * second}"
            for second in range(40)]  # fmt: skip
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return trace


def test_bench_times_the_whole_command_against_its_engine(tmp_path, capsys):
    trace = _azure_like_trace(tmp_path)
    out = tmp_path / "bench"
    assert main(["--case", "command", "--azure-trace", str(trace), "--out", str(out),
                 "--repeats", "1"]) == 0  # fmt: skip
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["case"] == "command" and "experiment=sharegpt_70b" in figures["command"]
    summary = pd.read_parquet(out / "command" / "summary.parquet")
    assert summary["request_rate"].tolist() == [2.0, 5.0, 10.0, 20.0]
    assert summary["allocator"].unique().tolist() == ["paged"]
    assert figures["engine_s"] == summary["simulation_wall_s"].sum()
    assert 0 < figures["start_s"] < figures["import_cli_s"] < figures["whole_s"]
    assert figures["ratio"] == figures["whole_s"] / (figures["engine_s"] + figures["start_s"])
    assert figures["num_requests"] == 40 and figures["ratios"] == [round(figures["ratio"], 3)]


def test_bench_times_vllm_v1s_fast_path_against_its_reference(tmp_path, capsys):
    trace = _azure_like_trace(tmp_path)
    assert main(["--case", "azure_v1", "--azure-trace", str(trace), "--out", str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["case"] == "azure_v1" and figures["num_requests"] == 40
    runs = figures["runs"]
    assert [run["allocator"] for run in runs] == list(V1_ALLOCATORS)
    for run in runs:
        assert run["identical_steps"] and run["identical_requests"] and run["num_steps"] > 40
        assert run["speedup"] == run["reference_engine_s"] / run["fast_engine_s"]


def test_bench_refuses_zero_repeats(capsys):
    assert main(["--case", "sharegpt_1m", "--repeats", "0"]) == 2
    assert "--repeats 0" in capsys.readouterr().err


@peer
def test_bench_compares_vllm_v1_with_the_referee(tmp_path, capsys):
    assert main(["--case", "v1_referee", "--v1-requests", "60", "--out", str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["case"] == "v1_referee" and figures["num_requests"] == 60
    assert figures["identical_steps"] == figures["num_steps"] == figures["referee_steps"]
    assert figures["speedup"] == figures["referee_s"] / figures["kvbench_s"]
