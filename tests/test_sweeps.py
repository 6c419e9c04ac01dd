"""Sweeps at scale: Hydra multirun jobs in parallel, skipped when done, never half-written."""

import importlib.util
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from kvbench.tables.done_marker import DONE_NAME, MAX_JOB_DIR_CHARS, job_dir_name

SMALL = (
    "workload=fixed", "workload.num_requests=30", "workload.prompt_tokens=100",
    "workload.output_tokens=47", "model=opt-13b", "hardware=a100-40gb", "progress=false",
    "plots=false", "allocators=[naive_max,paged]",
)  # fmt: skip
RATES = "workload.request_rate=1,4"


def kvbench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kvbench", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def _job_dirs(sweep_dir):
    return sorted(path.parent for path in sweep_dir.rglob("summary.parquet"))


def test_job_dir_names_stay_short_and_unique():
    assert job_dir_name("a=1,b=2") == "a=1,b=2"
    long_a, long_b = "x=" + "1" * 300, "x=" + "1" * 299 + "2"
    assert len(job_dir_name(long_a)) <= MAX_JOB_DIR_CHARS
    assert job_dir_name(long_a) != job_dir_name(long_b)
    assert "/" not in job_dir_name("workload.path=/data/" + "t" * 200)


def test_joblib_sweep_runs_two_jobs_in_parallel_and_a_rerun_skips_them(tmp_path):
    sweep = ("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
             f"hydra.sweep.dir={tmp_path}", *SMALL, RATES)  # fmt: skip
    first = kvbench(*sweep)
    assert first.returncode == 0, first.stderr
    jobs = _job_dirs(tmp_path)
    assert len(jobs) == 2 and all("workload.request_rate=" in job.name for job in jobs)
    rates = [pd.read_parquet(job / "summary.parquet")["request_rate"].unique().tolist()
             for job in jobs]  # fmt: skip
    assert sorted(rates) == [[1.0], [4.0]]  # each job wrote its own table
    assert all((job / DONE_NAME).exists() for job in jobs)
    written = {job: (job / "summary.parquet").stat().st_mtime_ns for job in jobs}

    again = kvbench(*sweep)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("is complete (DONE, same config): skipped") == 2
    assert {job: (job / "summary.parquet").stat().st_mtime_ns for job in jobs} == written


def test_a_changed_config_in_the_same_folder_runs_again(tmp_path):
    out = f"hydra.run.dir={tmp_path}"
    assert kvbench(*SMALL, out).returncode == 0
    changed = kvbench(*SMALL, out, "workload.output_tokens=48")
    assert changed.returncode == 0 and "skipped" not in changed.stdout
    assert set(pd.read_parquet(tmp_path / "requests.parquet")["output_tokens"]) == {48}


def test_a_killed_run_leaves_readable_tables_no_done_and_reruns(tmp_path):
    # Long enough to be killed between two of its tables: 600 requests x 5 allocators.
    args = ("workload=sharegpt", "workload.num_requests=600", "model=opt-13b",
            "hardware=a100-40gb", "hardware.kv_cache_gib=12", "hardware.gpu_memory_utilization=1",
            "progress=false", "plots=false",
            f"hydra.run.dir={tmp_path}")  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "kvbench", *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "summary.parquet").exists() and process.poll() is None:
            assert time.monotonic() < deadline, "no summary.parquet within 2 minutes"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (tmp_path / DONE_NAME).exists()
    for table in tmp_path.glob("*.parquet"):
        assert len(pd.read_parquet(table)) > 0  # whole files only: written aside, then renamed
    rerun = kvbench(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert (tmp_path / DONE_NAME).exists()
    assert len(pd.read_parquet(tmp_path / "summary.parquet")) == 5


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None,
                    reason="hydra-ray-launcher is not installed (pip install 'kvbench[ray]')")
def test_ray_sweep_runs_two_jobs_on_a_local_ray_instance(tmp_path):
    # ray_local starts a Ray instance bound to 127.0.0.1 for the sweep; it ends with the sweep.
    started = time.perf_counter()
    sweep = ("-m", "hydra/launcher=ray_local", "hydra.launcher.ray.init.num_cpus=2",
             f"hydra.sweep.dir={tmp_path}", *SMALL, RATES)  # fmt: skip
    done = kvbench(*sweep, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = _job_dirs(tmp_path)
    assert len(jobs) == 2 and all((job / DONE_NAME).exists() for job in jobs)
    written = {job: (job / "summary.parquet").stat().st_mtime_ns for job in jobs}
    again = kvbench(*sweep, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {job: (job / "summary.parquet").stat().st_mtime_ns for job in jobs} == written
    print(f"ray sweep: 2 jobs, then a skipping re-run, in {time.perf_counter() - started:.1f} s")


@pytest.mark.parametrize(
    ("launcher", "plugin"),
    [("joblib_local", "hydra_plugins.hydra_joblib_launcher"),
     ("ray_local", "hydra_plugins.hydra_ray_launcher"),
     ("ray_cluster", "hydra_plugins.hydra_ray_launcher"),
     ("slurm", "hydra_plugins.hydra_submitit_launcher")],
)  # fmt: skip
def test_launcher_configs_compose(launcher, plugin):
    if importlib.util.find_spec(plugin) is None:
        pytest.skip(f"{plugin} is not installed")
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="kvbench.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"],
                      return_hydra_config=True)  # fmt: skip
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")
