"""``python -m kvbench.tools.grid_extrapolation RUN``: what pricing past a grid costs.

A profile prices a decode batch larger than its grid's largest by extrapolating its fitted terms
(``steps_beyond_profile_pct`` counts such steps). This measures what that costs on the device
that timed RUN, a ``task=profile`` run folder (or its ``profile.parquet``) whose grid reaches
past N sequences: it refits the profile's terms on RUN's iteration points of decode batches of
at most N (the fit of a grid that stops at N) and prices every point with that fit and with the
fit on all of them. Per decode batch, the median |error| of each: past N, the first is
extrapolated and the second fitted. Both fits see the same minutes of the machine, so their
difference is the extrapolation's, not a drift's.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import PROFILE_TERMS, WAKE_TERMS, iteration_features, wake_features
from kvbench.tasks.profile.fit import fit_terms
from kvbench.tools.profile_ratio import read_profile_table


def row_features(row: pd.Series) -> tuple[float, ...]:
    """What the profile's iteration and wake terms multiply at a ``profile.parquet`` row."""
    num_decode_tokens = int(row["num_decode_tokens"])
    shape = IterationShape(int(row["num_prefill_tokens"]), int(row["prefill_attention_pairs"]),
                           num_decode_tokens, int(row["decode_context_tokens"]),
                           num_prefill_seqs=int(row["num_seqs"]) - num_decode_tokens)  # fmt: skip
    return iteration_features(shape, int(row["block_size"])) + wake_features(row["idle_before_s"])


def refit_predictions(points: pd.DataFrame, fitted: pd.DataFrame) -> np.ndarray:
    """Seconds the profile's terms, fitted on the iteration rows ``fitted``, price each of the
    iteration rows ``points`` at. float [num_points]."""
    terms = (*PROFILE_TERMS, *WAKE_TERMS)
    coefficients = fit_terms([row_features(row) for _, row in fitted.iterrows()],
                             fitted["measured_s"].tolist(), terms)  # fmt: skip
    values = np.array([coefficients[term] for term in terms])  # [num_terms]
    features = np.array([row_features(row) for _, row in points.iterrows()])
    return features @ values  # [num_points, num_terms] @ [num_terms] -> [num_points]


def extrapolation_table(table: pd.DataFrame, fit_max_batch: int) -> pd.DataFrame:
    """Per decode batch of ``table``'s decode-only points (no prefill, no idle wait): their
    number, and the median |error| (%) of the fit on the iteration points of batches up to
    ``fit_max_batch`` (``small_grid_pct``) and of the fit on all (``full_grid_pct``).
    ValueError (one line) when no point's batch is larger or none is within."""
    points = table[table["kind"] == "iteration"].reset_index(drop=True)
    within = points["num_decode_tokens"] <= fit_max_batch
    if within.all() or not within.any():
        batches = sorted(batch for batch in points["num_decode_tokens"].unique() if batch)
        raise ValueError(f"no decode batch {'past' if within.all() else 'up to'} {fit_max_batch} "
                         f"in the table (its batches: {', '.join(map(str, batches))}); profile a "
                         "grid past it (profile_grid.decode_batches) or give another "
                         "--fit-max-batch")  # fmt: skip
    measured_s = points["measured_s"].to_numpy()  # [num_points]
    for column, fitted in (("small_grid_pct", points[within]), ("full_grid_pct", points)):
        predicted_s = refit_predictions(points, fitted)  # [num_points]
        points[column] = np.abs(predicted_s - measured_s) / measured_s * 100
    decode = points[(points["num_prefill_tokens"] == 0) & (points["idle_before_s"] == 0)]
    grouped = decode.groupby("num_decode_tokens")
    return pd.DataFrame({
        "num_points": grouped.size(),
        "small_grid_pct": grouped["small_grid_pct"].median(),
        "full_grid_pct": grouped["full_grid_pct"].median(),
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="task=profile run folder (or its profile.parquet)")
    parser.add_argument("--fit-max-batch", type=int, default=32,
                        help="the largest decode batch of the grid to refit on (default 32: "
                             "the cpu grid's largest until 2026-12-06)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        table = extrapolation_table(read_profile_table(args.run), args.fit_max_batch)
    except ValueError as error:
        print(f"grid_extrapolation: {error}", file=sys.stderr)
        return 2
    print(f"median |error| (%) per decode batch of {args.run}'s decode points: fitted on "
          f"batches up to {args.fit_max_batch} (small_grid_pct: extrapolated past it) and on "
          "every point (full_grid_pct)")  # fmt: skip
    print(table.to_string(float_format="{:.1f}".format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
