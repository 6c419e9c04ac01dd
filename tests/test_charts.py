"""Every chart a run draws: the files exist, labels never overlap, legends stay off the data,
colours come from the one allocator map, sizes fit a laptop screen; the headline's rate and
finding, and the KV budget's numbers against hand computations from the catalog."""

from __future__ import annotations

import struct
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from chart_layout import (
    foreign_colors,
    layout_problems,
    legends_over_data,
    overlapping_texts,
    used_allocator_colors,
)
from conftest import compose_config
from matplotlib.colors import to_hex

from kvbench.analysis.kv_budget import (
    budget_series,
    crossover_context_tokens,
    crossover_num_seqs,
    held_slots_per_sequence,
    kv_budget,
)
from kvbench.core.catalog import get_deployment
from kvbench.plots import (
    DEFAULT_CHART_FORMATS,
    capacity_chart,
    chart_formats,
    figure,
    headline_chart,
    kv_budget_chart,
    run_charts,
    scheduler_chart,
    sweep_charts,
)
from kvbench.plots.headline_chart import finding, headline_rate
from kvbench.tasks.simulate.run import run_study

CHART_MODULES = (run_charts, headline_chart, kv_budget_chart, sweep_charts, capacity_chart,
                 scheduler_chart)  # fmt: skip
# The main experiment runs both engines: each one's run charts in its grid point's folder, the
# rate sweep and the engines compared at the root.
MAIN_RUN_CHARTS = ("headline", "usage_breakdown", "memory_over_time", "batch_size", "kv_budget",
                   "latency_vs_rate", "scheduler_comparison")  # fmt: skip
REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"


class Drawn:
    """What a chart looked like when it was saved: its layout problems, size and colours."""

    def __init__(self, fig, folder: Path):
        self.folder = folder  # where it was saved
        self.problems = layout_problems(fig)
        self.size_in = tuple(fig.get_size_inches())
        self.allocators = used_allocator_colors(fig)
        self.share_bars = _share_bars(fig) if fig.get_axes() else []


def _share_bars(fig) -> list[tuple[str, str]]:
    # (y tick label, bar colour) of the figure's first axes, for the headline's share panel.
    ax = fig.get_axes()[0]
    labels = [label.get_text() for label in ax.get_yticklabels()]
    bars = [to_hex(patch.get_facecolor()) for patch in ax.patches][: len(labels)]
    return list(zip(labels, bars, strict=False))


def _capture_into(drawn: dict[str, Drawn], monkeypatch: pytest.MonkeyPatch) -> None:
    def capture(fig, out_dir: Path, name: str) -> None:
        drawn[name] = Drawn(fig, out_dir)
        figure.save_figure(fig, out_dir, name)

    for module in CHART_MODULES:
        monkeypatch.setattr(module, "save_figure", capture)


def _run(out: Path, *overrides: str) -> dict[str, Drawn]:
    drawn: dict[str, Drawn] = {}
    # SVG beside the PNG: its text is where these tests read the charts' labels.
    with pytest.MonkeyPatch.context() as monkeypatch, chart_formats(("png", "svg")):
        _capture_into(drawn, monkeypatch)
        cfg, deployment, raw = compose_config(*overrides, "progress=false")
        run_study(cfg, deployment, raw, out)
    return drawn


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> tuple[Path, dict[str, Drawn]]:
    """The main experiment, small: 80 requests at a light and a memory-bound rate."""
    out = tmp_path_factory.mktemp("main")
    drawn = _run(out, "experiment=sharegpt_70b", "workload.num_requests=80", "request_rates=[1,6]")
    return out, drawn


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory) -> tuple[Path, dict[str, Drawn]]:
    """The Fig. 2 experiment, small: two workloads, the paper's bars beside kvbench's."""
    out = tmp_path_factory.mktemp("fig2")
    drawn = _run(out, "experiment=vllm_fig2", "workloads.sharegpt.num_requests=60",
                 "workloads.alpaca.num_requests=60")  # fmt: skip
    return out, drawn


def _png_size_px(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


def test_the_main_run_writes_every_chart(main_run):
    _, drawn = main_run
    for name in MAIN_RUN_CHARTS:
        assert name in drawn
        for suffix in ("png", "svg"):
            assert (drawn[name].folder / f"{name}.{suffix}").stat().st_size > 0


@pytest.mark.parametrize("run", ["main_run", "paper_run"])
def test_charts_have_no_overlapping_labels_legends_over_data_or_foreign_colours(run, request):
    _, drawn = request.getfixturevalue(run)
    for name, chart in drawn.items():
        assert chart.problems == [], name


@pytest.mark.parametrize("run", ["main_run", "paper_run"])
def test_charts_fit_a_laptop_screen_and_a_slide(run, request):
    _, drawn = request.getfixturevalue(run)
    max_width_in, max_height_in = figure.MAX_FIGURE_INCHES
    for name, chart in drawn.items():
        assert chart.size_in[0] <= max_width_in and chart.size_in[1] <= max_height_in, name
        width_px, height_px = _png_size_px(chart.folder / f"{name}.png")
        # bbox_inches="tight" trims the margins and may add its 0.1-inch pad.
        assert width_px <= (max_width_in + 0.2) * figure.DPI, name
        assert height_px <= (max_height_in + 0.2) * figure.DPI, name


def test_every_allocator_chart_draws_each_allocator_in_its_colour(main_run):
    _, drawn = main_run
    allocators = {"naive_max", "naive_pow2", "naive_oracle", "paged", "paged_prefix"}
    for name in ("headline", "memory_over_time", "batch_size", "latency_vs_rate",
                 "scheduler_comparison"):
        assert drawn[name].allocators == allocators, name
    shares = drawn["headline"].share_bars
    assert [label for label, _ in shares] == [
        name for name in figure.ALLOCATOR_COLORS if name in allocators
    ]
    assert all(color == figure.ALLOCATOR_COLORS[label] for label, color in shares)


def test_the_paper_run_draws_the_papers_bars(paper_run):
    out, drawn = paper_run
    for name in ("headline", "usage_breakdown", "batch_size"):
        assert name in drawn
        assert (out / "plots" / f"{name}.png").is_file()
    svg = (out / "plots" / "usage_breakdown.svg").read_text()
    assert "vLLM paper, Fig. 2" in svg
    assert "naive_max (paper)" in svg
    assert "(paper 20.4)" in (out / "plots" / "headline.svg").read_text()


@pytest.mark.parametrize("experiment", ["block_size_sweep", "preemption", "vllm_fig12"])
def test_sweep_charts_of_the_reference_results_pass_the_layout_checks(experiment, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    drawn: dict[str, Drawn] = {}
    _capture_into(drawn, monkeypatch)
    results = pd.read_parquet(REFERENCE / "results.parquet")
    runs = results[results["experiment"] == experiment]
    if experiment == "vllm_fig12":
        knees = pd.read_parquet(REFERENCE / "knees.parquet")
        sweep_charts.plot_latency_vs_rate(runs, knees[knees["experiment"] == experiment], tmp_path)
    else:
        sweep_charts.plot_latency_vs_block_size(runs, tmp_path, experiment)
    assert len(drawn) == 1
    for name, chart in drawn.items():
        assert chart.problems == [], name


def test_the_capacity_chart_passes_the_layout_checks(tmp_path, monkeypatch):
    drawn: dict[str, Drawn] = {}
    _capture_into(drawn, monkeypatch)
    fleet = pd.read_parquet(REFERENCE / "capacity.parquet")
    capacity_chart.plot_capacity(fleet.drop_duplicates("allocator", keep="last"), tmp_path)
    assert drawn["capacity_cost"].problems == []


# The checks themselves fail on what they exist to catch.


def test_the_overlap_check_catches_crowded_tick_labels():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(range(12), range(12))
    ax.set_xticks(range(12), [f"naive_max\nsharegpt @ {i}/s" for i in range(12)])
    assert overlapping_texts(fig)
    plt.close(fig)


def test_the_legend_check_catches_a_legend_over_a_line():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [1, 1], color=figure.ALLOCATOR_COLORS["paged"], label="paged")
    ax.plot([0, 1], [0, 1], color=figure.ALLOCATOR_COLORS["naive_max"], label="naive_max")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper left")
    assert legends_over_data(fig)
    plt.close(fig)


def test_the_colour_check_catches_the_default_colour_cycle():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="paged")  # matplotlib's first colour, not paged's
    assert foreign_colors(fig)
    plt.close(fig)


# The headline's rate and finding.


def _rows(rate: float, free_pct: dict[str, float], preemptions: dict[str, int]) -> pd.DataFrame:
    return pd.DataFrame([{"allocator": name, "workload": "sharegpt", "request_rate": rate,
                          "free_pct": free, "num_preemptions": preemptions.get(name, 0)}
                         for name, free in free_pct.items()])  # fmt: skip


def test_the_headline_rate_is_the_highest_where_one_allocator_binds_and_another_does_not():
    sweep = pd.concat([
        _rows(1.0, {"naive_max": 50.0, "paged": 90.0}, {}),  # nothing binds
        _rows(2.0, {"naive_max": 3.0, "paged": 80.0}, {}),  # Max binds
        _rows(4.0, {"naive_max": 1.0, "paged": 40.0}, {}),  # Max binds: the contrast, highest
        _rows(8.0, {"naive_max": 1.0, "paged": 30.0}, {"paged": 5}),  # both (paged preempts)
    ])  # fmt: skip
    assert headline_rate(sweep) == 4.0
    assert headline_rate(sweep[sweep["request_rate"] == 8.0]) == 8.0  # every one binds
    assert headline_rate(sweep[sweep["request_rate"] == 1.0]) == 1.0  # none binds
    assert headline_rate(sweep[sweep["request_rate"].isin([1.0, 8.0])]) == 8.0


def test_the_finding_states_held_and_used_memory_and_the_batch_gain():
    rows = pd.DataFrame([
        {"allocator": "naive_max", "kv_held_gb": 15.0, "token_states_gb": 1.5,
         "token_states_pct_of_held": 10.0, "mean_batch_size": 10.0},
        {"allocator": "paged", "kv_held_gb": 10.0, "token_states_gb": 9.9,
         "token_states_pct_of_held": 99.0, "mean_batch_size": 45.0},
    ])  # fmt: skip
    # naive_max holds 10x its tokens (1 / 10 %); paged 1 / 0.99 = 1.01x.
    assert finding(rows) == (
        "naive_max holds 15.0 GB of KV for 1.5 GB of tokens (10.0x); "
        "paged 10.0 GB for 9.9 GB (1.01x) and batches 4.5x the requests"
    )


# The KV budget against hand computations from the catalog's model dimensions.


def test_llama_2_70b_kv_overtakes_its_weights_at_421k_tokens():
    budget = kv_budget(get_deployment("llama-2-70b", "a100-80gb", num_gpus=2))
    assert budget.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert budget.weight_bytes == 68.98e9 * 2
    assert budget.crossover_tokens == pytest.approx(137.96e9 / 327_680)  # 421,020.5
    assert round(budget.crossover_tokens) == 421_021
    # 2 x 80 GiB x 0.9 - 2 x 1 GiB of activations - the weights, in 327,680-byte slots.
    assert budget.pool_tokens == int((2 * (80 * 0.9 - 1) * 2**30 - 137.96e9) // 327_680)


def test_llama_3_8b_kv_overtakes_its_weights_within_one_128k_context():
    budget = kv_budget(get_deployment("llama-3-8b", "a100-80gb"))
    assert budget.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB
    assert budget.crossover_tokens == pytest.approx(8.03e9 * 2 / 131_072)  # 122,528
    assert budget.crossover_tokens < 128 * 1024


def test_replicated_kv_heads_halve_the_crossover():
    # 16 GPUs, 8 KV heads: each head is stored twice, so 655,360 B per token.
    budget = kv_budget(get_deployment("llama-2-70b", "a100-80gb", num_gpus=16))
    assert budget.kv_bytes_per_token == 655_360
    assert budget.crossover_tokens == pytest.approx(137.96e9 / 655_360)


def test_held_slots_follow_each_allocators_rule():
    assert held_slots_per_sequence("naive_max", 300, 4096, 16) == 4096
    assert held_slots_per_sequence("naive_oracle", 300, 4096, 16) == 512
    assert held_slots_per_sequence("naive_oracle", 512, 4096, 16) == 512
    assert held_slots_per_sequence("paged", 300, 4096, 16) == 304
    assert held_slots_per_sequence("paged", 320, 4096, 16) == 320
    with pytest.raises(ValueError, match="naive_pow2"):
        held_slots_per_sequence("naive_pow2", 300, 4096, 16)


def test_budget_series_and_crossover_counts_match_the_hand_numbers():
    budget = kv_budget(get_deployment("llama-2-70b", "a100-80gb", num_gpus=2))
    series = budget_series(budget, [300, 1000], [1, 256], block_size=16)
    row = series[(series["context_tokens"] == 1000) & (series["num_seqs"] == 256)].iloc[0]
    assert row["tokens_in_flight"] == 256_000
    assert row["weights_gb"] == pytest.approx(137.96)
    assert row["kv_used_gb"] == pytest.approx(256_000 * 327_680 / 1e9)  # 83.89 GB
    assert row["kv_held_gb_naive_max"] == pytest.approx(256 * 4096 * 327_680 / 1e9)  # 343.6
    assert row["kv_held_gb_naive_oracle"] == pytest.approx(256 * 1024 * 327_680 / 1e9)
    assert row["kv_held_gb_paged"] == pytest.approx(256 * 1008 * 327_680 / 1e9)
    # Sequences of 1,000 tokens whose KV equals the weights: 421.0 used, 102.8 held under Max.
    assert crossover_num_seqs(budget, None, 1000, 16) == pytest.approx(137.96e9 / 327_680e3)
    assert crossover_num_seqs(budget, "naive_max", 1000, 16) == pytest.approx(
        137.96e9 / (4096 * 327_680)
    )


def test_the_crossover_context_is_the_shortest_that_reaches_the_weights():
    budget = kv_budget(get_deployment("llama-2-70b", "a100-80gb", num_gpus=2))
    # 256 sequences: used reaches 137.96 GB at ceil(137.96e9 / (256 x 327,680)) = 1,645 tokens;
    # paged holds whole 16-token blocks, so it gets there at 1,633 (103 blocks = 1,648 slots).
    assert crossover_context_tokens(budget, None, 256, 16) == 1645
    assert crossover_context_tokens(budget, "paged", 256, 16) == 1633
    # Oracle's buddy block doubles past 1,024: 2,048 slots x 256 reach the weights at 1,025.
    assert crossover_context_tokens(budget, "naive_oracle", 256, 16) == 1025
    assert crossover_context_tokens(budget, "naive_max", 256, 16) == 1  # from the first token
    assert crossover_context_tokens(budget, None, 1, 16) is None  # 4,096 tokens: 1.3 GB


def test_a_long_rate_sweep_shows_evenly_spaced_panels_and_says_so(tmp_path, monkeypatch):
    titles: list[str] = []
    monkeypatch.setattr(run_charts, "save_figure", lambda fig, out_dir, name: titles.append(
        fig.get_suptitle()) or figure.save_figure(fig, out_dir, name))  # fmt: skip
    rates = [float(rate) for rate in range(1, 16)]
    shares = {"token_states_pct": 30.0, "reservation_pct": 10.0, "internal_frag_pct": 20.0,
              "external_frag_pct": 5.0, "free_pct": 35.0}  # fmt: skip
    summary = pd.DataFrame([
        {"allocator": name, "workload": "sharegpt", "request_rate": rate, **shares}
        for rate in rates for name in ("naive_max", "paged")
    ])  # fmt: skip
    with chart_formats(("png", "svg")):
        run_charts.plot_breakdown(summary, tmp_path)
    assert titles == ["KV cache usage breakdown per allocator (12 of 15 rates, evenly spaced)"]
    svg = (tmp_path / "usage_breakdown.svg").read_text()
    assert "sharegpt @ 1 req/s" in svg and "sharegpt @ 15 req/s" in svg
    # Panels i x 14/11 of 0..14, rounded: rates 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15.
    assert "sharegpt @ 3 req/s" not in svg and "sharegpt @ 8 req/s" not in svg
    assert "sharegpt @ 2 req/s" in svg and "sharegpt @ 14 req/s" in svg


def _drawn_by(module, draw, table, tmp_path) -> Drawn:
    drawn: dict[str, Drawn] = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        def capture(fig, out_dir: Path, name: str) -> None:
            drawn[name] = Drawn(fig, out_dir)
            figure.save_figure(fig, out_dir, name)

        monkeypatch.setattr(module, "save_figure", capture)
        draw(table, tmp_path)
    (chart,) = drawn.values()
    return chart


def test_the_kernel_and_equivalence_charts_read_at_a_glance_too(tmp_path):
    """The two task charts outside a simulate run, on tables of their real shape."""
    from kvbench.tasks.equivalence import plot as equivalence_plot
    from kvbench.tasks.kernel_overhead import plot as kernel_plot

    kernels = pd.DataFrame([
        {"block_size": block, "context_len": context, "overhead_pct": 40 / block + context / 900,
         "achieved_gb_per_s": 30 + block + context / 300, "device": "cpu", "backend": "torch"}
        for block in (8, 16, 32, 64) for context in (256, 512, 1024, 2048, 4096, 8192)
    ])  # fmt: skip
    equivalence = pd.DataFrame([
        {"allocator": allocator, "backend": backend, "step": step, "max_rel_diff": 1e-7 * step,
         "model": "smollm2-135m"}
        for allocator in ("paged", "paged_prefix") for backend in ("torch", "gather", "triton")
        for step in range(12)
    ])  # fmt: skip
    for module, draw, table in (
        (kernel_plot, kernel_plot.plot_kernel_overhead, kernels),
        (equivalence_plot, equivalence_plot.plot_equivalence, equivalence),
    ):
        chart = _drawn_by(module, draw, table, tmp_path)
        assert chart.problems == [], draw.__name__
        assert chart.size_in[0] <= figure.MAX_FIGURE_INCHES[0], draw.__name__
        assert chart.size_in[1] <= figure.MAX_FIGURE_INCHES[1], draw.__name__


def test_charts_are_saved_in_the_formats_asked_for_png_alone_by_default(tmp_path):
    def draw(out_dir: Path) -> list[str]:
        fig, axes = plt.subplots()
        axes.plot([1, 2, 3])
        figure.save_figure(fig, out_dir, "chart")
        return sorted(path.name for path in out_dir.iterdir())

    assert draw(tmp_path / "default") == ["chart.png"]
    with chart_formats(("svg", "pdf")):
        assert draw(tmp_path / "asked") == ["chart.pdf", "chart.svg"]
    assert draw(tmp_path / "after") == ["chart.png"]  # the choice ends with its block
    cfg, _, _ = compose_config()
    assert tuple(cfg.plot_formats) == DEFAULT_CHART_FORMATS  # the yaml's default is the module's
    for bad in ((), ("png", "jpg")):
        with pytest.raises(ValueError, match="expected one or more of png, svg, pdf"):
            chart_formats(bad).__enter__()
