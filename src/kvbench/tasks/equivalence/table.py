"""Rows of ``equivalence.parquet`` and the pass/fail verdict drawn from them."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvbench.tasks.equivalence.cases import Trajectory
from kvbench.tasks.equivalence.compare import has_nan, step_diffs, tokens_equal
from kvbench.tasks.equivalence.names import FP32_REL_TOLERANCE
from kvbench.tasks.equivalence.trajectories import SampleKey

EQUIVALENCE_COLUMNS = (
    "model", "allocator", "backend", "dtype", "kv_dtype", "kv_scales", "prompt_id", "sample",
    "step", "max_abs_diff", "max_rel_diff", "argmax_equal", "tokens_equal", "kl_div",
)  # fmt: skip


def comparison_rows(
    labels: dict[str, str],
    paged: dict[SampleKey, Trajectory],
    stock: dict[SampleKey, Trajectory],
) -> list[dict[str, object]]:
    """One row per (prompt, sample, step); ``labels`` fills model, allocator, backend, dtype,
    kv_dtype and kv_scales.

    A NaN logit makes the step's differences NaN (never a silent 0).
    """
    rows = []
    for (prompt_id, sample), trajectory in sorted(paged.items()):
        reference = stock[(prompt_id, sample)]
        nan = has_nan(trajectory)
        same_tokens = tokens_equal(trajectory, reference)
        for diff in step_diffs(trajectory, reference):
            rows.append({
                **labels, "prompt_id": prompt_id, "sample": sample, "step": diff.step,
                "max_abs_diff": float("nan") if nan else diff.max_abs_diff,
                "max_rel_diff": float("nan") if nan else diff.max_rel_diff,
                "argmax_equal": diff.argmax_equal, "tokens_equal": same_tokens,
                "kl_div": float("nan") if nan else diff.kl_div,
            })  # fmt: skip
    return rows


@dataclass(frozen=True)
class Verdict:
    """Whether one (allocator, backend) matched the stock cache."""

    allocator: str
    backend: str
    max_abs_diff: float
    max_rel_diff: float
    argmax_agreement: float  # fraction of steps with the same greedy token
    tokens_equal: bool  # every continuation identical
    passed: bool
    kv_dtype: str = "fp32"  # the pool's K/V dtype
    mean_kl_div: float = 0.0  # mean over steps of KL(stock || paged), nats
    p99_kl_div: float = 0.0  # its 99th percentile over steps, nats
    max_kl_div: float = 0.0  # its largest step, nats
    kv_scales: str = "unit"  # fp8 scales: unit or calibrated

    def line(self) -> str:
        """One summary line, with the tolerance it was judged by (fp8 K/V differ by design:
        reported, not judged)."""
        if self.kv_dtype == "fp8":
            return (
                f"FP8 ({self.kv_scales} scales) {self.allocator}/{self.backend}: argmax "
                f"agreement {self.argmax_agreement:.1%}, KL per step mean "
                f"{self.mean_kl_div:.3g} / p99 {self.p99_kl_div:.3g} / max "
                f"{self.max_kl_div:.3g} nats, max rel diff {self.max_rel_diff:.3g}; greedy "
                f"continuations {'identical' if self.tokens_equal else 'differ'} (fp8 K/V vs "
                "the stock cache, teacher-forced: reported, not judged)"
            )
        exact = " (bit-identical)" if self.max_abs_diff == 0 else ""
        return (
            f"{'PASS' if self.passed else 'FAIL'} {self.allocator}/{self.backend}: max abs diff "
            f"{self.max_abs_diff:.3g}, max rel diff {self.max_rel_diff:.3g}{exact} (tolerance: "
            f"rel <= {FP32_REL_TOLERANCE:g}); argmax agreement {self.argmax_agreement:.1%}; "
            f"greedy continuations {'identical' if self.tokens_equal else 'DIFFER'}"
        )


def verdicts(table: pd.DataFrame) -> list[Verdict]:
    """A verdict per (allocator, backend): pass iff every step is within the fp32 tolerance
    (NaN fails) and every continuation is identical."""
    result = []
    for (allocator, backend), rows in table.groupby(["allocator", "backend"], sort=False):
        max_rel = float(rows["max_rel_diff"].max(skipna=False))
        same_tokens = bool(rows["tokens_equal"].all())
        kv_dtype = str(rows["kv_dtype"].iloc[0]) if "kv_dtype" in rows else "fp32"
        kl_div = rows["kl_div"] if "kl_div" in rows else pd.Series([0.0])
        result.append(Verdict(
            allocator=str(allocator), backend=str(backend),
            max_abs_diff=float(rows["max_abs_diff"].max(skipna=False)), max_rel_diff=max_rel,
            argmax_agreement=float(rows["argmax_equal"].mean()), tokens_equal=same_tokens,
            passed=bool(max_rel <= FP32_REL_TOLERANCE) and same_tokens,
            kv_dtype=kv_dtype, mean_kl_div=float(kl_div.mean()),
            p99_kl_div=float(kl_div.quantile(0.99)), max_kl_div=float(kl_div.max()),
            kv_scales=str(rows["kv_scales"].iloc[0]) if "kv_scales" in rows else "unit",
        ))  # fmt: skip
    return result
