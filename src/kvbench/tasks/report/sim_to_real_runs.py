"""Sim-to-real errors over many runs, each predictor paired with the engine's own repeat.

One run of ``experiment=sim_to_real`` or ``sim_to_vllm`` cannot rank a profile against the
engine's repeat (its second pass, the same requests served again): on a noisy machine the
repeat's error moves from run to run as much as the profiles' do. Over many runs it can. Per
engine (the table a run wrote), this section gives each predictor's median E2E error per slice in
every run, and over all runs' held-out rows paired with the repeat of the same run, slice, rate
and allocator: how often the predictor came nearer the measured run than the repeat did, with a
two-sided sign test (ties left out), and the TTFT and TPOT errors over the same rows. Two noisy
runs lie about sqrt(2) times further apart than either lies from the run to expect, so a
predictor as good as the machine allows is nearer in more than half, and a ratio of medians near
0.7 is that predictor's (docs/sim_to_real.md).

Where runs kept their steps tables, a second section gives each run's replays against their
repeats (``repeat_split``): how much of each replay's miss of the grid's price its repeat showed
alike and how much was its own; and over all their replays, whether one pass ran slower than the
other (``pass_order_lines``).
"""

from __future__ import annotations

import os

import pandas as pd

from kvbench.tasks.report.markdown_table import markdown_table
from kvbench.tasks.sim_to_real.table import (
    RUN_KEYS,
    pass_order_lines,
    repeat_pairs,
    repeat_split,
)

# Each table of per-run errors: (its file, the engine it measured, the source of its repeat).
ENGINE_TABLES = (
    ("sim_to_real.parquet", "kvbench's real executor", "real_repeat"),
    ("sim_to_vllm.parquet", "real vLLM", "vllm_repeat"),
)
# One run of the tables of many: its folder, then the run within it.
RUN_DIR_KEYS = ("run_dir", *RUN_KEYS)
# Each table of every step of a run: (its file, the engine it timed).
STEPS_TABLES = (
    ("real_steps.parquet", "kvbench's real executor"),
    ("vllm_steps.parquet", "real vLLM"),
)
# ``repeat_split``'s figures, each given as its range over a run's replays.
SPLIT_COLUMNS = ("replay_over_price_pct", "shared_over_price_pct", "replay_alone_pct")


def slice_cells(table: pd.DataFrame) -> pd.DataFrame:
    """Per source (rows) and run (columns, in ``run_dir`` order): each workload's median E2E
    error, ``"a / b / c %"`` in the workloads' order of appearance; a value in parentheses is
    the slice the profile was fitted on (not held out)."""
    workloads = list(dict.fromkeys(table["workload"]))
    runs = sorted(table["run_dir"].unique())
    medians = table.groupby(["source", "run_dir", "workload"], sort=False).agg(
        e2e=("e2e_mape_pct", "median"), held_out=("held_out", "all"))  # fmt: skip
    cells = {}
    for source in dict.fromkeys(table["source"]):
        cells[source] = [_slice_cell(medians, source, run, workloads) for run in runs]
    return pd.DataFrame.from_dict(cells, orient="index",
                                  columns=[f"run {i + 1}" for i in range(len(runs))])  # fmt: skip


def _slice_cell(medians: pd.DataFrame, source: str, run: str, workloads: list[str]) -> str:
    values = []
    for workload in workloads:
        key = (source, run, workload)
        if key not in medians.index:
            values.append("–")
            continue
        e2e, held_out = medians.loc[key, "e2e"], medians.loc[key, "held_out"]
        values.append(f"{e2e:.1f}" if held_out else f"({e2e:.1f})")
    return " / ".join(values) + " %"


def sim_to_real_runs_section(tables: dict[str, pd.DataFrame]) -> str:
    """The section over the runs of each engine table in ``tables`` (keyed by file name, rows of
    every run with ``run_dir``); "" without any."""
    parts = []
    for name, engine, repeat_source in ENGINE_TABLES:
        table = tables.get(name, pd.DataFrame())
        if table.empty:
            continue
        runs = sorted(table["run_dir"].unique())
        workloads = " / ".join(dict.fromkeys(table["workload"]))
        cells = slice_cells(table)
        rows = [[source, *row] for source, row in cells.iterrows()]
        parts.append(f"### {engine}: `{name}`, {len(runs)} runs\n\n"
                     f"Median \\|E2E error\\| per request, the median over each slice's rates "
                     f"and allocators in each run ({workloads}); in parentheses the slice a "
                     "profile was fitted on.\n\n"
                     + markdown_table(["predictor", *cells.columns], rows))  # fmt: skip
        pairs = repeat_pairs(table, repeat_source, RUN_DIR_KEYS, cluster_keys=("run_dir",))
        if not pairs.empty:
            parts.append(f"Held out, paired with `{repeat_source}` (the same run served again) "
                         "over all runs:\n\n" + _pairs_table(pairs))  # fmt: skip
        names = run_names(runs)
        parts.append("Runs: " + ", ".join(f"{i + 1} `{run}`" for i, run in enumerate(names)))
    return "\n\n".join(parts)


def repeat_split_runs_section(steps_tables: dict[str, pd.DataFrame]) -> str:
    """Per engine steps table in ``steps_tables`` (keyed by file name, every run's steps with
    ``run_dir``), each run's replays against their repeats (``repeat_split``): the replays that
    have a repeat and, over them, the range of the replay's steps over the grid's price, of what
    both serves showed alike, and of the replay's own rest; "" without any."""
    parts = []
    for name, engine in STEPS_TABLES:
        steps = steps_tables.get(name, pd.DataFrame())
        if steps.empty:
            continue
        runs = dict(iter(steps.groupby("run_dir")))  # sorted by folder
        all_splits = map(repeat_split, runs.values())
        splits = {label: split for label, split in zip(run_names(list(runs)), all_splits,
                                                       strict=True) if not split.empty}  # fmt: skip
        rows = [[f"`{label}`", str(len(split)), *(
                    f"{split[column].min():+.1f} to {split[column].max():+.1f} %"
                    for column in SPLIT_COLUMNS)]
                for label, split in splits.items()]  # fmt: skip
        if rows:
            parts.append(f"### {engine}: each replay against its repeat (`{name}`)\n\n"
                         "Per run, over its replays: their steps over the grid profile's price, "
                         "what each replay and its repeat showed alike stretch by stretch (where "
                         "a miss of the profile lies) and the replay's own rest.\n\n"
                         + markdown_table(["run", "replays", "steps over the price",
                                           "both serves alike", "the replay's own"],
                                          rows))  # fmt: skip
            parts.append("Over these runs' replays, whether one pass ran slower than the "
                         "other:\n\n" + "\n".join(pass_order_lines(pd.concat(splits.values()))))
    return "\n\n".join(parts)


def run_names(run_dirs: list[str]) -> list[str]:
    """Each of ``run_dirs`` relative to the folder holding them all (their folder names when
    they are siblings)."""
    common = os.path.commonpath([os.path.dirname(run) for run in run_dirs])
    return [os.path.relpath(run, common) for run in run_dirs]


def _pairs_table(pairs: pd.DataFrame) -> str:
    rows = [[row.source, f"{row.num_nearer} of {row.num_pairs}"
             + (f" ({row.num_ties} tied)" if row.num_ties else ""),
             f"{row.sign_test_p:.2g}",
             f"{row.num_clusters_nearer} of {row.num_clusters}"
             + (f" ({row.num_clusters_tied} tied)" if row.num_clusters_tied else "")
             + f" (p {row.clusters_sign_test_p:.2g})",
             f"{row.median_profile_pct:.1f} %",
             f"{row.median_repeat_pct:.1f} %", f"{row.median_ratio:.2f}",
             f"{row.median_ttft_pct:.1f} % ({row.median_ttft_repeat_pct:.1f} %)",
             f"{row.median_tpot_pct:.1f} % ({row.median_tpot_repeat_pct:.1f} %)"]
            for row in pairs.itertuples()]  # fmt: skip
    return markdown_table(["predictor", "nearer than the repeat", "sign test p",
                           "runs nearer (their medians)", "median E2E error", "the repeat's",
                           "ratio", "TTFT (the repeat's)", "TPOT (the repeat's)"],
                          rows)  # fmt: skip
