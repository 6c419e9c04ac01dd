"""Every column kvbench writes is defined in docs/metrics.md; tables agree with each other."""

from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.tasks.simulate.experiment import run_experiment

DOCS = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
CATEGORIES = ("token_states", "reservation", "internal_frag", "external_frag", "free", "shared")


def _documented(column: str) -> bool:
    if f"`{column}`" in DOCS:
        return True
    for category in CATEGORIES:  # documented once as `<category>_slots` / `<category>_gb`
        suffix = column.removeprefix(f"{category}_")
        if suffix != column and f"`<category>_{suffix}`" in DOCS:
            return True
    return False


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg, deployment, raw = compose_config(
        "workload=fixed", "workload.num_requests=40", "workload.prompt_tokens=300",
        "workload.output_tokens=200", "model=opt-13b", "hardware=a100-40gb", "progress=false",
    )  # fmt: skip
    run_experiment(cfg, deployment, raw, out)
    return out


@pytest.mark.parametrize("table", ["summary", "steps", "requests"])
def test_every_column_is_documented(run_dir, table):
    columns = pd.read_parquet(run_dir / f"{table}.parquet").columns
    undocumented = [column for column in columns if not _documented(column)]
    assert not undocumented, f"{table}.parquet columns missing from docs/metrics.md"


def test_summary_agrees_with_steps_and_requests(run_dir):
    summary = pd.read_parquet(run_dir / "summary.parquet").set_index("allocator")
    steps = pd.read_parquet(run_dir / "steps.parquet")
    requests = pd.read_parquet(run_dir / "requests.parquet")
    parts = [f"{c}_pct" for c in CATEGORIES if c != "shared"]
    assert summary[parts].sum(axis=1).to_numpy() == pytest.approx(100.0)
    for allocator, row in summary.iterrows():
        own_steps = steps[steps["allocator"] == allocator]
        own_requests = requests[requests["allocator"] == allocator]
        assert row["num_steps"] == len(own_steps)
        assert row["num_finished"] + row["num_rejected"] == row["num_requests"] == 40
        assert row["mean_batch_size"] == pytest.approx(own_steps["batch_size"].mean())
        assert row["normalized_latency_s_per_token"] == pytest.approx(
            (own_requests["e2e_latency_s"] / own_requests["output_tokens"]).mean()
        )
