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
    """Run the 4-run experiment; the names of the files it wrote, in order."""
    written = []
    for name in ("write_table", "write_frames"):
        monkeypatch.setattr(experiment, name, _counting(getattr(parquet_module, name), written))
    cfg, deployment, raw = compose_config(*OVERRIDES)
    experiment.run_experiment(cfg, deployment, raw, tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert steps.groupby(["allocator", "request_rate"]).ngroups == 4  # complete at the end
    return written


def _counting(write, written):
    def counting_write(table, path, *rest):
        written.append(path.name)
        return write(table, path, *rest)

    return counting_write


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


def test_write_frames_stacks_them_as_concat_would(tmp_path):
    first = pd.DataFrame({"step": [0, 1], "rate": [None, None], "gpus": [4, 4],
                          "allocator": ["paged", "paged"], "time_s": [0.0, 0.5]})
    second = pd.DataFrame({"step": [0, 1, 2], "rate": [2.0, 2.0, 2.0], "gpus": [4.5, 4, 4],
                           "allocator": ["naive_max"] * 3, "time_s": [0.0, 0.25, float("nan")]})
    frames = [first, second, first.iloc[:0]]  # an empty run too
    parquet_module.write_frames(frames, tmp_path / "stacked.parquet", {"git_commit": "abc"})
    parquet_module.write_table(pd.concat(frames, ignore_index=True), tmp_path / "concat.parquet",
                               {"git_commit": "abc"})  # fmt: skip
    stacked = pd.read_parquet(tmp_path / "stacked.parquet")
    pd.testing.assert_frame_equal(stacked, pd.read_parquet(tmp_path / "concat.parquet"))
    assert stacked["rate"].isna().sum() == 2 and stacked["gpus"].dtype == "float64"
    assert parquet_module.read_metadata(tmp_path / "stacked.parquet") == {"git_commit": "abc"}


def test_write_frames_constants_are_the_columns_assign_would_add(tmp_path):
    first = pd.DataFrame({"step": [0, 1], "time_s": [0.0, 0.5]})
    second = pd.DataFrame({"step": [0, 1, 2], "time_s": [0.0, 0.25, 0.75]})
    labels = [{"allocator": "paged", "request_rate": None, "num_gpus": 4},
              {"allocator": "naive_max", "request_rate": 2.0, "num_gpus": 4}]  # fmt: skip
    parquet_module.write_frames([first, second], tmp_path / "labelled.parquet", {}, labels)
    assigned = [frame.assign(**columns) for frame, columns in zip([first, second], labels,
                                                                  strict=True)]  # fmt: skip
    parquet_module.write_table(pd.concat(assigned, ignore_index=True), tmp_path / "concat.parquet",
                               {})  # fmt: skip
    labelled = pd.read_parquet(tmp_path / "labelled.parquet")
    pd.testing.assert_frame_equal(labelled, pd.read_parquet(tmp_path / "concat.parquet"))
    assert list(labelled["allocator"]) == ["paged"] * 2 + ["naive_max"] * 3
