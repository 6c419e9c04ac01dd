"""engine.stream_tables: the per-run parquet files hold exactly the tables a kept run writes."""

import pandas as pd
from conftest import compose_config

from kvbench.engine import records as records_module
from kvbench.tables.parquet import read_metadata
from kvbench.tasks.simulate.experiment import run_experiment

OVERRIDES = ("model=opt-13b", "hardware=a100-40gb", "workload=sharegpt",
             "workload.num_requests=120", "request_rates=[3,6]",
             "allocators=[paged,naive_pow2]", "progress=false")


def _run(out, *overrides):
    cfg, deployment, raw = compose_config(*OVERRIDES, *overrides)
    return run_experiment(cfg, deployment, raw, out)


def test_streamed_tables_equal_the_kept_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(records_module, "CHUNK_ROWS", 500)  # several chunks per run
    kept = _run(tmp_path / "kept")
    streamed = _run(tmp_path / "streamed", "engine.stream_tables=true")
    columns = [c for c in kept.columns if c != "simulation_wall_s"]
    pd.testing.assert_frame_equal(kept[columns], streamed[columns])
    assert kept["num_steps"].min() > 500  # the streamed runs really came in chunks
    for table in ("steps", "requests"):
        kept_table = pd.read_parquet(tmp_path / "kept" / f"{table}.parquet")
        streamed_table = pd.read_parquet(tmp_path / "streamed" / table)  # run-0000, run-0001...
        pd.testing.assert_frame_equal(kept_table, streamed_table, check_dtype=False)
    assert sorted(p.name for p in (tmp_path / "streamed" / "steps").iterdir()) == [
        f"run-{index:04d}.parquet" for index in range(4)
    ]
    metadata = read_metadata(tmp_path / "streamed" / "steps" / "run-0003.parquet")
    assert "git_commit" in metadata
    assert (tmp_path / "streamed" / "plots" / "memory_over_time.png").is_file()


def test_a_folder_rerun_with_fewer_runs_holds_only_the_new_runs_files(tmp_path):
    out = tmp_path / "run"
    _run(out, "engine.stream_tables=true", "workload.num_requests=20")  # 4 runs
    summary = _run(out, "engine.stream_tables=true", "workload.num_requests=20",
                   "allocators=[paged]", "request_rates=[3]")  # fmt: skip
    assert len(summary) == 1
    for table in ("steps", "requests"):
        assert [p.name for p in (out / table).iterdir()] == ["run-0000.parquet"]
        assert set(pd.read_parquet(out / table)["allocator"]) == {"paged"}
    # Kept tables in the same folder: the streamed files go too.
    _run(out, "workload.num_requests=20", "allocators=[paged]", "request_rates=[3]")
    assert not list((out / "steps").glob("run-*.parquet"))
