"""``python -m kvbench.tools.profile_repeatability RUN RUN [RUN ...]``: how well a profile of
this machine repeats.

Two or more ``task=profile`` runs of the same grid, made one after another on one machine, time
the same shapes. Each run is held against the others: at every iteration point, the median of
the other runs' ``measured_s`` is the reference, and the table gives, per run, the median and
the 75th percentile of |its price / reference - 1| (how far the profile it fitted prices the
points from the other runs' times: what a user of it meets on this machine), the median
|measured / reference - 1| (how far its own measurements were), and the median of measured /
reference (its level: a run timed on a slower spell of the machine reads above 1). A run folder
is a ``task=profile`` output folder (its ``profile.parquet``; the profile file beside it gives
the fit, spread and wall time, where there is one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from kvbench.tools.profile_ratio import SHAPE_COLUMNS, read_profile_table


def iteration_times(table: pd.DataFrame) -> pd.DataFrame:
    """``measured_s`` and ``predicted_s`` of ``table``'s iteration points, indexed by shape;
    ValueError (one line) for a table with a shape twice."""
    points = table[table["kind"] == "iteration"].set_index(SHAPE_COLUMNS)
    if points.index.has_duplicates:
        raise ValueError("a profile table with a point twice: not one grid's")
    return points[["measured_s", "predicted_s"]]


def repeatability_table(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per run of ``tables`` (name -> ``profile.parquet`` rows), the leave-one-out figures of
    the module docstring (%, and the level as a ratio), over the iteration points every run
    timed. ValueError (one line) for fewer than two runs, or runs with no point in common."""
    if len(tables) < 2:
        raise ValueError("give two or more task=profile runs of the same grid")
    times = {name: iteration_times(table) for name, table in tables.items()}
    measured = pd.DataFrame({name: points["measured_s"] for name, points in times.items()})
    measured = measured.dropna()
    if measured.empty:
        raise ValueError("the runs time no iteration point in common: not the same grid")
    rows = {}
    for name, points in times.items():
        reference_s = measured.drop(columns=name).median(axis=1)  # [num_points]
        priced = points["predicted_s"].loc[reference_s.index] / reference_s
        timed = points["measured_s"].loc[reference_s.index] / reference_s
        rows[name] = {
            "num_points": len(reference_s),
            "price_error_pct": 100 * (priced - 1).abs().median(),
            "price_error_p75_pct": 100 * (priced - 1).abs().quantile(0.75),
            "measured_error_pct": 100 * (timed - 1).abs().median(),
            "measured_level": timed.median(),
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def run_name(run: str | Path) -> str:
    """A run's name in the table: its folder's (the folder of a ``profile.parquet`` given)."""
    run = Path(run)
    return run.parent.name if run.suffix == ".parquet" else run.name


def profile_facts(run: str | Path) -> dict[str, float]:
    """The fit's median |error| (%), the median spread (%) and the wall time (s) the profile file
    in the run folder ``run`` records; empty where there is no such file."""
    run = Path(run)
    folder = run.parent if run.suffix == ".parquet" else run
    files = sorted(folder.glob("profile_*.json"))
    if not files:
        return {}
    document = json.loads(files[0].read_text())
    fit = document.get("fit", {})
    return {"fit_error_pct": fit.get("median_abs_pct_error", float("nan")),
            "spread_pct": 100 * fit.get("median_spread", float("nan")),
            "wall_s": document.get("profile_wall_s", float("nan"))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="task=profile run folders (or profile.parquet)")
    args = parser.parse_args(argv)
    try:
        tables = {run_name(run): read_profile_table(run) for run in args.runs}
        if len(tables) < len(args.runs):
            raise ValueError("two runs of the same folder name: give distinct run folders")
        table = repeatability_table(tables)
    except ValueError as error:
        print(f"profile_repeatability: {error}", file=sys.stderr)
        return 2
    facts = pd.DataFrame.from_dict({run_name(run): profile_facts(run) for run in args.runs},
                                   orient="index")  # fmt: skip
    print("each run against the median of the others' measured times, per iteration point: "
          "|price / it - 1| (median, p75), |measured / it - 1| (median), measured / it (median)")
    print(table.join(facts).to_string(float_format="{:.3g}".format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
