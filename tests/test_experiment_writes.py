"""How often an experiment writes its tables: the summary after every run, the large steps and
requests tables once in a short experiment (run by run, published at the end), and rewrites in a
long one spaced by their cost; the run-by-run file is the one ``write_frames`` writes."""

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import compose_config

from kvbench.tables import parquet as parquet_module
from kvbench.tables.parquet_stream import RunsTable
from kvbench.tasks.simulate import experiment

OVERRIDES = ("model=opt-13b", "hardware=a100-40gb", "workload=sharegpt",
             "workload.num_requests=60", "request_rates=[3,6]",
             "allocators=[paged,naive_pow2]", "progress=false", "plots=false")  # fmt: skip


def _written_tables(tmp_path, monkeypatch):
    """Run the 4-run experiment; the names of the files it wrote whole or published run by run
    (``RunsTable``), in order."""
    written = []
    for name in ("write_table", "write_frames"):
        monkeypatch.setattr(experiment, name, _counting(getattr(parquet_module, name), written))
    close = RunsTable.close

    def counting_close(self):
        published = close(self)
        if published:
            written.append(self.path.name)
        return published

    monkeypatch.setattr(RunsTable, "close", counting_close)
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


def _runs():
    first = pd.DataFrame({"step": [0, 1], "time_s": [0.0, 0.5], "batch_size": [1, 2]})
    second = pd.DataFrame({"step": [0, 1, 2], "time_s": [0.0, 0.25, 0.75], "batch_size": [3, 1, 2]})
    labels = [{"allocator": "paged", "request_rate": 1.0}, {"allocator": "naive_max",
                                                            "request_rate": 2.0}]  # fmt: skip
    return [first, second], labels


def test_a_runs_table_is_the_file_write_frames_writes(tmp_path):
    frames, labels = _runs()
    runs_table = RunsTable(tmp_path / "steps.parquet", {"git_commit": "abc"})
    for frame, columns in zip(frames, labels, strict=True):
        runs_table.append(frame, columns)
    assert not (tmp_path / "steps.parquet").exists()  # published by close only
    assert runs_table.close()
    parquet_module.write_frames(frames, tmp_path / "whole.parquet", {"git_commit": "abc"}, labels)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"),
                                  pd.read_parquet(tmp_path / "whole.parquet"))  # fmt: skip
    assert pq.ParquetFile(tmp_path / "steps.parquet").num_row_groups == 2  # one per run
    assert parquet_module.read_metadata(tmp_path / "steps.parquet") == {"git_commit": "abc"}
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_a_run_whose_types_differ_leaves_the_table_to_be_written_whole(tmp_path):
    frames, labels = _runs()
    labels[1]["request_rate"] = None  # a null column after a float one: write_frames promotes it
    runs_table = RunsTable(tmp_path / "steps.parquet", {})
    for frame, columns in zip(frames, labels, strict=True):
        runs_table.append(frame, columns)
    assert not runs_table.close()
    assert not list(tmp_path.iterdir())  # nothing published, no temporary file left


def test_a_failed_run_by_run_write_names_the_table_and_leaves_no_temporary(tmp_path,
                                                                          monkeypatch):
    write_table = pq.ParquetWriter.write_table
    calls = []

    def disk_full_at_the_second_run(self, table, *rest):  # the first run's rows are in the file
        calls.append(table.num_rows)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return write_table(self, table, *rest)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full_at_the_second_run)
    runs_table = RunsTable(tmp_path / "steps.parquet", {})
    frames, labels = _runs()
    for frame, columns in zip(frames, labels, strict=True):
        runs_table.append(frame, columns)
    with pytest.raises(OSError, match="No space left") as error:
        runs_table.close()
    assert error.value.filename == str(tmp_path / "steps.parquet")
    assert calls == [2, 3] and not list(tmp_path.iterdir())


def test_a_failed_write_still_under_way_when_later_runs_come_is_not_lost(tmp_path, monkeypatch):
    # The first run's write fails after the next two runs were handed to the thread: the
    # failure surfaces at close, and no file of the later runs alone is published. (Found by
    # the full-disk test, now and then: a 200-request run published a steps table without its
    # first runs, and exited 0.)
    import threading

    write_table = pq.ParquetWriter.write_table
    later_runs_queued = threading.Event()
    calls = []

    def disk_full_at_the_first_run(self, table, *rest):
        calls.append(table.num_rows)
        if len(calls) == 1:
            assert later_runs_queued.wait(10)
            raise OSError(28, "No space left on device")
        return write_table(self, table, *rest)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full_at_the_first_run)
    runs_table = RunsTable(tmp_path / "steps.parquet", {})
    frames, labels = _runs()
    for frame, columns in zip([*frames, frames[0]], [*labels, labels[0]], strict=True):
        runs_table.append(frame, columns)
    later_runs_queued.set()
    with pytest.raises(OSError, match="No space left") as error:
        runs_table.close()
    assert error.value.filename == str(tmp_path / "steps.parquet")
    assert calls == [2] and not list(tmp_path.iterdir())


def test_an_experiment_whose_runs_differ_in_type_still_writes_every_run(tmp_path, monkeypatch):
    labels = experiment._run_labels

    def mixed_rates(cfg, deployment, workload, allocator, rate):  # an int rate, then a float
        run_labels = labels(cfg, deployment, workload, allocator, rate)
        run_labels["request_rate"] = int(rate) if allocator == "paged" else float(rate)
        return run_labels

    monkeypatch.setattr(experiment, "_run_labels", mixed_rates)
    cfg, deployment, raw = compose_config(*OVERRIDES)
    experiment.run_experiment(cfg, deployment, raw, tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert steps["request_rate"].dtype == "float64"  # promoted, as write_frames does
    assert steps.groupby(["allocator", "request_rate"]).ngroups == 4
