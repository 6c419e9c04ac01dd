"""``python -m kvbench.tools.profile_ratio BASE OTHER``: what one setting costs, point by point.

Two ``task=profile`` runs over the same grid that differ in one setting (``model.kv_dtype=fp8``
against the model's dtype, another decode backend, another block of threads) time the same
shapes. Their fits each absorb noise differently, so comparing coefficients mixes the setting's
cost with the fits' freedom; this compares the measured times themselves: for every point both
tables hold, OTHER's ``measured_s`` over BASE's, grouped by what the point exercises (decode by
its batch's context tokens, prefill, mixed, wake-up, swap by its tokens), as the median and
quartiles of the ratios. BASE and OTHER are run folders or their ``profile.parquet`` files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from kvbench.tasks.profile.table import PROFILE_COLUMNS

# The columns that name a point's shape: two tables' rows with equal values timed the same work.
SHAPE_COLUMNS = list(PROFILE_COLUMNS[:PROFILE_COLUMNS.index("measured_s")])
# Decode points grouped by their batch's context tokens (the K/V a step reads): upper edges.
CONTEXT_EDGES = (512, 2048, 8192)


def read_profile_table(path: str | Path) -> pd.DataFrame:
    """``profile.parquet`` at ``path`` (or in the run folder ``path``); ValueError (one line)
    when there is none or it lacks the table's columns."""
    path = Path(path)
    file = path / "profile.parquet" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{path}: no profile.parquet; give a `python -m kvbench task=profile` "
                         "run folder or its profile.parquet")  # fmt: skip
    table = pd.read_parquet(file)
    missing = [column for column in (*SHAPE_COLUMNS, "measured_s") if column not in table]
    if missing:
        raise ValueError(f"{file}: not a task=profile table (no column {missing[0]})")
    return table


def point_group(row: pd.Series) -> str:
    """What a ``profile.parquet`` row's point exercises, as its group's label."""
    if row["kind"] == "swap":
        return f"swap {int(row['swap_tokens'])} tokens"
    if row["idle_before_s"] > 0:
        return "wake-up"
    if row["num_prefill_tokens"] > 0:
        return "mixed" if row["num_decode_tokens"] > 0 else "prefill"
    context_tokens = int(row["decode_context_tokens"])
    lower = 0
    for upper in CONTEXT_EDGES:
        if context_tokens <= upper:
            return f"decode, {lower + 1}-{upper} context tokens"
        lower = upper
    return f"decode, > {lower} context tokens"


def ratio_table(base: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Per group (in the order first met), the points both tables timed and the median and
    quartiles of ``other.measured_s / base.measured_s``. ValueError when they share no point."""
    pairs = base.merge(other, on=SHAPE_COLUMNS, suffixes=("_base", "_other"))
    if pairs.empty:
        raise ValueError("the two profiles share no grid point: profile both with the same "
                         "profile_grid")  # fmt: skip
    pairs["group"] = pairs.apply(point_group, axis=1)
    pairs["ratio"] = pairs["measured_s_other"] / pairs["measured_s_base"]
    grouped = pairs.groupby("group", sort=False)["ratio"]
    return pd.DataFrame({
        "num_points": grouped.size(),
        "ratio_p25": grouped.quantile(0.25),
        "ratio_median": grouped.median(),
        "ratio_p75": grouped.quantile(0.75),
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base", help="task=profile run folder (or profile.parquet): the baseline")
    parser.add_argument("other", help="task=profile run folder (or profile.parquet) to compare")
    args = parser.parse_args(argv)
    try:
        base, other = read_profile_table(args.base), read_profile_table(args.other)
        table = ratio_table(base, other)
    except ValueError as error:
        print(f"profile_ratio: {error}", file=sys.stderr)
        return 2
    num_shared = int(table["num_points"].sum())
    print(f"measured time of {args.other} over {args.base}, at the {num_shared} points both "
          f"timed ({len(base)} and {len(other)} in all):")  # fmt: skip
    print(table.to_string(float_format="{:.2f}".format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
