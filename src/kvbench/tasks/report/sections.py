"""The reproduction report, one function per paper figure: kvbench's measurement beside the
paper's, and the gap explained from the mechanism (never from a tuned constant).

Each function takes the aggregated tables and returns a markdown section, or "" when the results
hold nothing for that figure.
"""

from __future__ import annotations

import math

import pandas as pd

from kvbench.analysis.curves import LATENCY, curve_keys
from kvbench.analysis.paper import (
    BEAM_K6_ALPACA_GAIN_OVER_ORACLE,
    FIG2_BREAKDOWN_PCT,
    FIG12_KNEES_APPROX,
    FIG12_SHAREGPT_KNEE_RATIO_RANGE,
    FIG13_MEAN_BATCH_SIZE,
    FIG15_ALPACA_SAVING_PCT,
    FIG15_SHAREGPT_SAVING_RANGE_PCT,
    FIG18B_BEST_BLOCK_SIZES,
    FIG19_RECOMPUTE_OVER_SWAP_MAX,
)
from kvbench.core.catalog import get_deployment
from kvbench.core.specs import GIB as GIB_BYTES
from kvbench.tasks.report.markdown_table import cell, markdown_table

NAIVE = ("naive_max", "naive_pow2", "naive_oracle")
PAPER_NAMES = {"naive_max": "Orca (Max)", "naive_pow2": "Orca (Pow2)",
               "naive_oracle": "Orca (Oracle)", "paged": "vLLM"}  # fmt: skip
# Table 1 (exact): (model, GPU, GPUs, KV GiB) -> (paper's max KV slots, KV bytes per token).
TABLE1 = {
    ("opt-13b", "a100-40gb", 1, 12.0): ("15.7K", 819_200),
    ("opt-66b", "a100-40gb", 4, 21.0): ("9.7K", 2_359_296),
    ("opt-175b", "a100-80gb", 8, 264.0): ("60.1K", 4_718_592),
}
# Fig. 13 with Little's law: the paper's mean batch at a rate, over the mean output tokens of
# its traces (ShareGPT 337.99, Alpaca 58.45), gives its engine's seconds per iteration.
PAPER_OUTPUT_TOKENS = {"sharegpt": 337.99, "alpaca": 58.45}
PAPER_FIG13_RATES = {"sharegpt": 2.0, "alpaca": 30.0}
PREFIX_CACHING_EXPERIMENT = "prefix_caching"
RADIX_OFFLOAD_EXPERIMENT = "radix_offload"


def _opt13b(summary: pd.DataFrame) -> pd.DataFrame:
    if summary.empty or "model" not in summary.columns:
        return summary
    return summary[(summary["model"] == "opt-13b") & (summary["num_gpus"] == 1)]


def _basic_opt13b(summary: pd.DataFrame) -> pd.DataFrame:
    """OPT-13B rows in the paper's basic setting: block 16, recompute, one sample per prompt."""
    rows = _opt13b(summary)
    if rows.empty:
        return rows
    basic = rows["block_size"] == 16
    if "preemption" in rows.columns:
        basic &= rows["preemption"] == "recompute"
    for sharing in ("n", "beam_width"):
        if sharing in rows.columns:
            basic &= rows[sharing] == 1
    return rows[basic]


def table1_section() -> str:
    """Table 1 from the catalog: KV capacity of the paper's three deployments."""
    rows = []
    for (model, hardware, gpus, kv_gib), (paper_slots, paper_bytes) in TABLE1.items():
        deployment = get_deployment(model, hardware, num_gpus=gpus, kv_cache_gib=kv_gib)
        rows.append([f"{model}, {gpus}x {hardware}, {kv_gib:g} GiB KV", paper_slots,
                     f"{deployment.num_kv_slots:,}", f"{paper_bytes:,}",
                     f"{deployment.kv_bytes_per_token:,}"])  # fmt: skip
    header = ["deployment", "paper: KV slots", "kvbench", "paper: bytes/token", "kvbench"]
    return "## Table 1: KV capacity\n\n" + markdown_table(header, rows) + (
        "\n\nThe paper's \"GB\" are GiB. OPT-66B: 21 GiB / 2,359,296 B = 9,557 slots, where the "
        "paper prints 9.7K (its KV memory is rounded to whole GB).\n"
    )


def paper_point_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """OPT-13B runs at the paper's Fig. 2/13 points (ShareGPT 2 req/s, Alpaca 30 req/s; block
    16, recompute, one sample per prompt), one row per (workload, allocator): the run that
    replayed the most requests (the steadiest estimate; ``vllm_fig2``'s, beside a rate sweep's
    shorter one), whatever order the runs were loaded in."""
    rows = _basic_opt13b(summary)
    if rows.empty:
        return rows
    at_points = pd.Series(False, index=rows.index)
    for workload, rate in PAPER_FIG13_RATES.items():
        at_points |= (rows["workload"] == workload) & (rows["request_rate"] == rate)
    rows = rows[at_points]
    if "num_requests" in rows.columns:
        rows = rows.sort_values("num_requests", kind="stable")
    return rows.drop_duplicates(["workload", "allocator"], keep="last").sort_index()


def _fig2_rows(summary: pd.DataFrame) -> pd.DataFrame:
    rows = paper_point_rows(summary)
    return rows[rows["workload"] == "sharegpt"] if not rows.empty else rows


def fig2_section(summary: pd.DataFrame) -> str:
    """Fig. 2: the KV breakdown on ShareGPT at 2 req/s, OPT-13B (paper's value in brackets)."""
    rows = _fig2_rows(summary)
    if rows.empty:
        return ""
    table = []
    for row in rows.itertuples(index=False):
        paper = FIG2_BREAKDOWN_PCT.get(row.allocator, {})
        # The paper's bars are shares of memory not free. Its saturated naive engines leave
        # almost nothing free, so their bars read as % of the pool too; paged at 2 req/s leaves
        # half of it free, so its bar (96.3 token states, an unlabeled 3.7 rest) compares with
        # the share of held memory only.
        of_pool = paper if row.allocator in NAIVE else {}
        cells = [row.allocator]
        for category in ("token_states", "reservation", "internal_frag", "external_frag"):
            cells.append(_with_paper(getattr(row, f"{category}_pct"), of_pool.get(category)))
        cells += [f"{row.free_pct:.1f}",
                  _with_paper(row.token_states_pct_of_held, paper.get("token_states"))]  # fmt: skip
        table.append(cells)
    header = ["allocator", "token states", "reservation", "internal", "external", "free",
              "token states % of held"]  # fmt: skip
    return (
        "## Fig. 2: KV cache usage breakdown (ShareGPT, 2 req/s, OPT-13B)\n\n"
        "% of the KV pool, time-weighted; the paper's value in brackets. Its bars have no free "
        "category: they are shares of the memory not free, which *token states % of held* is "
        "(the naive engines, saturated, leave almost nothing free; paged leaves half).\n\n"
        + markdown_table(header, table)
        + "\n\nWhy the numbers differ: `docs/reproduction.md`, *Fig. 2 and Fig. 13* (kvbench's "
        "ShareGPT prompts are shorter than the paper's; paged is not memory-bound at 2 req/s).\n"
    )


def _with_paper(value: float, paper: float | None) -> str:
    return f"{value:.1f}" + (f" ({paper:g})" if paper is not None else "")


def fig13_section(summary: pd.DataFrame) -> str:
    """Fig. 13: mean batched requests on ShareGPT at 2 req/s and Alpaca at 30 req/s."""
    rows = paper_point_rows(summary)
    if rows.empty:
        return ""
    table = []
    for workload, rate in PAPER_FIG13_RATES.items():
        for row in rows[rows["workload"] == workload].itertuples(index=False):
            paper = FIG13_MEAN_BATCH_SIZE[workload].get(row.allocator, math.nan)
            change = row.mean_batch_size / paper - 1
            table.append([f"{workload} @ {rate:g}/s", row.allocator, paper, row.mean_batch_size,
                          change])  # fmt: skip
    if not table:
        return ""
    body = markdown_table(["trace", "allocator", "paper", "kvbench", "kvbench / paper - 1"],
                          table)  # fmt: skip
    return "## Fig. 13: mean batched requests (OPT-13B)\n\n" + body + "\n"


def _implied_iteration_ms(workload: str) -> float:
    """The paper's vLLM seconds per iteration at its Fig. 13 point (Little's law), in ms."""
    batch = FIG13_MEAN_BATCH_SIZE[workload]["paged"]
    return 1000 * batch / (PAPER_FIG13_RATES[workload] * PAPER_OUTPUT_TOKENS[workload])


def _kvbench_iteration_ms(curve: pd.DataFrame, batch: float) -> tuple[float, float]:
    """(mean batch, TPOT p50 in ms) of the paged run whose batch is closest to ``batch``."""
    paged = curve[curve["allocator"] == "paged"]
    if paged.empty:
        return math.nan, math.nan
    row = paged.iloc[(paged["mean_batch_size"] - batch).abs().argmin()]
    return float(row["mean_batch_size"]), 1000 * float(row["tpot_p50_s"])


def fig12_section(summary: pd.DataFrame, knees: pd.DataFrame, sensitivity: pd.DataFrame) -> str:
    """Fig. 12: each curve's knee and paged's knee ratios, beside the paper's."""
    knees, sensitivity = _without_sharing(summary, knees), _without_sharing(summary, sensitivity)
    if knees.empty:
        return ""
    keys = curve_keys(knees)
    parts = [
        "## Fig. 12: throughput at equal latency (knees of the latency-vs-rate curves)\n",
        "The knee of a curve is the highest request rate whose normalized latency stays under "
        "the bound: 4x the unloaded latency (the lowest any allocator of the curve reaches), "
        "interpolated between the sampled rates (`docs/metrics.md`). *ratio* = paged's knee over "
        "this allocator's: how many times the request rate paged sustains at the same latency. "
        "A `>` marks a knee beyond the sampled rates (a lower bound), so a ratio is then a bound "
        "too (`≥`, `≤`), or nothing (`–`) when both knees are beyond them.\n",
    ]
    for values, group in knees.groupby(keys, sort=False, dropna=False):
        labels = dict(zip(keys, values, strict=True))
        parts.append(_fig12_curve_table(labels, group))
    parts.append(_sensitivity_table(sensitivity))
    parts.append(_fig12_gap(summary))
    return "\n".join(parts)


def _without_sharing(summary: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s rows whose (experiment, workload) samples once per prompt: Fig. 12 is basic
    sampling; curves with parallel samples or beams belong to Fig. 15."""
    if frame.empty or "beam_width" not in summary.columns:
        return frame
    sharing = summary[(summary["n"] > 1) | (summary["beam_width"] > 1)]
    pairs = set(zip(sharing["experiment"], sharing["workload"], strict=True))
    keep = [(e, w) not in pairs for e, w in zip(frame["experiment"], frame["workload"],
                                                  strict=True)]  # fmt: skip
    return frame[keep]


def _fig12_curve_table(labels: dict, group: pd.DataFrame) -> str:
    workload, model = labels.get("workload"), labels.get("model")
    paper_knees = FIG12_KNEES_APPROX.get(str(workload), {}) if model == "opt-13b" else {}
    # The paper's ratio ranges are its OPT models' (13B, 66B, 175B) on ShareGPT.
    is_paper_curve = workload == "sharegpt" and str(model).startswith("opt-")
    paper_ratios = FIG12_SHAREGPT_KNEE_RATIO_RANGE if is_paper_curve else {}
    rows = []
    for row in group.itertuples(index=False):
        knee = ("> " if row.knee_censored else "") + cell(row.knee_rate)
        ratio = ratio_cell(row.knee_ratio, row.knee_ratio_bound)
        paper_range = paper_ratios.get(row.allocator)
        rows.append([row.allocator, knee, cell(paper_knees.get(row.allocator, math.nan)), ratio,
                     f"{paper_range[0]:g}-{paper_range[1]:g}" if paper_range else "–"])  # fmt: skip
    first = group.iloc[0]
    title = (f"**{labels.get('experiment')}: {workload}, {model} on {first['num_gpus']}x "
             f"{first['hardware']}, block {first['block_size']}** (bound "
             f"{first['latency_bound_s_per_token']:.3f} s/token; rates "
             f"{first['min_rate']:g}-{first['max_rate']:g} req/s)")  # fmt: skip
    header = ["allocator", "knee (req/s)", "paper knee (approx.)", "ratio paged / this",
              "paper ratio"]  # fmt: skip
    return title + "\n\n" + markdown_table(header, rows) + "\n"


def ratio_cell(ratio: float, bound: str, suffix: str = "") -> str:
    """A knee ratio as the report prints it (``knee_ratio_bound``, docs/metrics.md): "≥ 2.50"
    (a lower bound), "≤ 2.50" (an upper bound), "–" where both knees are censored or the ratio
    is NaN."""
    if bound in ("", "unknown") or pd.isna(ratio):
        return "–"
    return {"lower": "≥ ", "upper": "≤ "}.get(bound, "") + f"{ratio:.2f}{suffix}"


def _sensitivity_table(sensitivity: pd.DataFrame) -> str:
    if sensitivity.empty:
        return ""
    naive = sensitivity[sensitivity["allocator"].isin(NAIVE)]
    keys = [*curve_keys(naive), "allocator"]
    multiples = sorted(naive["latency_multiple"].unique())
    rows = []
    for values, curve in naive.groupby(keys, sort=False, dropna=False):
        labels = dict(zip(keys, values, strict=True))
        by_multiple = curve.set_index("latency_multiple")
        rows.append([
            f"{labels.get('experiment')} / {labels.get('workload')} / {labels.get('model')}",
            labels["allocator"],
            *[ratio_cell(by_multiple.at[m, "knee_ratio"], by_multiple.at[m, "knee_ratio_bound"])
              if m in by_multiple.index else "–" for m in multiples],
        ])  # fmt: skip
    header = ["experiment / workload / model", "allocator",
              *[f"ratio at {m:g}x" for m in multiples]]  # fmt: skip
    return (
        "How much the choice of bound matters: paged's knee ratio at 2x, 4x and 10x the unloaded "
        "latency (`≥`: paged's knee lies beyond the sampled rates, so the ratio is a lower bound; "
        "`–`: both knees do).\n\n" + markdown_table(header, rows) + "\n"
    )


def _fig12_curve(summary: pd.DataFrame, workload: str) -> pd.DataFrame:
    """The OPT-13B Fig. 12 curve of ``workload``: block 16, recompute, one sample per prompt,
    from the experiment that sampled the most rates (not a block-size or preemption sweep's
    rows at the same model and trace)."""
    rows = _basic_opt13b(summary)
    rows = rows[rows["workload"] == workload] if not rows.empty else rows
    if rows.empty:
        return rows
    experiment = rows.groupby("experiment")["request_rate"].nunique().idxmax()
    return rows[rows["experiment"] == experiment]


def _fig12_gap(summary: pd.DataFrame) -> str:
    lines = ["**Why kvbench's knees lie right of the paper's, and its ratios agree.**"]
    for workload in ("sharegpt", "alpaca"):
        curve = _fig12_curve(summary, workload)
        if curve.empty or curve["request_rate"].nunique() < 2:
            continue
        paper_ms = _implied_iteration_ms(workload)
        paper_batch = FIG13_MEAN_BATCH_SIZE[workload]["paged"]
        batch, measured_ms = _kvbench_iteration_ms(curve, paper_batch)
        lines.append(
            f"- {workload}: by Little's law the paper's vLLM ran {paper_batch:g} requests per "
            f"iteration at {PAPER_FIG13_RATES[workload]:g} req/s with "
            f"{PAPER_OUTPUT_TOKENS[workload]:g} output tokens each, {paper_ms:.0f} ms per "
            f"iteration; kvbench's roofline prices a paged iteration at a batch of {batch:.0f} at "
            f"{measured_ms:.0f} ms (TPOT p50)."
        )
    lines.append(
        "- A faster iteration serves more requests per second at the same batch, so every "
        "allocator's knee moves right by roughly the ratio of iteration times. The batch an "
        "allocator can hold is set by memory alone (Max: 7 requests of 2,048 slots; Oracle: the "
        "buddy-rounded true lengths; paged: the true lengths to a block), the same in kvbench "
        "and in the paper, so the *ratios* of knees, where the iteration speed cancels to first "
        "order, land inside the paper's ranges while the absolute knees do not."
    )
    lines.append(
        "- The 2023 engine's iteration grew with the batch (Python scheduling, block-table "
        "preparation and sampling per sequence); kvbench's overhead is a constant 2 ms "
        "(`docs/cost_model.md`). That is why paged on Alpaca, whose short requests make "
        "batches of 100+, keeps its latency far past the paper's ~28 req/s in kvbench: there "
        "the per-sequence CPU cost the roofline leaves out dominated the paper's iteration."
    )
    return "\n".join(lines) + "\n"


def block_sweep_rows(summary: pd.DataFrame, compares_preemption: bool) -> pd.DataFrame:
    """Paged rows of experiments that sweep the block size at fixed rates: those comparing
    preemption modes (Fig. 19) or, with ``compares_preemption`` False, the others (Fig. 18b)."""
    if summary.empty:
        return summary
    # prefix_caching sweeps block sizes for hit rates, at several pools: its own section
    paged = summary[(summary["allocator"] == "paged")
                    & (summary["experiment"] != PREFIX_CACHING_EXPERIMENT)]  # fmt: skip
    groups = paged.groupby(["experiment", "workload", "model", "num_gpus", "request_rate"])
    sizes = groups["block_size"].transform("nunique")
    modes = groups["preemption"].transform("nunique")
    return paged[(sizes > 1) & ((modes > 1) == compares_preemption)]


def fig18b_section(summary: pd.DataFrame) -> str:
    """Fig. 18b: normalized latency vs block size (recompute preemption)."""
    rows = block_sweep_rows(summary, compares_preemption=False)
    if rows.empty:
        return ""
    # One column per curve: runs of other experiments or models at a trace and rate stay apart.
    curve = ["experiment", "model", "workload", "request_rate"]
    pivot = rows.pivot_table(index="block_size", columns=curve, values=LATENCY)
    header = ["block size", *[f"{e}: {m}, {w} @ {r:g}/s (s/token)" for e, m, w, r in pivot.columns]]
    table = [[int(size), *values] for size, values in zip(pivot.index, pivot.to_numpy().tolist(),
                                                           strict=True)]  # fmt: skip
    best = [f"{m}, {w} @ {r:g}/s: {int(pivot[(e, m, w, r)].idxmin())} (paper: "
            f"{'-'.join(map(str, FIG18B_BEST_BLOCK_SIZES.get(w, ('?', '?'))))})"
            for e, m, w, r in pivot.columns]  # fmt: skip
    return (
        "## Fig. 18b: latency vs block size (paged)\n\n"
        + markdown_table(header, table, digits=3)
        + "\n\nBest block size, kvbench (paper): " + "; ".join(best) + ".\n\n"
        "Why they differ: kvbench's cost model prices attention by the bytes and FLOPs of the "
        "context alone, not by the block size, so the only effect of the block size it sees is "
        "the slots a sequence's last block wastes (up to block size - 1): larger blocks hold "
        "fewer sequences and latency rises with them, the right half of the paper's curve. The "
        "left half, small blocks being slow, comes from the GPU kernel (a 1- or 2-token block "
        "underuses the memory transactions and parallelism of paged attention), which a roofline "
        "cannot see: kernel times measured per block size (the kernels work, "
        "`docs/kernels.md`) are what would bend it up.\n"
    )


def _count(value: float) -> int | float:
    """A count from a pivot: NaN (no run of that setting) stays NaN, printed as "–"."""
    return value if math.isnan(value) else int(value)


def fig19_section(summary: pd.DataFrame) -> str:
    """Fig. 19: recompute vs swap across block sizes."""
    all_rows = block_sweep_rows(summary, compares_preemption=True)
    if all_rows.empty:
        return ""
    # One table: the first experiment, workload and rate of the comparison.
    first = all_rows.iloc[0]
    rows = all_rows[(all_rows["experiment"] == first["experiment"])
                    & (all_rows["workload"] == first["workload"])
                    & (all_rows["request_rate"] == first["request_rate"])]  # fmt: skip
    pivot = rows.pivot_table(index="block_size", columns="preemption",
                             values=[LATENCY, "num_preemptions"])  # fmt: skip
    table = []
    for size in pivot.index:
        recompute = pivot.loc[size, (LATENCY, "recompute")]
        swap = pivot.loc[size, (LATENCY, "swap")]
        table.append([int(size), recompute, swap, recompute / swap,
                      _count(pivot.loc[size, ("num_preemptions", "recompute")]),
                      _count(pivot.loc[size, ("num_preemptions", "swap")])])  # fmt: skip
    header = ["block size", "recompute (s/token)", "swap (s/token)", "recompute / swap",
              "preemptions (recompute)", "preemptions (swap)"]  # fmt: skip
    workload = ", ".join(sorted(rows["workload"].unique()))
    rates = ", ".join(f"{r:g}" for r in sorted(rows["request_rate"].unique()))
    return (
        f"## Fig. 19: recompute vs swap ({workload} @ {rates} req/s, paged)\n\n"
        + markdown_table(header, table, digits=3)
        + f"\n\nPaper: recomputation is never more than "
        f"{(FIG19_RECOMPUTE_OVER_SWAP_MAX - 1) * 100:.0f} % slower than swapping, comparable at "
        "block sizes 16-64, and swapping is slow at small block sizes.\n\n"
        "Why kvbench differs at small blocks: it prices a swap as its bytes over PCIe "
        "(`docs/cost_model.md`), with no cost per block; a real swap issues one copy per block, "
        "and at 1-8 tokens per block those small copies run far below PCIe bandwidth, which is "
        "the paper's reason swapping loses there. Recompute is priced as a prefill of the whole "
        "context, the same in both. So in kvbench swap is cheapest at the smallest blocks and "
        "the two converge as blocks grow, where per-block overhead stops mattering in the paper "
        "too.\n"
    )


# The rates parallel_sampling and beam_search replay each trace at (their configs): Fig. 15's
# memory saving is read there, below the rates where paged preempts and a preempted sample or beam
# stops sharing. A curve without that rate is read at its lowest rate.
FIG15_RATES = {"alpaca": 10.0, "sharegpt": 0.5}
SHARING_LABELS = {"parallel_sampling": "parallel sampling, n", "beam_search": "beam search, k"}


def _trace_of(workload: str) -> str:
    """The trace a workload label replays (``alpaca_k4`` -> ``alpaca``)."""
    return next((trace for trace in FIG15_RATES if trace in workload), workload)


def fig15_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """OPT-13B runs with parallel samples (n > 1) or beams (k > 1), one row per (sharing,
    trace, width, allocator) at the trace's Fig. 15 rate (else its lowest), with ``sharing``,
    ``trace`` and ``width`` columns."""
    rows = _opt13b(summary)
    if rows.empty or "beam_width" not in rows.columns:
        return rows.iloc[0:0]
    rows = rows[((rows["n"] > 1) | (rows["beam_width"] > 1)) & (rows["block_size"] == 16)]
    rows = rows.assign(
        sharing=["beam_search" if k > 1 else "parallel_sampling" for k in rows["beam_width"]],
        trace=[_trace_of(str(w)) for w in rows["workload"]],
        width=[int(max(n, k)) for n, k in zip(rows["n"], rows["beam_width"], strict=True)],
    )
    picked = []
    for _, curve in rows.groupby(["sharing", "trace", "width"], sort=True):
        rate = FIG15_RATES.get(str(curve["trace"].iloc[0]), math.nan)
        at_rate = curve[curve["request_rate"] == rate]
        if at_rate.empty:
            at_rate = curve[curve["request_rate"] == curve["request_rate"].min()]
        picked.append(at_rate.drop_duplicates("allocator", keep="last"))
    return pd.concat(picked, ignore_index=True) if picked else rows.iloc[0:0]


def _fig15_paper(sharing: str, trace: str, width: int) -> str:
    if trace == "alpaca":
        return cell(FIG15_ALPACA_SAVING_PCT[sharing].get(width, math.nan))
    low, high = FIG15_SHAREGPT_SAVING_RANGE_PCT[sharing]
    return f"{low:g}-{high:g} (range)" if trace == "sharegpt" else "–"


def _knee_cells(knees: pd.DataFrame, row: pd.Series) -> tuple[str, str]:
    """(paged's knee / naive_oracle's knee, paged's ratio over naive_oracle) of ``row``'s curve."""
    if knees.empty:
        return "–", "–"
    curve = knees[(knees["experiment"] == row["experiment"])
                  & (knees["workload"] == row["workload"])
                  & (knees["block_size"] == row["block_size"])]  # fmt: skip
    paged = curve[curve["allocator"] == "paged"]
    oracle = curve[curve["allocator"] == "naive_oracle"]
    if paged.empty or oracle.empty:
        return "–", "–"
    paged, oracle = paged.iloc[0], oracle.iloc[0]

    def knee(entry: pd.Series) -> str:
        if math.isnan(entry["knee_rate"]):  # over the bound at the lowest rate
            return f"< {entry['min_rate']:g}"
        return ("> " if entry["knee_censored"] else "") + f"{entry['knee_rate']:.3g}"

    if math.isnan(oracle["knee_rate"]):
        ratio = f"> {paged['knee_rate'] / oracle['min_rate']:.2f}x"
    else:
        ratio = ratio_cell(oracle["knee_ratio"], oracle["knee_ratio_bound"], suffix="x")
    return f"{knee(paged)} / {knee(oracle)}", ratio


def fig15_section(summary: pd.DataFrame, knees: pd.DataFrame) -> str:
    """Fig. 15: memory saved by sharing (parallel sampling, beam search) beside the paper's, and
    what it buys over ``naive_oracle`` in throughput."""
    rows = fig15_rows(summary)
    paged = rows[rows["allocator"] == "paged"] if not rows.empty else rows
    if paged.empty:
        return ""
    saving_rows = []
    for (sharing, trace), group in paged.groupby(["sharing", "trace"], sort=True):
        widths = sorted(group["width"].unique())
        measured = ", ".join(f"{SHARING_LABELS[sharing][-1]} = {w}: "
                             f"{group.loc[group['width'] == w, 'memory_saving_pct'].iloc[0]:.1f}"
                             for w in widths)  # fmt: skip
        paper = ", ".join(_fig15_paper(sharing, trace, w) for w in widths)
        if trace == "sharegpt":
            paper = _fig15_paper(sharing, trace, widths[0])
        rate = group["request_rate"].iloc[0]
        saving_rows.append([SHARING_LABELS[sharing].removesuffix(", n").removesuffix(", k"),
                            f"{trace} @ {rate:g} req/s", measured, paper])  # fmt: skip
    gain_rows = []
    oracles = rows[rows["allocator"] == "naive_oracle"].set_index(["sharing", "trace", "width"])
    for _, row in paged.sort_values(["sharing", "trace", "width"]).iterrows():
        key = (row["sharing"], row["trace"], row["width"])
        oracle_rps = (oracles.loc[[key], "request_throughput"].iloc[0] if key in oracles.index
                      else math.nan)  # fmt: skip
        knees_cell, ratio_cell = _knee_cells(knees, row)
        paper_gain = (f"{BEAM_K6_ALPACA_GAIN_OVER_ORACLE:g}x"
                      if key == ("beam_search", "alpaca", 6) else "–")  # fmt: skip
        gain_rows.append([
            f"{SHARING_LABELS[row['sharing']]} = {row['width']}", row["trace"],
            row["memory_saving_pct"], row["request_throughput"], oracle_rps,
            row["request_throughput"] / oracle_rps, knees_cell, ratio_cell, paper_gain,
        ])  # fmt: skip
    saving_header = ["sharing", "trace", "kvbench memory saving (%)", "paper (%)"]
    gain_header = ["sharing", "trace", "memory saving (%)", "paged req/s", "naive_oracle req/s",
                   "paged / oracle", "knee paged / oracle (req/s)", "knee ratio",
                   "paper gain"]  # fmt: skip
    return (
        "## Fig. 15: parallel sampling and beam search (sharing)\n\n"
        "Memory saving = blocks saved by sharing / blocks without sharing, time-weighted "
        "(`memory_saving_pct`), of `paged` on OPT-13B with 12 GiB of KV; `naive_oracle` copies "
        "the prompt per sample and holds k full reservations per beam search, so it saves "
        "nothing.\n\n"
        + markdown_table(saving_header, saving_rows)
        + "\n\nThroughput at the same rate, and at equal latency where the run swept rates (the "
        "knee: highest rate under 4x the unloaded latency; `>` past the sweep, `<` over the "
        "bound at the lowest rate):\n\n"
        + markdown_table(gain_header, gain_rows)
        + "\n\nWhy the savings differ from the paper's: the hand-written sections below.\n"
    )


def prefix_caching_section(summary: pd.DataFrame) -> str:
    """Prefix caching on a trace with prefix hashes: hit rate vs cache size and block size next
    to an unbounded cache's ideal on the same requests, and paged vs paged_prefix batch and
    throughput."""
    if summary.empty or "ideal_prefix_hit_rate" not in summary.columns:
        return ""
    rows = summary[(summary["experiment"] == PREFIX_CACHING_EXPERIMENT)
                   & summary["ideal_prefix_hit_rate"].notna()]  # fmt: skip
    rows = rows.drop_duplicates(["allocator", "num_kv_slots", "block_size"], keep="last")
    cached = rows[rows["allocator"] == "paged_prefix"]
    if cached.empty:
        return ""
    first = cached.iloc[0]
    slots = sorted(cached["num_kv_slots"].unique())
    sizes = sorted(cached["block_size"].unique())
    bytes_per_slot = first["kv_pool_gb"] * 1e9 / first["num_kv_slots"]
    hit_rows = []
    for num_slots in slots:
        at_size = cached[cached["num_kv_slots"] == num_slots].set_index("block_size")
        hit_rows.append([f"{num_slots:,}", num_slots * bytes_per_slot / GIB_BYTES,
                         *[f"{100 * at_size.loc[b, 'prefix_hit_rate']:.1f} / "
                           f"{100 * at_size.loc[b, 'prefix_block_hit_rate']:.1f}"
                           if b in at_size.index else "–" for b in sizes]])  # fmt: skip
    ideal = cached.drop_duplicates("block_size").set_index("block_size")
    hit_rows.append(["ideal (unbounded, same requests)", "–",
                     *[f"{100 * ideal.loc[b, 'ideal_prefix_hit_rate']:.1f} / "
                       f"{100 * ideal.loc[b, 'ideal_prefix_block_hit_rate']:.1f}"
                       for b in sizes]])  # fmt: skip
    hit_header = ["KV slots", "KV GiB", *[f"block {b}: tokens / blocks (%)" for b in sizes]]
    effect_rows = []
    block = 16 if 16 in sizes else sizes[0]
    at_block = rows[rows["block_size"] == block]
    for num_slots in slots:
        pair = at_block[at_block["num_kv_slots"] == num_slots].set_index("allocator")
        if not {"paged", "paged_prefix"} <= set(pair.index):
            continue
        base, prefix = pair.loc["paged"], pair.loc["paged_prefix"]
        effect_rows.append([f"{num_slots:,}", 100 * prefix["prefix_hit_rate"],
                            base["mean_batch_size"], prefix["mean_batch_size"],
                            base["request_throughput"], prefix["request_throughput"],
                            prefix["request_throughput"] / base["request_throughput"],
                            base["ttft_p50_s"], prefix["ttft_p50_s"],
                            int(base["num_preemptions"]),
                            int(prefix["num_preemptions"])])  # fmt: skip
    effect_header = ["KV slots", "hit rate (%)", "batch paged", "batch paged_prefix",
                     "req/s paged", "req/s paged_prefix", "gain", "TTFT p50 paged (s)",
                     "TTFT p50 paged_prefix (s)", "preemptions paged",
                     "preemptions paged_prefix"]  # fmt: skip
    return (
        f"## Prefix caching: {first['workload']}, {first['model']} on {first['num_gpus']}x "
        f"{first['hardware']}\n\n"
        f"{int(first['num_requests']):,} requests at the trace's timestamps. Hit rate = prompt "
        "tokens (blocks) found in the cache at admission / prompt tokens (blocks) "
        "(`prefix_hit_rate` / `prefix_block_hit_rate`); the ideal is an unbounded, "
        "never-evicting cache on exactly these requests at that block size "
        "(`ideal_prefix_hit_rate` / `ideal_prefix_block_hit_rate`).\n\n"
        + markdown_table(hit_header, hit_rows, digits=1)
        + f"\n\nWhat the cache does to batch and throughput (block {block}):\n\n"
        + markdown_table(effect_header, effect_rows)
        + "\n"
    )


def radix_offload_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The ``radix_offload`` experiment's rows, the last of each setting."""
    if summary.empty or "cpu_cache_gib" not in summary.columns:
        return summary.iloc[0:0]
    rows = summary[summary["experiment"] == RADIX_OFFLOAD_EXPERIMENT]
    keys = ["workload", "allocator", "block_size", "cpu_cache_gib", "policy"]
    return rows.drop_duplicates(keys, keep="last")


def radix_offload_section(summary: pd.DataFrame) -> str:
    """Radix vs block-hash hit rates by page size next to the unbounded ideal, lpm vs fcfs, and
    hit rate by tier, TTFT and throughput vs the CPU tier's size."""
    rows = radix_offload_rows(summary)
    if rows.empty:
        return ""
    rows = rows.sort_values(["workload", "allocator", "block_size", "cpu_cache_gib"])
    design_rows = []
    for _, row in rows[rows["cpu_cache_gib"] == 0].iterrows():
        design_rows.append([row["workload"], row["allocator"], int(row["block_size"]),
                            row["policy"], 100 * row["prefix_hit_rate"],
                            100 * row["ideal_prefix_hit_rate"], row["request_throughput"],
                            row["ttft_p50_s"]])  # fmt: skip
    design_header = ["workload", "allocator", "block / page", "policy", "hit rate (%)",
                     "unbounded ideal (%)", "req/s", "TTFT p50 (s)"]  # fmt: skip
    tier_rows = []
    hit_on_cpu = rows.groupby("workload")["prefix_cpu_hit_rate"].transform("max") > 0
    for _, row in rows[(rows["policy"] == "fcfs") & hit_on_cpu].iterrows():
        tier_rows.append([row["workload"], row["allocator"], int(row["block_size"]),
                          f"{row['cpu_cache_gib']:g}", 100 * row["prefix_gpu_hit_rate"],
                          100 * row["prefix_cpu_hit_rate"], 100 * row["prefix_hit_rate"],
                          row["request_throughput"], row["ttft_p50_s"]])  # fmt: skip
    tier_header = ["workload", "allocator", "block / page", "CPU tier (GiB)", "GPU hits (%)",
                   "CPU hits (%)", "all hits (%)", "req/s", "TTFT p50 (s)"]  # fmt: skip
    first = rows.iloc[0]
    return (
        f"## Radix vs block-hash prefix caching, and a CPU tier: {first['model']} on "
        f"{first['num_gpus']}x {first['hardware']}\n\n"
        "Hit rate = prompt tokens found cached at admission / prompt tokens (`prefix_hit_rate`), "
        "next to an unbounded, never-evicting cache at the same block or page size "
        "(`ideal_prefix_hit_rate`). Without a CPU tier:\n\n"
        + markdown_table(design_header, design_rows, digits=2)
        + "\n\nBy tier (`prefix_gpu_hit_rate`, `prefix_cpu_hit_rate`), fcfs, on the workloads "
        "whose CPU tier is ever hit:\n\n"
        + markdown_table(tier_header, tier_rows, digits=2)
        + "\n"
    )


def capacity_section(capacity: pd.DataFrame) -> str:
    """The fleet each allocator needs for the target rate, and what it costs."""
    if capacity.empty:
        return ""
    parts = ["## Capacity and cost\n"]
    for _, fleet in capacity.groupby(["experiment", "target_request_rate"], sort=False):
        first = fleet.iloc[0]
        rows = [[row.allocator, ("> " if row.knee_censored else "") + cell(row.knee_rate),
                 cell(row.replicas, 0), cell(row.gpus, 0), f"${row.cost_per_hour:,.2f}",
                 row.kv_pool_gb_fleet, row.kv_held_gb, row.kv_used_gb, row.kv_held_over_used,
                 row.operating_latency_s_per_token]
                for row in fleet.itertuples(index=False)]  # fmt: skip
        header = ["allocator", "knee / replica (req/s)", "replicas", "GPUs", "$/hour",
                  "KV pool (GB)", "KV held (GB)", "KV used (GB)", "held / used",
                  "latency at operating rate (s/token)"]  # fmt: skip
        parts.append(
            f"**{first['experiment']}**: {first['target_request_rate']:g} req/s of "
            f"{first['workload']} on replicas of {first['model']} on {first['num_gpus']}x "
            f"{first['hardware']}, normalized latency ≤ {first['latency_bound_s_per_token']:.3f} "
            f"s/token, ${first['price_per_gpu_hour']:.2f} per GPU-hour (a list price kvbench "
            "chose; `hardware.price_per_gpu_hour`).\n\n" + markdown_table(header, rows, digits=3)
        )
    return "\n".join(parts) + "\n"


def runs_section(summary: pd.DataFrame, done: dict[str, tuple[str, float]]) -> str:
    """What the report read: experiments, rows, completeness and wall time.

    ``done`` maps a run folder to its DONE marker (path, wall seconds); a study's grid points
    share one marker, counted once, with the first experiment that has it (a capacity run's
    operating points, experiment ``<name>_operating``, are inside its run's wall time).
    """
    if summary.empty:
        return ""
    rows = []
    counted_by: dict[str, str] = {}  # marker path -> the experiment its wall time is shown with
    # By name: a run's experiment before its operating points' (<name>_operating).
    for experiment, group in summary.groupby("experiment", sort=True):
        markers = {done[d] for d in group["run_dir"].unique() if d in done}
        new = {(path, wall_s) for path, wall_s in markers if path not in counted_by}
        counted_by.update(dict.fromkeys((path for path, _ in new), str(experiment)))
        if markers and not new:
            wall: float | str = f"in {counted_by[next(iter(markers))[0]]}"
        else:
            wall = sum(wall_s for _, wall_s in new) or math.nan
        rows.append([experiment, len(group), group["run_dir"].nunique(),
                     "yes" if group["run_complete"].all() else "no",
                     group["simulation_wall_s"].sum(), wall])  # fmt: skip
    header = ["experiment", "summary rows", "run folders", "complete", "simulation (s)",
              "run wall (s, from DONE)"]  # fmt: skip
    return "## Runs read\n\n" + markdown_table(header, rows, digits=1) + "\n"
