"""report.md in every run folder: rendered from known parts, written by a run, a grid, a sweep."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import compose_config
from omegaconf import OmegaConf
from test_run_summary import summary_row

from kvbench.tables.atomic import write_text_atomic
from kvbench.tables.done_marker import mark_done
from kvbench.tables.provenance import git_commit
from kvbench.tasks.simulate.run import run_study
from kvbench.tasks.simulate.run_report import (
    REPORT_NAME,
    Link,
    RunReport,
    ordered_charts,
    render_report,
)
from kvbench.tasks.simulate.run_summary import FileEntry
from kvbench.tasks.simulate.sweep_index import write_sweep_index

TINY = (
    "workload=fixed", "workload.num_requests=30", "workload.prompt_tokens=100",
    "workload.output_tokens=47", "model=opt-13b", "hardware=a100-40gb", "progress=false",
    "summary_table=false", "allocators=[naive_max,paged]",
)  # fmt: skip
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")
LINK = re.compile(r"(?<!!)\[[^\]]*(?:\[[^\]]*\][^\]]*)*\]\(([^)]+)\)")
PROVENANCE = {
    "kvbench_version": "0.1.0", "git_commit": "abc123", "config_yaml": "ignored",
    "written_at": "2026-12-01 16:00:00 UTC", "command": "python -m kvbench x=1",
}  # fmt: skip


def section(markdown: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    assert match, f"no section {heading!r}"
    return match.group(1)


def config_block(markdown: str) -> dict:
    block = re.search(r"```yaml\n(.*?)```", section(markdown, "Configuration (resolved)"), re.S)
    assert block
    return yaml.safe_load(block.group(1))


def test_a_report_renders_every_part_it_is_given():
    summary = pd.DataFrame([summary_row("naive_max", 2.0), summary_row("paged", 2.0)])
    report = RunReport(
        title="demo: llama-2-70b on 4x a100-80gb", summary=summary, provenance=PROVENANCE,
        config_yaml="seed: 0\nallocators: [paged]\n", intro=["- workloads: sharegpt"],
        charts=["plots/zeta.png", "plots/batch_size.png", "plots/usage_breakdown.png"],
        runs=[Link("block_size=8", "block_size=8/report.md")],
        files=[FileEntry("summary.parquet", 35_137)],
    )  # fmt: skip
    text = render_report(report)
    assert text.startswith("# demo: llama-2-70b on 4x a100-80gb\n\n- workloads: sharegpt\n")
    table = section(text, "Summary").strip().splitlines()
    assert table[0].startswith("| allocator | rate req/s | tokens % held | held GB | used GB |")
    assert table[2].startswith("| naive_max | 2 | 25.0 | 20.0 | 5.00 |")
    assert table[3].startswith("| paged | 2 | 25.0 | 20.0 | 5.00 |")
    # Known charts first in the report's order, the others after them by name.
    assert IMAGE.findall(text) == ["plots/usage_breakdown.png", "plots/batch_size.png",
                                   "plots/zeta.png"]  # fmt: skip
    assert "[block_size=8](block_size=8/report.md)" in section(text, "Runs")
    assert "| `summary.parquet` | 35.1 kB |" in section(text, "Files")
    assert config_block(text) == {"seed": 0, "allocators": ["paged"]}
    provenance = section(text, "Provenance")
    for label, value in (("kvbench version", "0.1.0"), ("git commit", "abc123"),
                         ("written", "2026-12-01 16:00:00 UTC"),
                         ("command", "python -m kvbench x=1")):  # fmt: skip
        assert f"| {label} | `{value}` |" in provenance
    assert "ignored" not in text  # the provenance's config is the config section's, once


def test_empty_parts_are_left_out():
    text = render_report(RunReport("bare", pd.DataFrame(), {"git_commit": "abc"}))
    assert re.findall(r"^## (.*)$", text, re.M) == ["Provenance"]


def test_charts_are_ordered_known_first():
    assert ordered_charts(["plots/b.png", "plots/latency_vs_rate.png", "plots/a.png",
                           "plots/usage_breakdown.png"]) == [
        "plots/usage_breakdown.png", "plots/latency_vs_rate.png", "plots/a.png", "plots/b.png"]


def test_the_text_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = write_text_atomic(tmp_path / REPORT_NAME, "first\n")
    assert path.read_text() == "first\n"

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "second\n")
    assert path.read_text() == "first\n"  # the reader still finds the whole old file


def assert_links_resolve(folder: Path, text: str) -> list[str]:
    """Every relative link and image of ``text`` names a file or folder below ``folder``."""
    targets = IMAGE.findall(text) + LINK.findall(text)
    for target in targets:
        assert (folder / target).exists(), f"{target} in {folder / REPORT_NAME} does not exist"
    return targets


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg, deployment, raw = compose_config(*TINY, "request_rates=[1,4]")
    summary = run_study(cfg, deployment, raw, out)
    return out, raw, summary


def test_a_run_folder_tells_its_run_in_report_md(run_folder):
    out, raw, summary = run_folder
    text = (out / REPORT_NAME).read_text()
    assert text.startswith("# default: opt-13b on 1x a100-40gb\n")
    rows = section(text, "Summary").strip().splitlines()[2:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows if row.startswith("|")] == list(
        summary["allocator"])
    charts = IMAGE.findall(text)
    assert set(charts) == {f"plots/{path.name}" for path in (out / "plots").glob("*.png")}
    assert {"plots/usage_breakdown.png", "plots/latency_vs_rate.png"} <= set(charts)
    assert_links_resolve(out, text)
    assert config_block(text) == OmegaConf.to_container(raw, resolve=True)
    assert f"| git commit | `{git_commit()}` |" in section(text, "Provenance")
    assert "`summary.parquet`" in section(text, "Files")


def test_a_grid_root_links_each_points_report_and_each_links_back(tmp_path):
    cfg, deployment, raw = compose_config(*TINY, "request_rates=[2]", "block_sizes=[8,16]",
                                          "plots=false")  # fmt: skip
    run_study(cfg, deployment, raw, tmp_path)
    root = (tmp_path / REPORT_NAME).read_text()
    links = assert_links_resolve(tmp_path, root)
    points = ["block_size=8,preemption=recompute", "block_size=16,preemption=recompute"]
    assert [f"{point}/{REPORT_NAME}" for point in points] == [
        link for link in links if link.endswith(REPORT_NAME)]
    assert "block_size" in section(root, "Summary").splitlines()[1]  # the label that varies
    assert "Charts were not drawn (`plots=false`)." in root
    for point in points:
        text = (tmp_path / point / REPORT_NAME).read_text()
        assert f"One run of [the study](../{REPORT_NAME})." in text
        assert_links_resolve(tmp_path / point, text)
        assert config_block(text)["allocator"]["block_size"] == int(point.split(",")[0][11:])


def test_a_sweep_root_links_every_job_and_tables_their_rows(tmp_path):
    for rate in (1, 4):
        job = tmp_path / f"workload.request_rate={rate}"
        cfg, deployment, raw = compose_config(*TINY, f"workload.request_rate={rate}",
                                              "plots=false")  # fmt: skip
        run_study(cfg, deployment, raw, job)
        mark_done(job, "fingerprint", 1.0)
    (tmp_path / "unfinished").mkdir()  # no DONE: not a job of the sweep
    text = write_sweep_index(tmp_path, "python -m kvbench -m x=1,2").read_text()
    assert text.startswith("# default: a sweep of 2 jobs\n")
    links = assert_links_resolve(tmp_path, text)
    assert links == [f"workload.request_rate={rate}/{REPORT_NAME}" for rate in (1, 4)]
    rows = [row.split(" | ") for row in section(text, "Summary").splitlines()
            if row.startswith("| naive_max") or row.startswith("| paged")]  # fmt: skip
    assert sorted((row[1], row[2]) for row in rows) == [("1", "1"), ("1", "1"), ("4", "2"),
                                                         ("4", "2")]  # fmt: skip


def test_a_multirun_writes_the_sweep_index(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kvbench", "-m", *TINY, "plots=false",
                           "workload.request_rate=1,4", f"hydra.sweep.dir={tmp_path}"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = (tmp_path / REPORT_NAME).read_text()
    links = assert_links_resolve(tmp_path, text)
    assert len(links) == 2 and all(link.endswith(f"/{REPORT_NAME}") for link in links)
    command = section(text, "Provenance")
    assert "python -m kvbench -m" in command and "workload.request_rate=1,4" in command
