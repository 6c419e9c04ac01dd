"""How often an experiment writes its tables: the summary after every run, the large steps and
requests tables once in a short experiment, and rewrites in a long one spaced by their cost."""

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.tables import parquet as parquet_module
from kvbench.tasks.simulate import experiment

OVERRIDES = ("model=opt-13b", "hardware=a100-40gb", "workload=sharegpt",
             "workload.num_requests=60", "request_rates=[3,6]",
             "allocators=[paged,naive_pow2]", "progress=false", "plots=false")  # fmt: skip


def _written_tables(tmp_path, monkeypatch):
    """Run the 4-run experiment; the file names write_table wrote, in order."""
    written = []
    write_table = parquet_module.write_table

    def counting_write_table(frame, path, metadata):
        written.append(path.name)
        return write_table(frame, path, metadata)

    monkeypatch.setattr(experiment, "write_table", counting_write_table)
    cfg, deployment, raw = compose_config(*OVERRIDES)
    experiment.run_experiment(cfg, deployment, raw, tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert steps.groupby(["allocator", "request_rate"]).ngroups == 4  # complete at the end
    return written


def test_a_short_experiment_writes_steps_and_requests_once(tmp_path, monkeypatch):
    written = _written_tables(tmp_path, monkeypatch)
    assert written.count("summary.parquet") == 4  # after every run: what an interruption keeps
    assert written.count("steps.parquet") == written.count("requests.parquet") == 1


@pytest.mark.parametrize(("cost_multiple", "num_writes"), [(0.0, 4), (1e9, 2)])
def test_rewrites_wait_for_the_interval_and_for_their_cost(
    tmp_path, monkeypatch, cost_multiple, num_writes
):
    monkeypatch.setattr(experiment, "TABLES_EVERY_S", 0.0)  # every run is past the interval
    monkeypatch.setattr(experiment, "TABLES_COST_MULTIPLE", cost_multiple)
    written = _written_tables(tmp_path, monkeypatch)
    # Free rewrites: before each of runs 2-4, then the final write. Costly ones: the first
    # rewrite's cost puts the next past the end, leaving only the final write.
    assert written.count("steps.parquet") == written.count("requests.parquet") == num_writes
