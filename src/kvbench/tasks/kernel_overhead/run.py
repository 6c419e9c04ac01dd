"""``task=kernel_overhead``: what paging costs decode attention, on block tables from a replay.

For each block size the workload is replayed through the engine with the paged allocator; the
busiest iteration after ``kernel_bench.warmup_steps`` (most KV blocks in its decode batch) is
snapshotted, its block tables are dealt into batches of each context length
(``kvbench.kernels.deal_block_tables``), random K/V is written into both layouts, and the paged
and contiguous kernels are timed on the same logical data: Triton on a GPU, the torch backend on
one CPU thread otherwise. The contiguous kernel is also timed over vAttention's layout (each
sequence in a span of ``max_model_len`` tokens: virtual-contiguous). Writes ``kernels.parquet``
and ``plots/kernel_overhead.png``.
Method and reading: ``docs/kernels.md``; columns: ``docs/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig

from kvbench.allocators import make_allocator
from kvbench.allocators.base import Allocator
from kvbench.config import KvbenchConfig
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine import Scheduler, simulate
from kvbench.engine.scheduler import Batch
from kvbench.kernels import (
    batch_calls,
    block_stream,
    deal_block_tables,
    materialize_batch,
    time_pair,
    virtual_spans,
)
from kvbench.kernels.bench_batch import TORCH_DTYPES
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.kernel_overhead.plot import plot_kernel_overhead
from kvbench.tasks.kernel_overhead.summary import overhead_markdown, overhead_text
from kvbench.tasks.kernel_overhead.table import kernel_row, kernel_table
from kvbench.tasks.simulate.experiment import cost_model, scheduler_limits
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report
from kvbench.workloads import build_workload, to_requests


class BusiestBatch:
    """Engine observer: block tables of the decode batch holding the most blocks after warm-up."""

    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.num_steps = 0
        self.num_blocks = -1
        self.step = -1
        self.block_tables: list[tuple[int, ...]] = []

    def __call__(self, batch: Batch, allocator: Allocator) -> None:
        self.num_steps += 1
        if self.num_steps <= self.warmup_steps:
            return
        tables = [allocator.block_table(seq.seq_id) for seq in batch.decode]
        num_blocks = sum(len(table) for table in tables)
        if num_blocks > self.num_blocks:
            self.num_blocks, self.step, self.block_tables = num_blocks, self.num_steps, tables


def replay_block_tables(
    cfg: KvbenchConfig, deployment: Deployment, requests: list[Request], block_size: int
) -> list[tuple[int, ...]]:
    """The busiest post-warm-up decode batch's block tables, replaying with the paged allocator.

    ValueError when the replay has no iteration past ``kernel_bench.warmup_steps``.
    """
    max_model_len = deployment.model.max_model_len
    allocator = make_allocator("paged", deployment.num_kv_slots, block_size, max_model_len)
    observer = BusiestBatch(cfg.kernel_bench.warmup_steps)
    simulate(
        requests, Scheduler(scheduler_limits(cfg, deployment)), allocator,
        cost_model(cfg, deployment), on_step=observer,
    )  # fmt: skip
    if not observer.block_tables:
        raise ValueError(
            f"the replay ran {observer.num_steps} iterations, none with a decode batch after "
            f"kernel_bench.warmup_steps={cfg.kernel_bench.warmup_steps}: lower it or replay more "
            "requests"
        )
    return observer.block_tables


def kernel_heads(deployment: Deployment) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) one GPU's attention sees under tensor parallelism.

    KV heads are replicated when there are more GPUs than KV heads, as vLLM does.
    """
    model, num_gpus = deployment.model, deployment.num_gpus
    return (
        max(1, model.num_attention_heads // num_gpus),
        max(1, model.num_kv_heads // num_gpus),
        model.head_dim,
    )


def storage_dtype(cfg: KvbenchConfig) -> torch.dtype:
    """The K/V dtype timed: ``kernel_bench.dtype``, else the model's (fp8 falls back to fp16)."""
    name = cfg.kernel_bench.dtype or cfg.model.dtype
    return TORCH_DTYPES.get(name, torch.float16)


def _device() -> tuple[torch.device, str, str]:
    """(device, its name for the table, backend): Triton on a GPU, torch on the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda")
        return device, torch.cuda.get_device_name(device), "triton"
    return torch.device("cpu"), "cpu", "torch"


@contextmanager
def _one_cpu_thread() -> Iterator[None]:
    """torch on one CPU thread meanwhile: timings comparable between runs and machines, not
    spread over cores other work is using. The caller's thread count comes back after."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(num_threads)


def measure_block_size(
    cfg: KvbenchConfig, deployment: Deployment, requests: list[Request], block_size: int
) -> list[dict]:
    """One row per context length: paged vs contiguous on batches dealt from the replay."""
    device, device_name, backend = _device()
    bench = cfg.kernel_bench
    num_q_heads, num_kv_heads, head_dim = kernel_heads(deployment)
    stream = block_stream(replay_block_tables(cfg, deployment, requests, block_size))
    rows = []
    for context_len in bench.context_lens:
        tables = deal_block_tables(stream, context_len, block_size, bench.batch_size)
        if not tables:
            raise ValueError(
                f"the replay's busiest batch holds {len(stream)} blocks of {block_size}: too few "
                f"for one sequence of {context_len} tokens; replay a busier workload"
            )
        batch = materialize_batch(
            tables, [context_len] * len(tables), block_size, num_q_heads, num_kv_heads,
            head_dim, storage_dtype(cfg), device, seed=cfg.seed,
        )  # fmt: skip
        paged, contiguous = batch_calls(batch, backend)
        timing = time_pair(paged, contiguous, device, repeats=bench.repeats)
        # vAttention's layout: the contiguous kernel over spans of the model's maximum length.
        key_view, value_view = virtual_spans(batch, max(deployment.model.max_model_len,
                                                        batch.max_context_len))  # fmt: skip
        virtual = replace(batch, key=key_view, value=value_view)
        _, virtual_contiguous = batch_calls(virtual, backend)
        virtual_timing = time_pair(paged, virtual_contiguous, device, repeats=bench.repeats)
        del key_view, value_view, virtual  # the spans hold max_model_len tokens per sequence
        rows.append(kernel_row(device_name, backend, block_size, context_len, batch, timing,
                               virtual_timing))  # fmt: skip
    return rows


def run_kernel_overhead(
    cfg: KvbenchConfig, deployment: Deployment, raw_cfg: DictConfig | None, output_dir: Path
) -> pd.DataFrame:
    """Time paged vs contiguous decode attention; write ``kernels.parquet``, the plots and
    ``report.md``, and (unless ``summary_table=false``) print the overhead table and the files.

    The table is written after every block size, so an interrupted run keeps what it finished.
    """
    requests = to_requests(build_workload(cfg.workload, deployment.model.max_model_len))
    metadata = provenance(raw_cfg)
    rows: list[dict] = []
    for block_size in cfg.kernel_bench.block_sizes:
        with _one_cpu_thread():
            rows.extend(measure_block_size(cfg, deployment, requests, block_size))
        table = kernel_table(rows)
        write_table(table, output_dir / "kernels.parquet", metadata)
    if cfg.plots:
        plot_kernel_overhead(table, output_dir / "plots")
    title = f"{cfg.experiment_name}: {deployment.model.name} attention on {table['device'].iloc[0]}"
    write_task_report(output_dir, title, raw_cfg, [overhead_markdown(table)])
    if cfg.summary_table:
        print("\n" + overhead_text(table))
        print_files(output_dir)
    return table
