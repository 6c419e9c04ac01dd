"""The other tasks' ends: kernel_overhead prints its overhead table; both write report.md."""

import re

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.tasks.equivalence.run import run_logit_equivalence
from kvbench.tasks.kernel_overhead.run import run_kernel_overhead
from kvbench.tasks.kernel_overhead.summary import overhead_cells, overhead_text
from kvbench.tasks.simulate.run_report import REPORT_NAME

KERNELS = (
    "experiment=kernel_overhead", "kernel_bench.block_sizes=[8,32]",
    "kernel_bench.context_lens=[100,256]", "kernel_bench.batch_size=3", "kernel_bench.repeats=1",
    "kernel_bench.warmup_steps=50", "workload.num_requests=150", "progress=false",
)  # fmt: skip
EQUIVALENCE = (
    "experiment=logit_equivalence", "equivalence.model=tiny-llama-gqa",
    "equivalence.num_prompts=2", "equivalence.num_decode_steps=6", "plots=false",
)  # fmt: skip


def kernel_rows(*cells):
    return pd.DataFrame([
        {"device": "cpu", "backend": "torch", "block_size": block, "batch_size": 8,
         "context_len": context, "overhead_pct": overhead,
         "virtual_overhead_pct": overhead + 1.0}
        for block, context, overhead in cells
    ])  # fmt: skip


def test_the_overhead_table_is_block_size_by_context_length():
    table = kernel_rows((16, 512, 4.04), (16, 256, -2.5), (8, 256, 12.0))
    header, rows = overhead_cells(table)
    assert header == ["block size", "256 tok", "512 tok"]
    assert rows == [["8", "+12.0", "-"], ["16", "-2.5", "+4.0"]]
    text = overhead_text(table)
    assert text.splitlines()[0] == ("kernel overhead: paged vs contiguous decode attention, torch "
                                    "on cpu, batch 8: paged time / contiguous time - 1, in %")
    assert text.splitlines()[2].split() == ["block", "size", "256", "tok", "512", "tok"]
    # Then the same table against vAttention's virtual-contiguous layout.
    virtual = text.split("\n\n")[2:]
    assert virtual[0].startswith("paged vs virtual-contiguous")
    assert virtual[1].splitlines()[1].split() == ["8", "+13.0", "-"]


def test_a_kernel_run_prints_its_overhead_and_writes_its_report(tmp_path, capsys):
    cfg, deployment, raw = compose_config(*KERNELS)
    table = run_kernel_overhead(cfg, deployment, raw, tmp_path)
    printed = capsys.readouterr().out
    assert overhead_text(table) in printed and "report.md" in printed
    report = (tmp_path / REPORT_NAME).read_text()
    assert report.startswith("# kernel_overhead: llama-3-8b attention on cpu\n")
    assert "| block size | 100 tok | 256 tok |" in report
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report) == ["plots/kernel_overhead.png"]
    assert "kernel_bench:" in report  # the resolved config
    quiet_cfg, _, quiet_raw = compose_config(*KERNELS, "summary_table=false")
    run_kernel_overhead(quiet_cfg, deployment, quiet_raw, tmp_path)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("summary_table", [True, False])
def test_an_equivalence_run_writes_its_verdicts_in_its_report(tmp_path, capsys, summary_table):
    cfg, deployment, raw = compose_config(*EQUIVALENCE, f"summary_table={summary_table}")
    run_logit_equivalence(cfg, deployment, raw, tmp_path)
    printed = capsys.readouterr().out
    assert ("results in" in printed) is summary_table
    report = (tmp_path / REPORT_NAME).read_text()
    verdicts = [line for line in report.splitlines() if line.startswith("- PASS")]
    assert len(verdicts) == 6  # paged and paged_prefix x torch, sdpa and gather
    assert all(verdict[2:] in printed for verdict in verdicts)  # the lines the run printed
