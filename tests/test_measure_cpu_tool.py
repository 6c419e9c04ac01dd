"""python -m kvbench.tools.measure_cpu: the figures it measures become a hardware entry that a
run takes from outside the package (hydra.searchpath)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kvbench.core.catalog import hardware_spec_from
from kvbench.core.packaged_conf import read_option
from kvbench.tools import measure_cpu

SMALL = ["--matmul-size", "64", "--buffer-mib", "1", "--repeats", "1", "--threads", "1"]


def test_the_entry_holds_the_figures_it_names():
    figures = {"peak_tflops": 0.0123, "read_gb_per_s": 4.56, "copy_gb_per_s": 7.89,
               "memory_gib": 23.4}  # fmt: skip
    text = measure_cpu.hardware_yaml("here", figures, "Some CPU", "python -m ...")
    spec = hardware_spec_from(yaml.safe_load(text))
    assert (spec.name, spec.peak_tflops, spec.hbm_bandwidth_gb_per_s, spec.pcie_gb_per_s,
            spec.memory_gib) == ("here", 0.0123, 4.56, 7.89, 23.4)  # fmt: skip
    assert text.startswith("# Some CPU")
    shipped, written = read_option("hardware", "cpu"), yaml.safe_load(text)
    for key in ("num_gpus", "kv_cache_gib", "price_per_gpu_hour"):  # not measured: cpu's
        assert written[key] == shipped[key], key


def test_the_measured_rates_are_the_work_over_the_time(monkeypatch):
    monkeypatch.setattr(measure_cpu, "median_s", lambda call, repeats: 0.5)
    assert measure_cpu.matmul_tflops(100, 1) == pytest.approx(2 * 100**3 / 0.5 / 1e12)
    assert measure_cpu.read_gb_per_s(1 << 20, 1) == pytest.approx((1 << 20) / 0.5 / 1e9)
    assert measure_cpu.copy_gb_per_s(1 << 20, 1) == pytest.approx(2 * (1 << 20) / 0.5 / 1e9)


def test_a_run_takes_the_written_entry(tmp_path):
    assert measure_cpu.main([*SMALL, "--name", "this_cpu", "--output-dir", str(tmp_path)]) == 0
    entry = yaml.safe_load((tmp_path / "hardware" / "this_cpu.yaml").read_text())
    assert entry["peak_tflops"] > 0 and entry["hbm_bandwidth_gb_per_s"] > 0
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", f"hydra.searchpath=[file://{tmp_path}]",
         "hardware=this_cpu", "model=smollm2-135m", "workload=fixed", "workload.num_requests=5",
         "allocators=[paged]", "plots=false", "progress=false", "summary_table=false",
         f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = yaml.safe_load((tmp_path / "run" / ".hydra" / "config.yaml").read_text())
    assert resolved["hardware"]["peak_tflops"] == entry["peak_tflops"]
