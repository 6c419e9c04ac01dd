"""``python -m kvbench.tools.bench`` runs and its figures hold together (not a timing test)."""

import json

import pandas as pd

from kvbench.tools.bench import main


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
