"""The analysis notebook runs top to bottom on a small set of results."""

from pathlib import Path

import nbformat
import pytest
from conftest import compose_config
from nbclient import NotebookClient

from kvbench.tasks.simulate.run import run_study

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "kvbench_results.ipynb"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results") / "capacity_run"
    cfg, deployment, raw = compose_config(
        "workload=fixed", "workload.num_requests=30", "workload.prompt_tokens=200",
        "workload.output_tokens=100", "model=opt-13b", "hardware=a100-40gb",
        "hardware.kv_cache_gib=2", "hardware.gpu_memory_utilization=1.0", "progress=false",
        "plots=false", "request_rates=[1,8,32]", "allocators=[naive_max,paged]",
        "capacity.target_request_rate=10",
    )  # fmt: skip
    run_study(cfg, deployment, raw, out)
    return out.parent


def test_notebook_executes_and_shows_the_knees_and_the_fleet(results, monkeypatch):
    monkeypatch.setenv("KVBENCH_RESULTS", str(results))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # fmt: skip
    outputs = [
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    ]
    text = "\n".join(outputs)
    assert "summary rows from" in text
    assert "knee_ratio" in text  # the knees table
    assert "cost_per_hour" in text  # the capacity table
    images = [
        output for cell in notebook.cells if cell.cell_type == "code"
        for output in cell.get("outputs", []) if "image/png" in output.get("data", {})
    ]  # fmt: skip
    assert len(images) == 3  # latency vs rate, breakdown, fleet
