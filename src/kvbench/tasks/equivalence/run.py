"""``python -m kvbench experiment=logit_equivalence``: paged vs stock logits, step by step."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from kvbench.executors.kv_memory import kv_storage_dtype
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.equivalence.batched import batched_trajectories
from kvbench.tasks.equivalence.cases import PromptCase, shared_prefix_cases
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import SMOLLM2
from kvbench.tasks.equivalence.padded import PoolMemory, StockMemory, padded_trajectories
from kvbench.tasks.equivalence.plot import plot_equivalence
from kvbench.tasks.equivalence.prompts import chat_prompt_ids, instructions, random_prompt_ids
from kvbench.tasks.equivalence.table import EQUIVALENCE_COLUMNS, comparison_rows, verdicts
from kvbench.tasks.equivalence.trajectories import blocks_needed
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report

_TORCH_DTYPES = {"fp32": torch.float32}


def build_cases(model_name: str, model: Any, num_prompts: int, num_samples: int,
                seed: int) -> list[PromptCase]:  # fmt: skip
    """The run's prompts: Alpaca instructions in SmolLM2's chat template, or seeded random ids
    for the tiny models; their common leading tokens form the shared prefix."""
    if model_name == SMOLLM2:
        from kvbench.workloads.tokenizer import load_tokenizer

        prompts = chat_prompt_ids(load_tokenizer(), instructions(num_prompts))
    else:
        prompts = random_prompt_ids(num_prompts, model.config.vocab_size, seed)
    return shared_prefix_cases(prompts, num_samples)


def run_logit_equivalence(
    cfg: Any, deployment: Any, raw_cfg: Any, output_dir: Path
) -> pd.DataFrame:
    """Decode the prompts with the stock cache (every sample in one padded batch:
    ``padded.py``), then through every (allocator, backend) pair (``backend_trajectories``);
    write ``equivalence.parquet`` (after each pair), ``plots/equivalence.png`` and
    ``report.md``, print the verdicts (and, unless ``summary_table=false``, the files).
    ``deployment`` is not used (the model is ``equivalence.model``)."""
    settings = cfg.equivalence
    started_s = time.perf_counter()
    model = load_model(settings.model, _TORCH_DTYPES[settings.dtype], seed=cfg.seed)
    cases = build_cases(settings.model, model, settings.num_prompts, settings.num_samples,
                        cfg.seed)  # fmt: skip
    steps = settings.num_decode_steps
    stock = padded_trajectories(model, StockMemory(model), cases, steps)
    rows: list[dict[str, object]] = []
    table = pd.DataFrame(columns=list(EQUIVALENCE_COLUMNS))
    for allocator in settings.allocators:
        for backend in settings.backends:
            paged = backend_trajectories(model, allocator, backend, cases, steps,
                                        settings.block_size, cfg.seed, stock,
                                        kv_storage_dtype(settings.kv_dtype),
                                        settings.kv_scales == "calibrated")  # fmt: skip
            labels = {"model": settings.model, "allocator": allocator, "backend": backend,
                      "dtype": settings.dtype, "kv_dtype": settings.kv_dtype or settings.dtype,
                      "kv_scales": settings.kv_scales}  # fmt: skip
            rows.extend(comparison_rows(labels, paged, stock))
            table = pd.DataFrame(rows, columns=list(EQUIVALENCE_COLUMNS))
            write_table(table, output_dir / "equivalence.parquet", provenance(raw_cfg))
    if cfg.plots:
        plot_equivalence(table, output_dir / "plots")
    _print_summary(table, len(cases), settings, time.perf_counter() - started_s)
    verdict_lines = "\n".join(f"- {verdict.line()}" for verdict in verdicts(table))
    write_task_report(output_dir, f"{cfg.experiment_name}: {settings.model} logits, paged vs "
                      "stock cache", raw_cfg, [f"## Verdicts\n\n{verdict_lines}"])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def backend_trajectories(model: Any, allocator: str, backend: str, cases: list[PromptCase],
                        steps: int, block_size: int, seed: int, stock: dict,
                        kv_dtype: torch.dtype | None = None,
                        calibrate_scales: bool = False) -> dict:  # fmt: skip
    """Every case's samples at once: a kernel backend through the real executor's forward
    (``batched``); ``gather`` in the stock cache's own padded batch, with the allocator's pools
    as its cache (``padded``), since its check is bit-identity, which another batch layout's
    rounding would blur (by ~1e-7). The pools store K/V in ``kv_dtype`` (fp8; None: the
    model's), scaled as ``calibrate_scales`` says. Every sample is teacher-forced on the
    ``stock`` trajectory's tokens, so a step's logits are compared on the same context (one
    early divergence does not make every later step differ)."""
    if backend == "gather":
        num_blocks = blocks_needed(cases, steps, block_size, all_at_once=True)
        memory = PoolMemory(model, allocator, num_blocks, block_size, seed, kv_dtype,
                            calibrate_scales)  # fmt: skip
        return padded_trajectories(model, memory, cases, steps, stock)
    return batched_trajectories(model, allocator, backend, cases, steps, block_size, seed, stock,
                                kv_dtype, calibrate_scales)  # fmt: skip


def _print_summary(table: pd.DataFrame, num_prompts: int, settings: Any, elapsed_s: float) -> None:
    kv = f", K/V in {settings.kv_dtype} ({settings.kv_scales} scales)" if settings.kv_dtype else ""
    print(f"logit equivalence: {settings.model} ({settings.dtype}{kv}), {num_prompts} prompts x "
          f"{settings.num_samples} samples x {settings.num_decode_steps} decode steps, block "
          f"size {settings.block_size}, {elapsed_s:.0f} s")  # fmt: skip
    for verdict in verdicts(table):
        print("  " + verdict.line())
