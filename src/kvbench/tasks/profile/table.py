"""Rows of ``profile.parquet``: every timed point, its shape, measured and fitted seconds."""

from __future__ import annotations

import pandas as pd

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import ProfiledCostModel

PROFILE_COLUMNS = (
    "kind", "block_size", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
    "prefill_attention_pairs", "decode_context_tokens", "idle_before_s", "swap_tokens",
    "measured_s",
    "spread", "predicted_s", "abs_pct_error",
)  # fmt: skip


def iteration_row(shape: IterationShape, block_size: int, idle_before_s: float,
                  measured_s: float, spread: float, model: ProfiledCostModel
                  ) -> dict[str, object]:  # fmt: skip
    """One timed iteration's row (after an idle wait of ``idle_before_s``), priced by the
    fitted ``model``."""
    predicted_s = model.iteration_time_s(shape) + model.wake_time_s(idle_before_s)
    return {
        "kind": "iteration", "block_size": block_size,
        "num_seqs": shape.num_decode_tokens + shape.num_prefill_seqs,
        "num_prefill_tokens": shape.num_prefill_tokens,
        "num_decode_tokens": shape.num_decode_tokens,
        "prefill_attention_pairs": shape.prefill_attention_pairs,
        "decode_context_tokens": shape.decode_context_tokens,
        "idle_before_s": idle_before_s, "swap_tokens": 0,
        "measured_s": measured_s, "spread": spread, "predicted_s": predicted_s,
        "abs_pct_error": abs(predicted_s - measured_s) / measured_s * 100,
    }  # fmt: skip


def swap_row(num_tokens: int, block_size: int, measured_s: float, spread: float,
             model: ProfiledCostModel) -> dict[str, object]:  # fmt: skip
    """One timed swap's row (one direction), priced by the fitted ``model``."""
    predicted_s = model.swap_time_s(num_tokens)
    return {
        "kind": "swap", "block_size": block_size, "num_seqs": 1, "num_prefill_tokens": 0,
        "num_decode_tokens": 0, "prefill_attention_pairs": 0, "decode_context_tokens": 0,
        "idle_before_s": 0.0, "swap_tokens": num_tokens, "measured_s": measured_s, "spread": spread,
        "predicted_s": predicted_s,
        "abs_pct_error": abs(predicted_s - measured_s) / measured_s * 100,
    }  # fmt: skip


def profile_frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    """The table, in ``PROFILE_COLUMNS`` order."""
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))
