"""``python -m kvbench.tools.stair_refit RUN RUN [RUN ...]``: what a stair for every count buys.

A profile prices the matmul library's kernel choice by rows with a stair per token count
(``engine.profiled.STAIR_TOKENS``), fitted where the grid has points of that count. This
measures, on two or more ``task=profile`` runs of one grid made on one machine, what the stairs
and batches of an older setting (``--stairs``, ``--batches``: by default the model and cpu grid
before 2026-12-07, stairs at 2-8 and 16 and no decode batch of 5, 7 or 9-15) cost against
today's. Each run is refitted twice:

- ``fewer``: only the stairs of ``--stairs`` (the others 0), on its iteration points whose decode
  batch is one of ``--batches`` (prefills, which decode nothing, kept): the older profile;
- ``every``: every term on every point: today's.

Each fit prices every point, held against the median of the other runs' measured times (as
``profile_repeatability`` does), so that a run's own noise is not fitted and scored alike;
scaled to the run's level (the median over the points of its measured time over that median),
since a machine that ran a whole run slower shifts every price alike, which no stair removes.
Per decode batch of at most 16 sequences (decode-only points, no idle wait): the median signed
error of each fit, % (above 0: priced dearer than the others took). And per fit, over every
iteration point: the median |error|, and the mean over those batches of the size of their median
error (what is left of a count's own cost when its points' noise is taken out by the median).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from kvbench.engine.profiled import PROFILE_TERMS, STAIR_TERMS, STAIR_TOKENS, WAKE_TERMS
from kvbench.tasks.profile.fit import fit_terms
from kvbench.tools.grid_extrapolation import row_features
from kvbench.tools.profile_ratio import read_profile_table
from kvbench.tools.profile_repeatability import iteration_times, run_name

TERMS = (*PROFILE_TERMS, *WAKE_TERMS)
# The model and cpu grid before every count to 16 had a stair and a decode batch.
OLDER_STAIRS = (2, 3, 4, 5, 6, 7, 8, 16)
OLDER_BATCHES = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256)
# The decode batches the table shows: those the stairs price one by one.
LARGEST_TABLED_BATCH = 16


def refit_prices(points: pd.DataFrame, stairs: tuple[int, ...] | None,
                 batches: tuple[int, ...] | None) -> pd.Series:  # fmt: skip
    """Seconds the profile's terms price each of ``points`` at, fitted on their ``measured_s``:
    with only the stairs of ``stairs`` token counts (None: every stair) on the points whose
    decode batch is in ``batches`` or 0 (None: every point)."""
    rows = points.reset_index()
    features = np.array([row_features(row) for _, row in rows.iterrows()])  # [points, terms]
    kept_terms = [term for term in TERMS if term not in STAIR_TERMS or stairs is None
                  or int(term.split("_")[1]) in stairs]  # fmt: skip
    columns = [TERMS.index(term) for term in kept_terms]
    fitted = np.ones(len(rows), dtype=bool) if batches is None else \
        rows["num_decode_tokens"].isin((0, *batches)).to_numpy()  # fmt: skip
    measured_s = rows["measured_s"].to_numpy()  # [points]
    coefficients = fit_terms(features[fitted][:, columns], measured_s[fitted], kept_terms)
    priced_s = features[:, columns] @ np.array([coefficients[term] for term in kept_terms])
    return pd.Series(priced_s, index=points.index)


def stair_tables(tables: dict[str, pd.DataFrame], stairs: tuple[int, ...],
                 batches: tuple[int, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Per run of ``tables`` (name -> ``profile.parquet`` rows): the per-batch table and the
    summary of the module docstring (columns: run, then fit). ValueError (one line) for fewer
    than two runs, or runs with no point in common."""
    if len(tables) < 2:
        raise ValueError("give two or more task=profile runs of the same grid")
    unpriced = sorted(set(stairs) - set(STAIR_TOKENS))
    if unpriced:  # such a stair has no term: the refit would silently drop it
        raise ValueError(f"--stairs {','.join(map(str, unpriced))}: no stair prices that count; "
                         f"give counts among {STAIR_TOKENS[0]}-{STAIR_TOKENS[-1]}")
    points = {name: iteration_times(table) for name, table in tables.items()}
    measured = pd.DataFrame({name: run["measured_s"] for name, run in points.items()}).dropna()
    if measured.empty:
        raise ValueError("the runs time no iteration point in common: not the same grid")
    shapes = measured.index.to_frame(index=False)
    batch = shapes["num_decode_tokens"]
    timed_batches = sorted(set(batch) - {0})
    if not set(batches) & set(timed_batches):  # the older fit would see prefills only
        raise ValueError(f"--batches {','.join(map(str, batches))}: the runs time none of "
                         f"these decode batches; they time {','.join(map(str, timed_batches))}")
    tabled = ((shapes["num_prefill_tokens"] == 0) & (shapes["idle_before_s"] == 0)
              & batch.between(1, LARGEST_TABLED_BATCH)).to_numpy()  # fmt: skip
    by_batch, summary = {}, {}
    for name, run in points.items():
        others_s = measured.drop(columns=name).median(axis=1)  # [points]
        reference_s = others_s * (measured[name] / others_s).median()  # at the run's level
        for fit, setting in (("fewer", (stairs, batches)), ("every", (None, None))):
            priced_s = refit_prices(run.loc[measured.index], *setting)
            error_pct = 100 * (priced_s / reference_s - 1)  # [points]
            per_batch = error_pct[tabled].groupby(batch[tabled].to_numpy()).median()
            by_batch[name, fit] = per_batch
            summary[name, fit] = {"median_abs_error_pct": error_pct.abs().median(),
                                  "mean_abs_batch_error_pct": per_batch.abs().mean()}  # fmt: skip
    table = pd.DataFrame(by_batch)
    table.index.name = "num_decode_tokens"
    return table, pd.DataFrame(summary)


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(value) for value in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="task=profile run folders (or profile.parquet)")
    parser.add_argument("--stairs", type=_counts, default=OLDER_STAIRS,
                        help="the older setting's stair token counts, comma-separated")
    parser.add_argument("--batches", type=_counts, default=OLDER_BATCHES,
                        help="the older setting's decode batches, comma-separated")
    args = parser.parse_args(argv)
    try:
        tables = {run_name(run): read_profile_table(run) for run in args.runs}
        if len(tables) < len(args.runs):
            raise ValueError("two runs of the same folder name: give distinct run folders")
        by_batch, summary = stair_tables(tables, args.stairs, args.batches)
    except ValueError as error:
        print(f"stair_refit: {error}", file=sys.stderr)
        return 2
    print("each run refitted with fewer stairs and batches and with every one, held against the "
          "median of the others' measured times: median error per decode batch (%)")
    print(by_batch.to_string(float_format="{:+.1f}".format))
    print(summary.to_string(float_format="{:.2f}".format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
