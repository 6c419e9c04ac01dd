"""The radix_offload experiment's report section and charts, on summary rows of its shape."""

from __future__ import annotations

import pandas as pd
import pytest
from chart_layout import layout_problems

from kvbench.plots import prefix_tiers
from kvbench.tasks.report.sections import radix_offload_section


def _summary() -> pd.DataFrame:
    rows = []
    designs = [("paged_prefix", 16), ("radix", 1), ("radix", 16)]
    for workload, ideal in (("mooncake", 0.325), ("sharegpt_multiturn", 0.777)):
        for allocator, size in designs:
            for tier_gib, cpu_share in ((0, 0.0), (512, 0.04), (2048, 0.09), (8192, 0.15)):
                for policy in ("fcfs", "lpm") if tier_gib == 0 else ("fcfs",):
                    gpu = 0.108 + (0.002 if allocator == "radix" else 0.0)
                    rows.append({
                        "experiment": "radix_offload", "workload": workload,
                        "allocator": allocator, "block_size": size, "cpu_cache_gib": tier_gib,
                        "policy": policy, "model": "qwen2.5-72b", "hardware": "h100-80gb",
                        "num_gpus": 8, "prefix_gpu_hit_rate": gpu,
                        "prefix_cpu_hit_rate": cpu_share, "prefix_hit_rate": gpu + cpu_share,
                        "ideal_prefix_hit_rate": ideal, "request_throughput": 2.6 + cpu_share,
                        "ttft_p50_s": 5.0 - 10 * cpu_share,
                    })  # fmt: skip
    return pd.DataFrame(rows)


def test_the_section_tabulates_designs_and_tiers() -> None:
    text = radix_offload_section(_summary())
    assert "| mooncake | radix | 1 | lpm |" in text
    assert "| mooncake | paged_prefix | 16 | 8192 | 10.80 | 15.00 | 25.80 |" in text
    assert radix_offload_section(_summary().assign(experiment="other")) == ""


@pytest.mark.parametrize("draw", [
    lambda summary, out: prefix_tiers.page_size_chart(summary, out),
    lambda summary, out: prefix_tiers.cpu_tier_chart(summary, out, "mooncake"),
])
def test_the_charts_draw_each_design_in_its_colour_without_overlaps(draw, tmp_path, monkeypatch):
    figures = []
    original_save = prefix_tiers.save_figure

    def keep(fig, out_dir, name):
        figures.append(fig)
        assert layout_problems(fig) == []
        original_save(fig, out_dir, name)

    monkeypatch.setattr(prefix_tiers, "save_figure", keep)
    summary = _summary()
    assert draw(summary[summary["policy"] == "fcfs"], tmp_path)
    assert len(figures) == 1 and list(tmp_path.glob("*.png"))


def test_the_tier_chart_needs_two_tier_sizes(tmp_path) -> None:
    summary = _summary()
    assert not prefix_tiers.cpu_tier_chart(summary[summary["cpu_cache_gib"] == 0], tmp_path,
                                           "mooncake")  # fmt: skip
