"""kernels/gpu_check.py's correctness half, on the CPU under Triton's interpreter (its dry run):
what a lent GPU runs first, fp8 K/V included."""

import importlib.util
from pathlib import Path

GPU_CHECK = Path(__file__).resolve().parents[1] / "kernels" / "gpu_check.py"


def test_the_dry_run_checks_every_dtype_and_fp8_k_v_and_passes():
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    report = gpu_check.run(dry_run=True, time_budget_s=0.0)  # no timed rows: correctness only
    assert report["correctness_passed"] and report["fp8_decode_skipped"] is None
    cases = {(case["dtype"], case["kv_dtype"]) for case in report["correctness"]}
    assert {("float16", "fp8"), ("bfloat16", "fp8"), ("float32", "float32")} <= cases
    for case in report["correctness"]:
        assert case["within_bound"] and case["paged_equals_contiguous"], case
        assert 0 < case["max_rel_error"] < 0.01, case  # the kernels computed something
    assert report["cache_ops"]["by_dtype"] == {"float16": True, "float8_e4m3fn": True}
    assert report["rows"] == [] and len(report["skipped_rows_over_time_budget"]) == 3
