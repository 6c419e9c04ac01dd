"""Rows of ``sim_to_real.parquet`` (one per run and profile) and its per-request pairs.

Errors compare a profiled simulation with the real run of the same requests: per request, the
absolute percentage error of E2E latency, TTFT and TPOT (medians over requests finished in both);
per run, the signed percentage error of output throughput, mean batch and peak KV in use
(docs/metrics.md, ``sim_to_real.parquet``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.records import SimulationResult
from kvbench.tasks.profile.grid import RANGE_FEATURES, range_bounds, steps_beyond

LATENCIES = (("e2e", "e2e_latency_s"), ("ttft", "ttft_s"), ("tpot", "tpot_s"))
# What names one run of a table: its slice, rate and allocator.
RUN_KEYS = ("workload", "request_rate", "allocator")


def request_pairs(measured: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Requests finished in both runs, with measured and predicted latencies side by side."""
    columns = ["request_id", *(column for _, column in LATENCIES)]
    both = measured.loc[measured["status"] == "finished", columns].merge(
        predicted.loc[predicted["status"] == "finished", columns], on="request_id",
        suffixes=("_measured", "_predicted"),
    )  # fmt: skip
    return both


def peak_kv_in_use_slots(result: SimulationResult) -> int:
    """The most slots held at once (token states + reservation + internal fragmentation)."""
    columns = result.steps.columns
    held = (np.asarray(columns["token_states_slots"]) + np.asarray(columns["reservation_slots"])
            + np.asarray(columns["internal_frag_slots"]))  # fmt: skip
    return int(held.max()) if held.size else 0


def error_row(pairs: pd.DataFrame, measured: dict[str, float],
              predicted: dict[str, float]) -> dict[str, float]:  # fmt: skip
    """The run's errors: median |%| per request of each latency, signed % of the run figures."""
    row: dict[str, float] = {"num_compared": len(pairs)}
    for name, column in LATENCIES:
        truth = pairs[f"{column}_measured"]
        guess = pairs[f"{column}_predicted"]
        valid = truth > 0
        errors = (guess[valid] - truth[valid]).abs() / truth[valid] * 100
        row[f"{name}_mape_pct"] = float(errors.median()) if len(errors) else float("nan")
    for name in ("output_token_throughput", "mean_batch_size", "peak_kv_in_use_slots"):
        row[f"measured_{name}"] = measured[name]
        row[f"predicted_{name}"] = predicted[name]
        row[f"{name}_error_pct"] = (
            (predicted[name] - measured[name]) / measured[name] * 100
            if measured[name] else float("nan")
        )
    return row


def drift_lines(steps: pd.DataFrame) -> list[str]:
    """The machine's drift as the grid profile sees it: per stretch of the run in time order
    (each grid part, each replay, each repeat of the second pass), the median of measured /
    grid-fitted step time."""
    ratio = steps["duration_s"] / steps["grid_fitted_s"]
    replay = (steps["workload"] + " @ " + steps["request_rate"].map("{:g}".format) + " req/s"
              + np.where(steps["phase"] == "repeat", " (repeat)", ""))  # fmt: skip
    stretch = np.where(steps["phase"] == "grid", "grid part " + steps["grid_part"].astype(str),
                       replay)  # fmt: skip
    frame = pd.DataFrame({"stretch": stretch, "ratio": ratio,
                          "minute": (steps["unix_time_s"] - steps["unix_time_s"].min()) / 60})
    grouped = frame.groupby("stretch", sort=False).agg(ratio=("ratio", "median"),
                                                        minute=("minute", "min"))  # fmt: skip
    return [f"- {name} (from minute {row.minute:.1f}): measured / grid-fitted step time, median "
            f"{row.ratio:.3f}" for name, row in grouped.iterrows()]  # fmt: skip


# A replay and its repeat are each cut into this many stretches of equal grid-priced time, so
# that stretch k of both covers about the same steps of the same requests; a stretch of a
# 45-second replay lasts 4-5 s, shorter than the slow spells seen on a shared machine (5-20 s).
NUM_SPLIT_STRETCHES = 10


def stretch_ratios(run: pd.DataFrame, num_stretches: int = NUM_SPLIT_STRETCHES) -> pd.DataFrame:
    """One run's steps (in time order) cut into ``num_stretches`` stretches of equal grid-priced
    time: per stretch its ``priced_s`` (grid-fitted seconds) and ``ratio`` (measured over
    priced)."""
    priced_s = run["grid_fitted_s"].to_numpy()
    priced_before = (np.cumsum(priced_s) - priced_s) / priced_s.sum()
    # The 1e-9 keeps a step that starts exactly on a boundary (up to rounding) in the next one.
    stretch = np.minimum((priced_before * num_stretches + 1e-9).astype(int), num_stretches - 1)
    grouped = run.groupby(stretch)
    priced = grouped["grid_fitted_s"].sum()
    return pd.DataFrame({"priced_s": priced, "ratio": grouped["duration_s"].sum() / priced})


def shared_ratios(first: pd.Series, second: pd.Series) -> pd.Series:
    """Per stretch both runs have, what their ratios to the price agree on: the one nearer 1
    when both lie on the same side of 1, else 1. Noise that slows one run in a stretch and not
    the other is left out; a price both runs miss alike is kept (as the one nearer 1)."""
    first, second = first.align(second, join="inner")
    nearer = first.where((first - 1).abs() <= (second - 1).abs(), second)
    return nearer.where((first - 1) * (second - 1) > 0, 1.0)


def repeat_split(steps: pd.DataFrame,
                 num_stretches: int = NUM_SPLIT_STRETCHES) -> pd.DataFrame:  # fmt: skip
    """Per replay that has a repeat in ``steps`` (a ``real_steps`` or ``vllm_steps`` table), how
    far its steps ran over the grid profile's price (``replay_over_price_pct``: measured over
    grid-fitted seconds, less 1, in %), how far its repeat's did, and how much of that both
    show in the same stretches (``shared_over_price_pct``, ``shared_ratios`` weighted by the
    replay's priced time): a miss of the profile shows in both serves of the same requests, a
    slow spell of the machine in one. ``replay_alone_pct`` is the rest, the replay's own."""
    keys = [key for key in RUN_KEYS if key in steps]
    ordered = steps.sort_values("unix_time_s")
    repeats = dict(iter(ordered[ordered["phase"] == "repeat"].groupby(keys, sort=False)))
    rows = []
    for key, replay in ordered[ordered["phase"] == "replay"].groupby(keys, sort=False):
        if key not in repeats:
            continue
        first = stretch_ratios(replay, num_stretches)
        shared = shared_ratios(first["ratio"], stretch_ratios(repeats[key], num_stretches)["ratio"])
        weights = first["priced_s"].loc[shared.index]
        shared_pct = float((shared * weights).sum() / weights.sum() - 1) * 100
        replay_pct = _over_price_pct(replay)
        rows.append({**dict(zip(keys, key, strict=True)), "replay_over_price_pct": replay_pct,
                     "repeat_over_price_pct": _over_price_pct(repeats[key]),
                     "shared_over_price_pct": shared_pct,
                     "replay_alone_pct": replay_pct - shared_pct})  # fmt: skip
    return pd.DataFrame(rows)


def _over_price_pct(run: pd.DataFrame) -> float:
    return float(run["duration_s"].sum() / run["grid_fitted_s"].sum() - 1) * 100


def repeat_split_lines(split: pd.DataFrame) -> list[str]:
    """A ``repeat_split`` table as report lines, one per replay."""
    lines = []
    for row in split.to_dict("records"):
        name = f"{row['workload']} @ {row['request_rate']:g} req/s"
        if "allocator" in row:
            name += f", {row['allocator']}"
        lines.append(f"- {name}: steps {row['replay_over_price_pct']:+.1f} % over the grid's "
                     f"price, its repeat's {row['repeat_over_price_pct']:+.1f} %; both serves "
                     f"alike, stretch by stretch, {row['shared_over_price_pct']:+.1f} % (where "
                     f"a miss of the profile shows), this serve alone "
                     f"{row['replay_alone_pct']:+.1f} %")
    return lines


def pass_order_lines(split: pd.DataFrame) -> list[str]:
    """Whether one pass ran slower than the other over ``repeat_split`` rows (of one run or of
    many): in how many pairs the first pass's steps ran further over the grid's price than its
    repeat's (two-sided sign test, ties left out) with both medians, and per allocator the median
    of the replays' own shares. A pass colder by design (its pools touched for the first time,
    say) would lean these one way under its allocator; slow spells of the machine, which fall in
    either pass, would not. No lines without rows."""
    if split.empty:
        return []
    first_further, ties, p_value = _sign_test(split["repeat_over_price_pct"],
                                              split["replay_over_price_pct"])  # fmt: skip
    lines = [f"- the first pass's steps ran further over the price than the repeat's in "
             f"{first_further} of {len(split)} pairs" + (f" ({ties} tied)" if ties else "")
             + f" (sign test p {p_value:.2g}; medians "
             f"{split['replay_over_price_pct'].median():+.1f} and "
             f"{split['repeat_over_price_pct'].median():+.1f} %)"]  # fmt: skip
    if "allocator" in split:
        own = split.groupby("allocator", sort=False)["replay_alone_pct"].agg(
            median_pct="median", num_replays="count")  # fmt: skip
        lines.append("- the replays' own share, median per allocator: " + ", ".join(
            f"`{row.Index}` {row.median_pct:+.1f} % ({row.num_replays} replays)"
            for row in own.itertuples()))  # fmt: skip
    return lines


def repeat_split_sections(lines: list[str]) -> list[str]:
    """``repeat_split_lines``' lines as a run's ``report.md`` section; none without them."""
    return ["## Each replay against its repeat\n\n" + "\n".join(lines)] if lines else []


def repeat_pairs(table: pd.DataFrame, repeat_source: str, run_keys: Sequence[str] = RUN_KEYS,
                 cluster_keys: Sequence[str] = ()) -> pd.DataFrame:  # fmt: skip
    """Per predictor (every source but the repeat), over its held-out rows paired with the
    ``repeat_source`` row of the same ``run_keys`` (the same run served again): ``num_pairs``,
    ``num_nearer`` (its E2E error below the repeat's), ``num_ties``, ``sign_test_p`` (two-sided,
    ties left out), both E2E medians and their ratio, and both medians of the TTFT and TPOT errors
    over the same rows. Empty without pairs.

    The pairs are not independent trials: a run's repeats are all served in its second pass, so
    one drift of the machine between the passes moves all of them alike. With ``cluster_keys``
    (e.g. ``run_dir``: whole runs), the same comparison over clusters, each its pairs' medians:
    ``num_clusters``, ``num_clusters_nearer``, ``num_clusters_tied`` and
    ``clusters_sign_test_p``."""
    columns = [f"{name}_mape_pct" for name, _ in LATENCIES]
    repeat = table[table["source"] == repeat_source].set_index(list(run_keys))[columns]
    held_out = table[(table["source"] != repeat_source) & table["held_out"]]
    rows = []
    for source, predicted in held_out.groupby("source", sort=False):
        both = pd.merge(predicted.set_index(list(run_keys))[columns], repeat, how="inner",
                        left_index=True, right_index=True, suffixes=("", "_repeat"))  # fmt: skip
        both = both.dropna(subset=["e2e_mape_pct", "e2e_mape_pct_repeat"])
        if both.empty:
            continue
        profile, again = both["e2e_mape_pct"], both["e2e_mape_pct_repeat"]
        nearer, ties, p = _sign_test(profile, again)
        row = {"source": source, "num_pairs": len(both), "num_nearer": nearer, "num_ties": ties,
               "sign_test_p": p, "median_profile_pct": profile.median(),
               "median_repeat_pct": again.median()}  # fmt: skip
        if cluster_keys:
            clusters = both.groupby(list(cluster_keys))[["e2e_mape_pct",
                                                         "e2e_mape_pct_repeat"]].median()
            nearer, ties, p = _sign_test(clusters["e2e_mape_pct"],
                                         clusters["e2e_mape_pct_repeat"])  # fmt: skip
            row.update(num_clusters=len(clusters), num_clusters_nearer=nearer,
                       num_clusters_tied=ties, clusters_sign_test_p=p)  # fmt: skip
        for name, _ in LATENCIES[1:]:  # TTFT, TPOT
            row[f"median_{name}_pct"] = both[f"{name}_mape_pct"].median()
            row[f"median_{name}_repeat_pct"] = both[f"{name}_mape_pct_repeat"].median()
        rows.append(row)
    pairs = pd.DataFrame(rows)
    if not pairs.empty:
        pairs["median_ratio"] = pairs["median_profile_pct"] / pairs["median_repeat_pct"]
    return pairs


def _sign_test(errors: pd.Series, repeat_errors: pd.Series) -> tuple[int, int, float]:
    """How many of ``errors`` lie below ``repeat_errors`` (paired), how many tie, and the
    two-sided sign test's p (ties left out; NaN when all tie)."""
    nearer, ties = int((errors < repeat_errors).sum()), int((errors == repeat_errors).sum())
    untied = len(errors) - ties
    return nearer, ties, binomtest(nearer, untied).pvalue if untied else float("nan")


def floor_lines(table: pd.DataFrame, repeat_source: str) -> list[str]:
    """Per profile, over the runs it held out: in how many its E2E error was below the engine's
    own repeat's (``repeat_pairs``), with both medians. Empty without repeat rows."""
    return [f"- {row.source}: nearer the measured run than the repeat in {row.num_nearer} of "
            f"{row.num_pairs} held-out runs (median E2E error {row.median_profile_pct:.1f} % "
            f"against the repeat's {row.median_repeat_pct:.1f} %)"
            for row in repeat_pairs(table, repeat_source).itertuples()]  # fmt: skip


def extrapolated_steps_pct(shapes: list[IterationShape],
                           fitted_shapes: list[IterationShape] | None) -> float:  # fmt: skip
    """Percent of ``shapes`` (a run's steps) beyond the largest of ``fitted_shapes`` (the steps a
    profile was fitted on) in any of ``RANGE_FEATURES``: steps its prices extrapolate to. NaN
    when the fitted steps are unknown (a ``task=profile`` file, a repeat) or the run has none."""
    if fitted_shapes is None or not shapes:
        return float("nan")
    columns = {name: [getattr(shape, name) for shape in shapes] for name in RANGE_FEATURES}
    return float(steps_beyond(columns, range_bounds(fitted_shapes)).mean() * 100)


def extrapolation_column(table: pd.DataFrame, run_shapes: Mapping[Hashable, list[IterationShape]],
                         fitted_shapes: Mapping[str, list[IterationShape]], run_keys: Sequence[str],
                         fitted_by: str) -> list[float]:  # fmt: skip
    """Per row of ``table``: ``extrapolated_steps_pct`` of its run's steps (``run_shapes`` keyed
    by the row's ``run_keys`` columns) against the steps its ``fitted_by`` column names in
    ``fitted_shapes`` (NaN for a name not there)."""
    return [extrapolated_steps_pct(run_shapes[tuple(getattr(row, key) for key in run_keys)],
                                   fitted_shapes.get(getattr(row, fitted_by)))
            for row in table.itertuples()]  # fmt: skip
