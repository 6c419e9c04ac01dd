"""kvbench works from a plain (non-editable) wheel install, run from another directory."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

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
    # The wheel goes to a folder of its own, put first on the path: this interpreter's installed
    # dependencies stay visible (in a virtualenv too), but kvbench comes from the wheel, not the
    # editable install.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import kvbench, kvbench.kernels; print(kvbench.__file__)"],
        cwd=elsewhere, capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    assert str(target) in where, f"kvbench imported from {where}, not the wheel"
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "workload=fixed", "workload.num_requests=5",
         "model=opt-13b", "hardware=a100-40gb", "allocators=[paged,naive_max]", "progress=false",
         "hydra.run.dir=out"],
        cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = pd.read_parquet(elsewhere / "out" / "summary.parquet")
    assert sorted(summary["allocator"]) == ["naive_max", "paged"]


KERNELS_PROBE = (
    "import importlib.util, kvbench.kernels; "
    "spec = importlib.util.find_spec('kernels'); "
    "print(kvbench.kernels.__name__, spec.origin if spec else None)"
)


def test_no_top_level_kernels_module_is_installed(tmp_path):
    """`kernels` is a Hugging Face package that transformers probes for: kvbench must not shadow
    it, neither installed (probed from another folder) nor in the test process started from the
    checkout, whatever the checkout's folder is called."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    name, origin = subprocess.run(
        [sys.executable, "-c", KERNELS_PROBE], cwd=tmp_path, capture_output=True, text=True,
        env=env, check=True,
    ).stdout.split()  # fmt: skip
    assert name == "kvbench.kernels"
    assert origin == "None" or not Path(origin).is_relative_to(ROOT), origin
    # conftest keeps the checkout's folder off this process's path (`python -m pytest` puts it
    # there), so the repository's kernels/ is no top-level module here either.
    import importlib.util

    spec = importlib.util.find_spec("kernels")
    assert spec is None or not Path(spec.origin or "").is_relative_to(ROOT)


def test_every_package_of_the_source_ships_in_the_wheel():
    root = Path(__file__).resolve().parents[1]
    setuptools_table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools_table["packages"])
    source = root / "src"
    inits = source.rglob("__init__.py")
    found = {".".join(init.parent.relative_to(source).parts) for init in inits}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_run_from_the_checkout_root_kernels_is_hugging_face_s(tmp_path):
    # transformers and vLLM import Hugging Face's ``kernels`` package; from the repository root,
    # the checkout's kernels/ folder (kvbench.kernels' source) came first on sys.path and broke
    # every model build ("cannot import name 'CUDAProperties' from 'kernels'").
    probe = ("import importlib.metadata as m, kvbench, kernels, kvbench.kernels\n"
             "print(m.distribution('kernels').locate_file('kernels/__init__.py'))\n"
             "print(kernels.__file__, kvbench.kernels.__file__, sep='\\n')")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    if "PackageNotFoundError" in done.stderr:
        pytest.skip("Hugging Face's kernels package is not installed: nothing to hide")
    assert done.returncode == 0, done.stderr[-2000:]
    installed, imported, own = (Path(line) for line in done.stdout.split())
    assert imported.resolve() == installed.resolve()
    assert own.resolve() == ROOT / "kernels" / "__init__.py"


def test_a_checkout_root_on_sys_path_never_hides_an_installed_kernels(tmp_path):
    # The GPU session's case: kvbench installed from a wheel elsewhere, run from a checkout's
    # root (first on sys.path), with another kernels package installed further down.
    checkout, site = tmp_path / "checkout", tmp_path / "site"
    (checkout / "src" / "kvbench").mkdir(parents=True)
    (checkout / "kernels").mkdir()
    (checkout / "kernels" / "__init__.py").write_text("raise ImportError('the checkout')\n")
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHO = 'installed'\n")
    probe = (f"import sys; sys.path[:0] = [{str(checkout)!r}, {str(site)!r}]\n"
             "import kvbench, kernels; print(kernels.WHO)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "installed"
