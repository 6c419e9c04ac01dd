"""kernels/gpu_check.py's correctness half, on the CPU under Triton's interpreter (its dry run):
what a lent GPU runs first, fp8 K/V included."""

import importlib.util
from pathlib import Path

import pytest

GPU_CHECK = Path(__file__).resolve().parents[1] / "kernels" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_checks_every_dtype_and_fp8_k_v_and_passes(gpu_check):
    report = gpu_check.run(dry_run=True, time_budget_s=0.0)  # no timed rows: correctness only
    assert report["correctness_passed"] and report["fp8_decode_skipped"] is None
    cases = {(case["dtype"], case["kv_dtype"]) for case in report["correctness"]}
    assert {("float16", "fp8"), ("bfloat16", "fp8"), ("float32", "float32")} <= cases
    for case in report["correctness"]:
        assert case["within_bound"] and case["paged_equals_contiguous"], case
        assert 0 < case["max_rel_error"] < 0.01, case  # the kernels computed something
    assert report["cache_ops"]["by_dtype"] == {"float16": True, "float8_e4m3fn": True}
    assert report["rows"] == [] and len(report["skipped_rows_over_time_budget"]) == 3


@pytest.mark.parametrize(("device_name", "stem"), [
    ("NVIDIA H100 80GB HBM3", "h100"),  # torch.cuda.get_device_name() on the lent kinds
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA L40S", "l40s"),
    ("Some Accelerator", "some-accelerator"),  # no model number: the whole name
])  # fmt: skip
def test_the_report_is_named_by_the_gpu_s_model(gpu_check, device_name, stem):
    assert gpu_check.gpu_stem(device_name) == stem
