"""Rows of ``equivalence.parquet`` and the pass/fail verdict drawn from them."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvbench.tasks.equivalence.cases import Trajectory
from kvbench.tasks.equivalence.compare import has_nan, step_diffs, tokens_equal
from kvbench.tasks.equivalence.names import FP32_REL_TOLERANCE
from kvbench.tasks.equivalence.trajectories import SampleKey

EQUIVALENCE_COLUMNS = (
    "model", "allocator", "backend", "dtype", "prompt_id", "sample", "step",
    "max_abs_diff", "max_rel_diff", "argmax_equal", "tokens_equal",
)  # fmt: skip


def comparison_rows(
    labels: dict[str, str],
    paged: dict[SampleKey, Trajectory],
    stock: dict[SampleKey, Trajectory],
) -> list[dict[str, object]]:
    """One row per (prompt, sample, step); ``labels`` fills model, allocator, backend, dtype.

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

    def line(self) -> str:
        """One summary line, with the tolerance it was judged by."""
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
        result.append(Verdict(
            allocator=str(allocator), backend=str(backend),
            max_abs_diff=float(rows["max_abs_diff"].max(skipna=False)), max_rel_diff=max_rel,
            argmax_agreement=float(rows["argmax_equal"].mean()), tokens_equal=same_tokens,
            passed=bool(max_rel <= FP32_REL_TOLERANCE) and same_tokens,
        ))  # fmt: skip
    return result
