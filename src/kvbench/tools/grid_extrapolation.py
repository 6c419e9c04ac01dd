"""``python -m kvbench.tools.grid_extrapolation RUN``: what pricing past a grid costs.

A profile prices a decode batch, or a prefill, larger than its grid's largest by extrapolating
its fitted terms (``steps_beyond_profile_pct`` counts such steps). This measures what that costs
on the device that timed RUN, a ``task=profile`` run folder (or its ``profile.parquet``) whose
grid reaches past N in ``--feature`` (decode batch, ``num_decode_tokens``, or prefill tokens,
``num_prefill_tokens``): it refits the profile's terms on RUN's iteration points of at most N
(the fit of a grid that stops at N) and prices every point with that fit and with the fit on
all of them. Per value of the feature over the points that exercise it alone (decode-only or
prefill-only, no idle wait), the median |error| of each: past N, the first is extrapolated and
the second fitted. Both fits see the same minutes of the machine, so their difference is the
extrapolation's, not a drift's.
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


def refit_predictions(features: np.ndarray, measured_s: np.ndarray,
                      fitted: np.ndarray) -> np.ndarray:  # fmt: skip
    """Seconds the profile's terms, fitted on the points ``fitted`` marks, price every point at.
    features: [num_points, num_terms] (``row_features``); measured_s, fitted: [num_points];
    returns [num_points]."""
    terms = (*PROFILE_TERMS, *WAKE_TERMS)
    coefficients = fit_terms(features[fitted], measured_s[fitted], terms)
    return features @ np.array([coefficients[term] for term in terms])


# The features a grid is extended in: each with the points that exercise it alone.
FEATURES = ("num_decode_tokens", "num_prefill_tokens")


def extrapolation_table(table: pd.DataFrame, feature: str, fit_max: int) -> pd.DataFrame:
    """Per value of ``feature`` (one of ``FEATURES``) over ``table``'s points that exercise it
    alone (decode-only or prefill-only, no idle wait): their number, and the median |error| (%)
    of the fit on the iteration points of at most ``fit_max`` of it (``small_grid_pct``) and of
    the fit on all (``full_grid_pct``). ValueError (one line) when no point is larger, or none
    within."""
    points = table[table["kind"] == "iteration"].reset_index(drop=True)
    within = points[feature] <= fit_max
    # A point of 0 of it (a prefill, for decode batches) does not exercise it: a fit on those
    # alone would price every decode batch by extrapolation.
    if within.all() or not (within & (points[feature] > 0)).any():
        values = sorted(value for value in points[feature].unique() if value)
        raise ValueError(f"no {feature} {'past' if within.all() else 'up to'} {fit_max} in the "
                         f"table (its values: {', '.join(map(str, values))}); profile a grid "
                         "past it (profile_grid.decode_batches, profile_grid.prefill_prompts) "
                         "or give another --fit-max")  # fmt: skip
    features = np.array([row_features(row) for _, row in points.iterrows()])
    measured_s = points["measured_s"].to_numpy()  # [num_points]
    everywhere = np.ones(len(points), dtype=bool)
    for column, fitted in (("small_grid_pct", within.to_numpy()), ("full_grid_pct", everywhere)):
        predicted_s = refit_predictions(features, measured_s, fitted)  # [num_points]
        points[column] = np.abs(predicted_s - measured_s) / measured_s * 100
    other = "num_prefill_tokens" if feature == "num_decode_tokens" else "num_decode_tokens"
    alone = points[(points[other] == 0) & (points[feature] > 0) & (points["idle_before_s"] == 0)]
    grouped = alone.groupby(feature)
    return pd.DataFrame({
        "num_points": grouped.size(),
        "small_grid_pct": grouped["small_grid_pct"].median(),
        "full_grid_pct": grouped["full_grid_pct"].median(),
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="task=profile run folder (or its profile.parquet)")
    parser.add_argument("--feature", choices=FEATURES, default="num_decode_tokens",
                        help="what the grid is extended in: decode batch (default) or prefill "
                             "tokens")  # fmt: skip
    parser.add_argument("--fit-max", type=int, default=32,
                        help="the largest value of it to refit on (default 32: the cpu grid's "
                             "largest decode batch until 2026-12-06; its largest prefill is "
                             "512 tokens)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        table = extrapolation_table(read_profile_table(args.run), args.feature, args.fit_max)
    except ValueError as error:
        print(f"grid_extrapolation: {error}", file=sys.stderr)
        return 2
    print(f"median |error| (%) per {args.feature} of {args.run}'s points: fitted on points of "
          f"at most {args.fit_max} (small_grid_pct: extrapolated past it) and on every point "
          "(full_grid_pct)")  # fmt: skip
    print(table.to_string(float_format="{:.1f}".format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
