"""GPU check of kvbench's kernels: correctness, paged vs contiguous timing, copy bandwidth.

    python3 kernels/gpu_check.py                      # on the GPU machine, < 5 minutes on an H200
    TRITON_INTERPRET=1 python3 kernels/gpu_check.py --cpu-dry-run --out /tmp/dry.json

Needs only torch and triton: this folder is loaded by file path as the package ``kvbench_kernels``
(no kvbench install, no hydra). It (1) compares the compiled Triton kernels with the float64
reference over every storage dtype (and fp8 K/V under fp16 and bf16 queries, on a GPU whose
Triton reads e4m3), block sizes 8-256, ragged contexts, GQA/MQA/MHA and split contexts, checks
paged == contiguous bit for bit, and the K/V write and block copy kernels against torch's, bit
for bit in fp16 and fp8; (2) measures a device copy's bandwidth; (3) times paged vs contiguous
decode attention (``triton.testing.do_bench`` medians, L2 flushed between calls) on scattered
block tables over context lengths, batch sizes and block sizes;
(4) writes everything, with the targets (achieved >= 80 % of the copy's bandwidth; overhead
<= 3 % at block 16 for contexts >= 1k), to ``kernels/baselines/<gpu>.json`` (``--out``; ``<gpu>``
the GPU's model, ``gpu_stem``: ``h100``, ``h200``), and a copy to ``$OUT/<gpu>.json`` when
``$OUT`` is set. Exit 1 if any correctness check fails; the
timing targets are reported, not enforced. Reading it: ``docs/kernels.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

KERNELS_DIR = Path(__file__).resolve().parent
# Llama-3-8B's attention (32 query heads, 8 KV heads of dim 128), the kernel_overhead experiment's.
MODEL_HEADS = (32, 8, 128)
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
# The interpreter truncates fp32 -> bf16 (a GPU rounds to nearest): twice the error.
INTERPRETER_UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7}
# The targets read rows of at least 256 MiB of K/V (64K tokens of Llama-3-8B's bf16 K/V per
# layer): ~60 us at 4.8 TB/s, long enough that a call's host time is not what is timed.
TARGET_MIN_KV_MIB = 256
# fp8 K/V's (k_scale, v_scale): powers of two, so an e4m3 value times its scale is exact in fp16
# and bf16 and the dequantized K/V are what the reference reads.
FP8_SCALES = (0.5, 0.25)
TIME_BUDGET_S = 240.0  # benchmark rows past this are skipped, so the check ends within 5 minutes
# (--time-budget-s: kernels/gpu_session.sh gives it what its one device call has left)


def load_kernels():
    """The kernels folder as package ``kvbench_kernels`` (its modules import each other
    relatively and nothing else from kvbench)."""
    spec = importlib.util.spec_from_file_location(
        "kvbench_kernels", KERNELS_DIR / "__init__.py",
        submodule_search_locations=[str(KERNELS_DIR)],
    )  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvbench_kernels"] = module
    spec.loader.exec_module(module)
    return module


def correctness_cases(dry_run: bool) -> list[dict]:
    """(dtype, block size, lengths, heads, splits) cases: small on the CPU, model-sized on a GPU."""
    if dry_run:
        return [
            {"dtype": dtype, "block_size": block_size, "lens": [1, 45, 70], "heads": (4, 2, 32),
             "num_splits": num_splits}
            for dtype in (torch.float32, torch.float16, torch.bfloat16)
            for block_size, num_splits in ((8, None), (16, 3))
        ]  # fmt: skip
    cases = [
        {"dtype": dtype, "block_size": block_size, "lens": [1, 17, 1000, 4097, 8191],
         "heads": MODEL_HEADS, "num_splits": None}
        for dtype in (torch.float32, torch.float16, torch.bfloat16)
        for block_size in (8, 16, 32, 64, 128, 256)
    ]  # fmt: skip
    for heads in ((8, 1, 128), (16, 16, 64), (12, 4, 80)):  # MQA, MHA, head dim off a power of two
        cases.append({"dtype": torch.bfloat16, "block_size": 16, "lens": [3, 600, 2000],
                      "heads": heads, "num_splits": None})  # fmt: skip
    for num_splits in (1, 3, 16):
        cases.append({"dtype": torch.float16, "block_size": 16, "lens": [5, 900, 3000],
                      "heads": MODEL_HEADS, "num_splits": num_splits})  # fmt: skip
    return cases


def fp8_cases(dry_run: bool) -> list[dict]:
    """Cases of fp8 K/V (e4m3 at power-of-two scales, dequantized on load) under fp16 and bf16
    queries: ``check_attention`` holds them to the query dtype's bound over the dequantized K/V."""
    lens = [1, 45, 70] if dry_run else [1, 17, 1000, 4097, 8191]
    heads = (4, 2, 32) if dry_run else MODEL_HEADS
    return [{"dtype": dtype, "block_size": 16, "lens": lens, "heads": heads, "num_splits": None,
             "kv_scales": FP8_SCALES} for dtype in (torch.float16, torch.bfloat16)]  # fmt: skip


def check_attention(kernels, case: dict, device: str, dry_run: bool) -> dict:
    """One case: errors against float64, within the rounding bound, paged == contiguous."""
    dtype, block_size, lens = case["dtype"], case["block_size"], case["lens"]
    num_q_heads, num_kv_heads, head_dim = case["heads"]
    generator = torch.Generator().manual_seed(block_size)
    tables = kernels.scattered_block_tables(lens, block_size, generator)
    batch = kernels.materialize_batch(
        tables, lens, block_size, num_q_heads, num_kv_heads, head_dim, dtype, device, seed=1
    )
    layout = batch.layout
    key_cache, value_cache, key, value = batch.key_cache, batch.value_cache, batch.key, batch.value
    # One plan for both layouts (the same bound and splits), so they must agree bit for bit.
    plan = {"num_splits": case["num_splits"], "max_context_len": batch.max_context_len}
    k_scale, v_scale = case.get("kv_scales", (1.0, 1.0))
    if "kv_scales" in case:  # fp8 K/V: stored divided by the scales, read back times them
        key_cache, key = ((t.float() / k_scale).to(kernels.FP8_KV_DTYPE) for t in (key_cache, key))
        value_cache, value = ((t.float() / v_scale).to(kernels.FP8_KV_DTYPE)
                              for t in (value_cache, value))  # fmt: skip
        plan.update(k_scale=k_scale, v_scale=v_scale)
    paged = kernels.paged_decode_attention(
        batch.query, key_cache, value_cache, layout.block_tables, layout.context_lens, **plan
    )
    contiguous = kernels.contiguous_decode_attention(
        batch.query, key, value, layout.context_lens, **plan
    )
    # The K/V as the kernels read them, in float64: fp8 dequantized (exactly, at these scales).
    reference = kernels.reference_paged_decode(
        batch.query, key_cache.double() * k_scale, value_cache.double() * v_scale,
        layout.block_tables, layout.context_lens,
    )  # [num_seqs, num_q_heads, head_dim] float64
    error = (paged.double() - reference).abs()
    value_scale = (value.double() * v_scale).abs().max().item()
    if dtype == torch.float32:
        within = bool(error.max() <= 1e-5 * reference.abs().max())
    else:
        roundoff = (INTERPRETER_UNIT_ROUNDOFF if dry_run else UNIT_ROUNDOFF)[dtype]
        bound = roundoff * (value_scale + reference.abs()) + 1e-5 * value_scale
        within = bool((error <= bound).all())
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "kv_dtype": "fp8" if "kv_scales" in case else str(dtype).removeprefix("torch."),
        "block_size": block_size,
        "lens": lens,
        "heads": list(case["heads"]),
        "num_splits": case["num_splits"],
        "max_abs_error": error.max().item(),
        "max_rel_error": (error.max() / reference.abs().max()).item(),
        "within_bound": within,
        "paged_equals_contiguous": bool(torch.equal(paged, contiguous)),
    }


def check_cache_ops(kernels, device: str) -> dict:
    """write_kv and copy_blocks: Triton equals torch, bit for bit, in fp16 and in fp8."""
    generator = torch.Generator(device=device).manual_seed(3)
    key = torch.randn((50, 8, 128), generator=generator, device=device)
    value = torch.randn((50, 8, 128), generator=generator, device=device)
    slots = torch.randperm(40 * 16, device=device)[:50]
    slots[7] = -1  # padding token: skipped
    same = {}
    for dtype in (torch.half, kernels.FP8_KV_DTYPE):
        results = {}
        for backend in ("triton", "torch"):
            caches = [torch.zeros((40, 16, 8, 128), dtype=dtype, device=device) for _ in "kv"]
            kernels.write_kv(key.to(dtype), value.to(dtype), *caches, slots, backend=backend)
            kernels.copy_blocks(*caches, [(1, 30), (5, 2), (39, 0)], backend=backend)
            results[backend] = [cache.view(torch.uint8) for cache in caches]  # the bits
        same[str(dtype).removeprefix("torch.")] = all(
            torch.equal(a, b) for a, b in zip(results["triton"], results["torch"], strict=True)
        )
    return {"write_kv_and_copy_blocks_match_torch": all(same.values()), "by_dtype": same}


def bench_grid(dry_run: bool) -> list[tuple[int, int, int]]:
    """(block size, batch size, context length) rows: at most 256K tokens (1 GiB of bf16 K/V)."""
    if dry_run:
        return [(8, 2, 64), (16, 2, 64), (16, 1, 1024)]
    rows = []
    for block_size in (8, 16, 32, 64, 128, 256):
        for batch_size in (4, 16, 64):
            for context_len in (512, 1024, 2048, 4096, 8192, 16384):
                if batch_size * context_len <= 1 << 18:
                    rows.append((block_size, batch_size, context_len))
    return rows


def bench_row(kernels, row, heads, dtype, device: str, dry_run: bool) -> dict:
    """Time paged vs contiguous on one scattered batch."""
    block_size, batch_size, context_len = row
    lens = [context_len] * batch_size
    generator = torch.Generator().manual_seed(context_len + block_size)
    tables = kernels.scattered_block_tables(lens, block_size, generator)
    batch = kernels.materialize_batch(tables, lens, block_size, *heads, dtype, device, seed=2)
    paged, contiguous = kernels.batch_calls(batch, "triton")
    timing = kernels.time_pair(paged, contiguous, device, repeats=1 if dry_run else 7)
    return {
        "block_size": block_size,
        "batch_size": batch_size,
        "context_len": context_len,
        "paged_ms": timing.paged_ms,
        "contiguous_ms": timing.contiguous_ms,
        "overhead_pct": 100.0 * (timing.paged_ms / timing.contiguous_ms - 1.0),
        "kv_mib": batch.kv_bytes / 2**20,
        "paged_gb_per_s": batch.kv_bytes / (timing.paged_ms * 1e6),
        "contiguous_gb_per_s": batch.kv_bytes / (timing.contiguous_ms * 1e6),
    }


def targets(rows: list[dict], copy_gb_per_s: float) -> dict:
    """The issue's targets, evaluated on the rows with contexts >= 1k tokens and at least
    ``TARGET_MIN_KV_MIB`` of K/V read (smaller reads finish in a few microseconds, under the
    host's per-call launch time that ``do_bench`` also times)."""
    long_rows = [row for row in rows
                 if row["context_len"] >= 1024 and row["kv_mib"] >= TARGET_MIN_KV_MIB]  # fmt: skip
    block16 = [row["overhead_pct"] for row in long_rows if row["block_size"] == 16]
    best = max((row["paged_gb_per_s"] for row in long_rows), default=math.nan)
    return {
        "copy_gb_per_s": copy_gb_per_s,
        "best_paged_gb_per_s_ctx_ge_1k": best,
        "best_fraction_of_copy": best / copy_gb_per_s,
        "achieved_ge_80pct_of_copy": bool(best >= 0.8 * copy_gb_per_s),
        "max_overhead_pct_block16_ctx_ge_1k": max(block16, default=math.nan),
        "overhead_le_3pct_block16_ctx_ge_1k": bool(block16) and max(block16) <= 3.0,
    }


def run(
    dry_run: bool,
    time_budget_s: float = TIME_BUDGET_S,
    save: Callable[[dict], None] = lambda report: None,
) -> dict:
    """Every check and measurement, as one JSON-able report; benchmark rows start until
    ``time_budget_s`` seconds have passed. ``save`` gets the report so far after the correctness
    checks and after every benchmark row, so a run killed by its caller's timeout keeps them."""
    started_s = time.perf_counter()
    if dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu-dry-run needs TRITON_INTERPRET=1 set before python starts")
    if not dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on the GPU machine, or use --cpu-dry-run")
    kernels = load_kernels()
    import triton

    device = "cpu" if dry_run else "cuda"
    cases = correctness_cases(dry_run)
    fp8_problem = kernels.triton_fp8_problem(torch.device(device))
    cases += [] if fp8_problem else fp8_cases(dry_run)
    correctness = [check_attention(kernels, case, device, dry_run) for case in cases]
    cache_ops = check_cache_ops(kernels, device)
    print(f"correctness done in {time.perf_counter() - started_s:.0f} s", flush=True)
    copy_bytes = (1 << 26) if dry_run else (1 << 30)
    copy_gb_per_s = kernels.device_copy_gb_per_s(device, num_bytes=copy_bytes)
    heads, dtype = ((4, 2, 32), torch.float16) if dry_run else (MODEL_HEADS, torch.bfloat16)
    passed = all(c["within_bound"] and c["paged_equals_contiguous"] for c in correctness)
    rows: list[dict] = []
    skipped: list[list] = []
    report = {
        "device": "cpu (dry run, interpreter)" if dry_run else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "heads": list(heads),
        "dtype": str(dtype).removeprefix("torch."),
        "correctness_passed": passed and cache_ops["write_kv_and_copy_blocks_match_torch"],
        "correctness": correctness,
        "cache_ops": cache_ops,
        "fp8_decode_skipped": fp8_problem,
        "rows": rows,
        "skipped_rows_over_time_budget": skipped,
    }
    for row in bench_grid(dry_run):
        save({**report, "targets": targets(rows, copy_gb_per_s),
              "wall_s": time.perf_counter() - started_s})  # fmt: skip
        if time.perf_counter() - started_s > time_budget_s:
            skipped.append(list(row))
            continue
        rows.append(bench_row(kernels, row, heads, dtype, device, dry_run))
        print(json.dumps(rows[-1]), flush=True)
    report.update(targets=targets(rows, copy_gb_per_s), wall_s=time.perf_counter() - started_s)
    save(report)
    return report


def gpu_stem(device_name: str) -> str:
    """A report's file stem for a GPU named as CUDA names it: its model, the name's first word
    with a digit in it ("NVIDIA H100 80GB HBM3" -> ``h100``, "NVIDIA A100-SXM4-80GB" ->
    ``a100``), so that the lent H100s' and H200s' reports sit side by side; else the whole name,
    lower case, its runs of other characters as ``-``."""
    for word in device_name.replace("-", " ").split():
        if any(char.isdigit() for char in word):
            return word.lower()
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "gpu"


def main() -> int:
    """Run the check, write the report (and $OUT/<gpu>.json), exit 1 on a correctness failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="report JSON path (default: "
                        "kernels/baselines/<gpu>.json, named by gpu_stem; a dry run's in the "
                        "temporary folder)")  # fmt: skip
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes, interpreter")
    parser.add_argument("--time-budget-s", type=float, default=TIME_BUDGET_S,
                        help="no benchmark row starts after this many seconds")  # fmt: skip
    args = parser.parse_args()
    if args.cpu_dry_run:  # a dry run's report is no baseline: the temporary folder by default
        default_out = Path(tempfile.gettempdir()) / "gpu_check_cpu_dry_run.json"
    else:
        default_out = KERNELS_DIR / "baselines" / f"{gpu_stem(torch.cuda.get_device_name())}.json"
    out = args.out or default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out]
    if os.environ.get("OUT") and not args.cpu_dry_run:
        paths.append(Path(os.environ["OUT"]) / default_out.name)  # what the device run returns

    def save(report: dict) -> None:
        text = json.dumps(report, indent=2) + "\n"
        for path in paths:
            path.write_text(text)

    report = run(args.cpu_dry_run, args.time_budget_s, save)
    summary = {key: report[key] for key in ("targets", "correctness_passed", "wall_s")}
    print(json.dumps(summary, indent=2))
    return 0 if report["correctness_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
