"""kvbench works from a plain (non-editable) wheel install, run from another directory."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def test_editable_install_runs_from_another_directory(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "workload=fixed", "workload.num_requests=5",
         "model=opt-13b", "hardware=a100-40gb", "allocators=[paged]", "progress=false",
         f"hydra.run.dir={tmp_path / 'out'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(pd.read_parquet(tmp_path / "out" / "summary.parquet")) == 1


def test_wheel_install_runs_from_another_directory(tmp_path):
    wheel_dir = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheel_dir), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheel_dir.glob("kvbench-*.whl")
    # The venv sees the already installed dependencies but gets its own, non-editable kvbench.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
         str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(python), "-c", "import kvbench, kvbench.kernels; print(kvbench.__file__)"],
        cwd=elsewhere, capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    assert str(env_dir) in where, f"kvbench imported from {where}, not the wheel"
    done = subprocess.run(
        [str(python), "-m", "kvbench", "workload=fixed", "workload.num_requests=5",
         "model=opt-13b", "hardware=a100-40gb", "allocators=[paged,naive_max]", "progress=false",
         "hydra.run.dir=out"],
        cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = pd.read_parquet(elsewhere / "out" / "summary.parquet")
    assert sorted(summary["allocator"]) == ["naive_max", "paged"]


def test_no_top_level_kernels_module_is_installed():
    # `kernels` is a Hugging Face package that transformers probes for: kvbench must not shadow it.
    import importlib.util

    import kvbench.kernels

    spec = importlib.util.find_spec("kernels")
    assert spec is None or "kvbench" not in (spec.origin or "")
    assert kvbench.kernels.__name__ == "kvbench.kernels"
