"""Run one experiment: build the workload, simulate every allocator x rate, write tables and plots.

The edge of the pipeline: it calls the pure engine and does the file writing and plotting.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from kvbench.allocators import Allocator, VAttentionAllocator, VAttentionSettings, make_allocator
from kvbench.allocators.radix import unbounded_radix_hits
from kvbench.allocators.vattention import page_bytes_of
from kvbench.config import KvbenchConfig, run_workloads
from kvbench.core.kv_capacity import HybridPool, hybrid_pool, pool_slots
from kvbench.core.request import Request
from kvbench.core.specs import GIB, Deployment
from kvbench.engine import PageMapping, RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.engine.cost_model import CostModel
from kvbench.engine.cpu_tier_v1 import VLLM_DEFAULTS, CpuOffloadTier, CpuTierPolicy
from kvbench.engine.kv_cache_v1 import V1KVCache
from kvbench.engine.records import SimulationResult
from kvbench.engine.scheduler import rejection_reason
from kvbench.engine.scheduler_v1 import HybridV1Memory, ReservingV1Memory, V1Limits, V1Memory
from kvbench.engine.simulate_v1 import simulate_v1, v1_rejection_reason
from kvbench.plots.time_series import run_memory_chart_rows
from kvbench.tables.parquet import write_frames, write_table
from kvbench.tables.parquet_stream import RunsTable
from kvbench.tables.provenance import provenance
from kvbench.tasks.profile.profile_file import load_profiled_cost_model
from kvbench.tasks.simulate.accounting import workload_accounting
from kvbench.tasks.simulate.per_run_files import StreamedTables, remove_run_files
from kvbench.tasks.simulate.plot import plot_run
from kvbench.tasks.simulate.profile_range import ProfileRange, StepsBeyond
from kvbench.tasks.simulate.real_runner import run_on_real_model
from kvbench.tasks.simulate.table import requests_frame, steps_frame, summarize
from kvbench.workloads import (
    WorkloadConfig,
    check_rate_rescales,
    to_requests,
    with_arrivals,
    workload_rows,
)
from kvbench.workloads.beam_ancestry import load_beam_ancestry
from kvbench.workloads.prefix_reuse import has_prefix_identity, ideal_prefix_reuse

# Longest a run waits before rewriting its steps and requests tables (summary: after every run):
# an experiment shorter than this writes each table once, at the end.
TABLES_EVERY_S = 30.0
# A rewrite of the tables costs more as they grow: the next waits at least this many times as
# long as the last took, so rewrites stay within about a tenth of a long experiment's time.
TABLES_COST_MULTIPLE = 10.0


def scheduler_limits(cfg: KvbenchConfig, deployment: Deployment) -> SchedulerLimits:
    """The scheduler's limits from the config (defaults resolved against the model)."""
    max_model_len = deployment.model.max_model_len
    max_num_batched_tokens = cfg.scheduler.max_num_batched_tokens or max(max_model_len, 2048)
    swap_bytes = cfg.scheduler.swap_space_gib * GIB * deployment.num_gpus
    return SchedulerLimits(
        max_model_len=max_model_len,
        max_num_seqs=cfg.scheduler.max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        preemption=cfg.scheduler.preemption,
        swap_capacity_tokens=int(swap_bytes // deployment.kv_bytes_per_token),
        policy=cfg.scheduler.policy,
    )


def v1_limits(limits: SchedulerLimits, async_scheduling: bool = False) -> V1Limits:
    """The limits ``scheduler=vllm_v1`` reads (it chunks prefills: no prompt is too long for its
    budget), scheduling asynchronously or not."""
    return V1Limits(limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_model_len,
                    async_scheduling)  # fmt: skip


def v1_memory(
    name: str,
    allocator: Allocator,
    limits: V1Limits,
    num_cpu_slots: int = 0,
    cpu_tier_policy: CpuTierPolicy = VLLM_DEFAULTS,
) -> V1Memory:
    """What ``scheduler=vllm_v1`` allocates from for the allocator ``name``
    (docs/scheduling.md): vLLM's own KV-cache manager for ``paged`` (prefix caching off) and
    ``paged_prefix`` (on, with vLLM's CPU offloading over ``num_cpu_slots`` > 0 slots of host
    memory, run by ``cpu_tier_policy``), its hybrid manager for ``paged_hybrid`` and
    ``paged_hybrid_prefix``, the allocator reserving whole spans at admission for the naive
    ones."""
    if name in ("paged", "paged_prefix"):
        chunk_slots = allocator.block_size * cpu_tier_policy.blocks_per_chunk
        num_cpu_chunks = num_cpu_slots // chunk_slots if name == "paged_prefix" else 0
        cpu_tier = (CpuOffloadTier(num_cpu_chunks, allocator.block_size, cpu_tier_policy)
                    if num_cpu_chunks else None)  # fmt: skip
        return V1KVCache(
            allocator.num_slots // allocator.block_size,
            allocator.block_size,
            limits.max_model_len,
            enable_caching=name == "paged_prefix",
            num_slots=allocator.num_slots,
            cpu_tier=cpu_tier,
        )
    if name in ("paged_hybrid", "paged_hybrid_prefix"):
        return HybridV1Memory(allocator, limits)  # type: ignore[arg-type]
    return ReservingV1Memory(allocator, limits.max_model_len)


def _cpu_store_columns(
    memory: V1Memory, result: SimulationResult, deployment: Deployment
) -> dict[str, float]:
    """What a ``vllm_v1`` run wrote to its CPU tier (``cpu_stored_gib``), how long the longest
    step's stores took against the step that copied them, and how long steps waited for
    flushed stores (0 without a tier)."""
    tier = memory.cpu_tier if isinstance(memory, V1KVCache) else None
    stored_tokens = tier.num_stored_blocks * tier.block_size if tier is not None else 0
    return {"cpu_stored_gib": stored_tokens * deployment.kv_bytes_per_token / GIB,
            "cpu_store_step_ratio_max": result.cpu_store_step_ratio_max,
            "cpu_flush_wait_s": result.cpu_flush_wait_s}  # fmt: skip


def _cpu_tier_policy_of(cfg: KvbenchConfig) -> CpuTierPolicy:
    """``scheduler=vllm_v1``'s CPU tier options from ``allocator``."""
    allocator = cfg.allocator
    return CpuTierPolicy(allocator.cpu_eviction_policy, allocator.cpu_store_threshold,
                         allocator.cpu_max_tracker_size, allocator.cpu_offload_prompt_only,
                         allocator.cpu_blocks_per_chunk)  # fmt: skip


def allocator_for(
    cfg: KvbenchConfig, deployment: Deployment, name: str, num_slots: int,
    groups_pool: HybridPool | None,
) -> Allocator:  # fmt: skip
    """A fresh allocator ``name`` for one run of ``cfg``: ``num_slots`` slots (``groups_pool``
    for the hybrid ones), the config's block or page size and CPU tier."""
    return make_allocator(
        name, num_slots, cfg.allocator.block_size, deployment.model.max_model_len,
        radix_page_tokens=cfg.allocator.radix_page_tokens,
        cpu_cache_slots=deployment.slots_in_gib(cfg.allocator.cpu_cache_gib),
        hybrid_pool=groups_pool,
        # The v0 engine gives a sampled token its slot a step before it computes its K/V.
        generated_slot_ahead=cfg.scheduler.name == "vllm_v0",
        vattention=vattention_settings(cfg, deployment, name),
    )  # fmt: skip


def vattention_settings(
    cfg: KvbenchConfig, deployment: Deployment, allocator: str
) -> VAttentionSettings | None:
    """The pages and spans of a vattention allocator (None for any other): tokens per page from
    its page size and the deployment, spans from ``allocator.max_batch_size``."""
    page_bytes = page_bytes_of(allocator, cfg.allocator.page_bytes)
    if page_bytes is None:
        return None
    return VAttentionSettings(
        tokens_per_page=deployment.tokens_per_page(page_bytes),
        max_batch_size=cfg.allocator.max_batch_size or cfg.scheduler.max_num_seqs,
        retain_pages=cfg.allocator.vattention_retain_pages,
    )


def page_mapping(
    cfg: KvbenchConfig, deployment: Deployment, allocator: str | None
) -> PageMapping | None:
    """What mapping pages costs ``allocator``'s iterations (None: nothing, all but vattention)."""
    settings = vattention_settings(cfg, deployment, allocator) if allocator else None
    if settings is None:
        return None
    return PageMapping(
        tokens_per_page=settings.tokens_per_page,
        pages_per_group=2 * deployment.model.num_layers,  # K and V of every layer, per GPU
        latency_s_per_page=cfg.allocator.vattention_map_latency_s,
        overlapped=cfg.allocator.vattention_overlap_mapping,
    )


def cost_model(
    cfg: KvbenchConfig,
    deployment: Deployment,
    allocator: str | None = None,
    kernel_block_size: int | None = None,
) -> CostModel:
    """The cost model the ``executor`` config names: the roofline, with ``allocator``'s page
    mapping priced in (vattention), or (``executor=profiled``) the fitted model of
    ``executor.profile`` for an attention kernel of ``kernel_block_size`` (default
    ``allocator.block_size``; a contiguous allocator's is 1). ``executor=real`` measures its
    iterations; its runs never ask this model."""
    executor = cfg.executor
    if executor.kind == "profiled" and executor.profile:
        block_size = kernel_block_size or cfg.allocator.block_size
        return load_profiled_cost_model(executor.profile, block_size, deployment)
    return RooflineCostModel(
        deployment=deployment,
        compute_efficiency=executor.compute_efficiency,
        bandwidth_efficiency=executor.bandwidth_efficiency,
        pcie_efficiency=executor.pcie_efficiency,
        iteration_overhead_s=executor.iteration_overhead_s,
        allreduce_latency_s=executor.allreduce_latency_s,
        page_mapping=page_mapping(cfg, deployment, allocator),
    )


def _run_labels(
    cfg: KvbenchConfig,
    deployment: Deployment,
    workload: str,
    allocator: str,
    rate: float | None,
) -> dict:
    return {
        "experiment": cfg.experiment_name,
        "scheduler": cfg.scheduler.name,
        "allocator": allocator,
        "workload": workload,
        "request_rate": rate,
        "model": deployment.model.name,
        "hardware": deployment.hardware.name,
        "num_gpus": deployment.num_gpus,
        "block_size": cfg.allocator.block_size,
        "preemption": cfg.scheduler.preemption,
        "policy": cfg.scheduler.policy,
        "async_scheduling": cfg.scheduler.async_scheduling,
        "cpu_cache_gib": cfg.allocator.cpu_cache_gib,
        "cpu_eviction_policy": cfg.allocator.cpu_eviction_policy,
        "cpu_store_threshold": cfg.allocator.cpu_store_threshold,
        "cpu_max_tracker_size": cfg.allocator.cpu_max_tracker_size,
        "cpu_offload_prompt_only": cfg.allocator.cpu_offload_prompt_only,
        "cpu_blocks_per_chunk": cfg.allocator.cpu_blocks_per_chunk,
        "kv_dtype": deployment.model.kv_dtype or deployment.model.dtype,
    }


def _runs(cfg: KvbenchConfig) -> list[tuple[str, WorkloadConfig]]:
    """(label, workload config) per (workload, request rate) the run replays."""
    runs: list[tuple[str, WorkloadConfig]] = []
    for label, workload in run_workloads(cfg).items():
        rates: list[float | None] = [*cfg.request_rates] or [workload.request_rate]
        runs.extend((label, dataclasses.replace(workload, request_rate=rate)) for rate in rates)
    return runs


def _every_workloads_rows(
    runs: list[tuple[str, WorkloadConfig]], max_model_len: int
) -> dict[str, pd.DataFrame]:
    """Each workload's rows (its rates share them), every trace read and every rate checked
    before the first simulation: a bad trace or rate in the last workload stops the experiment
    before it computes anything, not after the first workloads' runs (whose tables it would
    not finish)."""
    rows_by_label: dict[str, pd.DataFrame] = {}
    for label, workload_cfg in runs:
        if label not in rows_by_label:
            rows_by_label[label] = workload_rows(workload_cfg, max_model_len)
        check_rate_rescales(rows_by_label[label], workload_cfg)
    return rows_by_label


def run_experiment(
    cfg: KvbenchConfig,
    deployment: Deployment,
    raw_cfg: DictConfig | None,
    output_dir: Path,
    before_tables: Callable[[pd.DataFrame], None] | None = None,
) -> pd.DataFrame:
    """Simulate every (allocator, rate) of ``cfg``; write summary/steps/requests parquet and plots.

    Returns the summary table; ``before_tables``, when given, is called with it once every run
    is simulated and its charts handed out, before the steps and requests tables are written
    (a study hands out its own charts there, to be drawn beside that write).

    The summary is written after every run. The (larger) steps and requests tables are written
    run by run as the runs end, in a thread beside the next simulation, and published at the end
    (``RunsTable``); the whole tables so far are also written on the way at most every
    ``TABLES_EVERY_S`` seconds (and ``TABLES_COST_MULTIPLE`` times their last write), so an
    interrupted experiment keeps what it finished without rewriting millions of step rows after
    each run; an experiment shorter than ``TABLES_EVERY_S`` writes each once. The memory chart
    gets each run's rows thinned to what it draws (``memory_chart_rows``), not a second copy of
    every step.
    With ``engine.stream_tables`` each run's steps and requests go to their own parquet files in
    ``steps/`` and ``requests/`` as the run goes (``StreamedTables``): memory no longer grows with
    the steps (one run's request records are still held, for its summary).
    """
    max_model_len = deployment.model.max_model_len
    limits = scheduler_limits(cfg, deployment)
    metadata = provenance(raw_cfg)
    num_slots = pool_slots(deployment, cfg.allocator.block_size, cfg.allocator.num_gpu_blocks)
    # paged_hybrid's pool: the model's KV-cache groups, blocks counted as vLLM's hybrid manager.
    groups_pool = hybrid_pool(deployment, cfg.allocator.block_size, cfg.allocator.num_gpu_blocks)
    summaries: list[dict] = []
    plot_steps: list[pd.DataFrame] = []
    streamed = StreamedTables(output_dir, metadata) if cfg.engine.stream_tables else None
    tables = None if streamed else _LargeTables(output_dir, metadata)
    checkpoint = _Checkpoint()
    workload_attrs: dict[str, dict] = {}
    profiled = cfg.executor.kind == "profiled"
    profile_range = ProfileRange.of(cfg, deployment) if profiled else None
    beyond_profile_pct: dict[str, float] = {}  # per workload: its rates share the lengths
    runs = _runs(cfg)
    rows_by_label = _every_workloads_rows(runs, max_model_len)
    try:
        for workload_label, workload_cfg in runs:
            workload = with_arrivals(rows_by_label[workload_label], workload_cfg)
            workload_attrs[workload_label] = dict(workload.attrs)
            requests = to_requests(workload)
            rate = workload.attrs["request_rate"]  # replayed: a burst's inf, an untimed trace's
            beams = load_beam_ancestry() if workload_cfg.beam_width > 1 else None
            ideal_by_design: dict[tuple[bool, int], dict[str, float]] = {}
            v1_pool_slots = num_slots if cfg.scheduler.name == "vllm_v1" else None
            if profile_range is not None and workload_label not in beyond_profile_pct:
                beyond_profile_pct[workload_label] = profile_range.requests_beyond_pct(
                    requests, workload_label)  # fmt: skip
            for name in cfg.allocators:
                # Checkpoint before a run, not after: the last run's tables are written once.
                if tables is not None and tables.num_runs and checkpoint.is_due():
                    checkpoint.write(tables.write_whole)
                allocator = allocator_for(cfg, deployment, name, num_slots, groups_pool)
                costs = cost_model(cfg, deployment, name)
                labels = _run_labels(cfg, deployment, workload_label, name, rate)
                if name == "radix":  # its block-table entry is a page: hit rates count pages
                    labels["block_size"] = allocator.block_size
                ideal_key = (name == "radix", labels["block_size"])
                if ideal_key not in ideal_by_design:
                    ideal_by_design[ideal_key] = _ideal_prefix_columns(
                        requests, limits, labels["block_size"], v1_pool_slots,
                        by_radix_tree=ideal_key[0],
                    )
                ideal = ideal_by_design[ideal_key]
                labels["n"] = workload_cfg.num_samples
                labels["beam_width"] = workload_cfg.beam_width
                step_sink = streamed.start_run(labels, deployment) if streamed else None
                steps_beyond = StepsBeyond(profile_range.bounds if profile_range else None)
                step_sink = steps_beyond.through(step_sink)
                started_s = time.perf_counter()
                with tqdm(
                    total=len(requests),
                    desc=f"{name} @ {rate:g} req/s",
                    unit="req",
                    disable=not cfg.progress,
                ) as bar:
                    measured: dict[str, Any] = {}
                    if cfg.executor.kind == "profiled":  # priced at the allocator's blocks
                        costs = cost_model(cfg, deployment, name, allocator.block_size)
                    if cfg.executor.kind == "real":
                        result, measured = run_on_real_model(cfg, requests, Scheduler(limits),
                                                             allocator, bar.update)  # fmt: skip
                    elif cfg.scheduler.name == "vllm_v1":
                        engine = v1_limits(limits, cfg.scheduler.async_scheduling)
                        cpu_slots = deployment.slots_in_gib(cfg.allocator.cpu_cache_gib)
                        memory = v1_memory(name, allocator, engine, cpu_slots,
                                           _cpu_tier_policy_of(cfg))  # fmt: skip
                        result = simulate_v1(requests, memory, engine, costs, allocator.num_slots,
                                             bar.update, step_sink=step_sink,
                                             fast=cfg.engine.fast)  # fmt: skip
                        measured = _cpu_store_columns(memory, result, deployment)
                    else:
                        result = simulate(requests, Scheduler(limits), allocator, costs, bar.update,
                                          beam_ancestry=beams, fast=cfg.engine.fast,
                                          step_sink=step_sink)
                wall_s = time.perf_counter() - started_s
                request_table = requests_frame(result).assign(**labels)
                summary = {**labels, **summarize(request_table, result, deployment), **ideal,
                           **measured}  # fmt: skip
                summary["simulation_wall_s"] = wall_s
                if profiled:
                    summary["requests_beyond_profile_pct"] = beyond_profile_pct[workload_label]
                    summary["steps_beyond_profile_pct"] = steps_beyond.pct(result.steps)
                settings = vattention_settings(cfg, deployment, name)  # None but for vattention
                summary.update(_virtual_columns(allocator, settings, deployment))
                summaries.append(summary)
                if streamed:
                    streamed.end_run(request_table)
                elif tables is not None:
                    run_steps = steps_frame(result, deployment)
                    tables.add(run_steps, labels, request_table)
                    if cfg.plots:
                        plot_steps.append(run_memory_chart_rows(run_steps, labels))
                write_table(pd.DataFrame(summaries), output_dir / "summary.parquet", metadata)
        if streamed:
            plot_steps = streamed.plot_steps  # thinned as they streamed: the tables are on disk
        summary_table = pd.DataFrame(summaries)
        if profile_range is not None:
            for line in profile_range.steps_warnings(summary_table):
                print(line)
        if cfg.plots:  # first: chart processes draw while this one writes the tables
            plot_run(summary_table, pd.concat(plot_steps, ignore_index=True),
                     output_dir / "plots", deployment, limits.max_num_seqs)  # fmt: skip
        if before_tables is not None:
            before_tables(summary_table)
        if tables is not None:
            tables.close()
    except BaseException:  # an experiment that fails keeps no half-written table
        if tables is not None:
            tables.discard()
        raise
    if cfg.summary_table:  # the end-of-run summary's switch silences this line too
        for label, attrs in workload_attrs.items():
            print(workload_accounting(label, summary_table, attrs))
    return summary_table


def _virtual_columns(
    allocator: Allocator, settings: VAttentionSettings | None, deployment: Deployment
) -> dict[str, float]:
    """The KV address space the allocator reserves, beside the physical memory it holds: every
    allocator but vattention maps its whole pool at startup; vattention reserves a
    ``max_model_len`` span per request it can run (in whole pages) and maps pages into them."""
    if settings is None or not isinstance(allocator, VAttentionAllocator):
        virtual_slots = allocator.num_slots
        num_pages_mapped = 0
    else:
        virtual_slots = allocator.virtual_slots(settings.max_batch_size or 0)
        num_pages_mapped = allocator.num_pages_mapped
    return {
        "virtual_reserved_gb": deployment.slots_to_bytes(virtual_slots) / 1e9,
        "tokens_per_page": settings.tokens_per_page if settings else 0,
        "num_page_groups_mapped": num_pages_mapped,
    }


def _ideal_prefix_columns(
    requests: list[Request],
    limits: SchedulerLimits,
    block_size: int,
    v1_pool_slots: int | None,
    by_radix_tree: bool = False,
) -> dict[str, float]:
    """The hit rates an unbounded prefix cache would reach on exactly the requests the engine can
    serve (NaN when no request names its prefix): the ceiling of ``prefix_hit_rate`` and
    ``prefix_block_hit_rate``, which count admitted requests only. A request rejected on arrival
    (a prompt beyond the context) is never cached and never hits, so it is left out here too.
    ``v1_pool_slots``: the pool under ``scheduler=vllm_v1`` (its own rejections), else None.
    ``by_radix_tree`` computes it with ``unbounded_radix_hits`` (the radix allocator's rows:
    the same figure, fast at page size 1)."""
    if v1_pool_slots is None:
        servable = [request for request in requests if not rejection_reason(request, limits)]
    else:
        engine = v1_limits(limits)
        servable = [
            request for request in requests
            if not v1_rejection_reason(request, engine, v1_pool_slots)
        ]  # fmt: skip
    if not has_prefix_identity(servable):
        return {"ideal_prefix_hit_rate": float("nan"), "ideal_prefix_block_hit_rate": float("nan")}
    if by_radix_tree:  # the same ideal, on runs of tokens: fast at page 1 too
        ordered = sorted(servable, key=lambda request: (request.arrival_s, request.request_id))
        hit_tokens = unbounded_radix_hits(ordered, block_size)
        prompt_tokens = sum(request.prompt_tokens for request in ordered)
        prompt_blocks = sum(-(-request.prompt_tokens // block_size) for request in ordered)
        return {"ideal_prefix_hit_rate": hit_tokens / prompt_tokens,
                "ideal_prefix_block_hit_rate": hit_tokens // block_size / prompt_blocks}
    ideal = ideal_prefix_reuse(servable, block_size)
    return {"ideal_prefix_hit_rate": ideal.token_hit_rate,
            "ideal_prefix_block_hit_rate": ideal.block_hit_rate}  # fmt: skip


class _Checkpoint:
    """When an experiment rewrites its steps and requests tables on the way: ``TABLES_EVERY_S``
    after the last write, and ``TABLES_COST_MULTIPLE`` times as long as that write took."""

    def __init__(self) -> None:
        self._written_s = time.perf_counter()
        self._wait_s = TABLES_EVERY_S

    def is_due(self) -> bool:
        """Whether the wait since the last write is over."""
        return time.perf_counter() - self._written_s >= self._wait_s

    def write(self, write: Callable[..., None], *args: Any) -> None:
        """``write(*args)``, timed: its cost sets the next wait."""
        started_s = time.perf_counter()
        write(*args)
        self._written_s = time.perf_counter()
        self._wait_s = max(TABLES_EVERY_S, TABLES_COST_MULTIPLE * (self._written_s - started_s))


class _LargeTables:
    """An experiment's steps and requests tables: each run's rows kept, and appended to the files
    as the run ends (``RunsTable``, in a thread beside the next simulation); ``close`` publishes
    them (or, when a run's column types differed from the first's, writes them whole). A step's
    labels (the run's ``experiment``, ``allocator``, ...) are added as the rows are written: a
    constant column of every step would cost more to build than the run's steps themselves."""

    def __init__(self, output_dir: Path, metadata: dict[str, str]) -> None:
        remove_run_files(output_dir)  # a streamed experiment's, earlier in this folder
        self.steps_path = output_dir / "steps.parquet"
        self.requests_path = output_dir / "requests.parquet"
        self._metadata = metadata
        self._steps: list[pd.DataFrame] = []
        self._step_labels: list[dict] = []  # each run's labels, for its steps
        self._requests: list[pd.DataFrame] = []
        self._runs_tables = (RunsTable(self.steps_path, metadata),
                             RunsTable(self.requests_path, metadata))  # fmt: skip

    @property
    def num_runs(self) -> int:
        """Runs added so far."""
        return len(self._steps)

    def add(self, steps: pd.DataFrame, labels: dict, requests: pd.DataFrame) -> None:
        """One run's steps (``labels`` added to each as it is written) and requests."""
        self._steps.append(steps)
        self._step_labels.append(labels)
        self._requests.append(requests)
        steps_table, requests_table = self._runs_tables
        steps_table.append(steps, labels)
        requests_table.append(requests)

    def write_whole(self) -> None:
        """Both tables of every run so far, each written at once (a checkpoint)."""
        self._write_steps()
        self._write_requests()

    def close(self) -> None:
        """Publish both tables."""
        steps_table, requests_table = self._runs_tables
        if not steps_table.close():
            self._write_steps()
        if not requests_table.close():
            self._write_requests()

    def discard(self) -> None:
        """Drop what the files' threads wrote (an experiment that failed)."""
        for table in self._runs_tables:
            table.discard()

    def _write_steps(self) -> None:
        write_frames(self._steps, self.steps_path, self._metadata, self._step_labels)

    def _write_requests(self) -> None:
        write_frames(self._requests, self.requests_path, self._metadata)
