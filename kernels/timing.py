"""Timing kernels: medians on a GPU (``triton.testing.do_bench``) or the CPU, and copy bandwidth."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .bench_batch import DecodeBatch
from .decode_attention import contiguous_decode_attention, paged_decode_attention


@dataclass(frozen=True)
class PairTiming:
    """Paged vs contiguous on the same batch.

    Attributes:
        paged_ms, contiguous_ms: median time of one call, in milliseconds.
        ratio: paged / contiguous; on the CPU the median of per-round ratios (each round times
            both back to back, so slow drifts of the machine cancel).
    """

    paged_ms: float
    contiguous_ms: float
    ratio: float


def _cpu_ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def gpu_median_ms(fn: Callable[[], object]) -> float:
    """Median of ``triton.testing.do_bench`` (which flushes L2 between runs), in ms."""
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


def batch_calls(
    batch: DecodeBatch, backend: str, paged_repeats: int = 1
) -> tuple[Callable[[], object], Callable[[], object]]:
    """(paged call, contiguous call) on ``batch``, with the same planning bound.

    ``paged_repeats`` > 1 runs the paged kernel that many times per call: the kernel gate's
    self-test uses it to show that a slower paged path fails the gate.
    """

    def paged() -> object:
        for _ in range(paged_repeats):
            out = paged_decode_attention(
                batch.query, batch.key_cache, batch.value_cache, batch.layout.block_tables,
                batch.layout.context_lens, backend=backend, max_context_len=batch.max_context_len,
            )  # fmt: skip
        return out

    def contiguous() -> object:
        return contiguous_decode_attention(
            batch.query, batch.key, batch.value, batch.layout.context_lens, backend=backend,
            max_context_len=batch.max_context_len,
        )  # fmt: skip

    return paged, contiguous


def time_pair(
    paged: Callable[[], object],
    contiguous: Callable[[], object],
    device: torch.device | str,
    repeats: int = 7,
    warmup: int = 1,
) -> PairTiming:
    """Time two calls that do the same work; GPU: do_bench medians, CPU: ``repeats`` rounds."""
    if torch.device(device).type == "cuda":
        paged_ms, contiguous_ms = gpu_median_ms(paged), gpu_median_ms(contiguous)
        return PairTiming(paged_ms, contiguous_ms, paged_ms / contiguous_ms)
    for _ in range(warmup):
        paged(), contiguous()
    paged_times, contiguous_times = [], []
    for round_index in range(repeats):
        # Alternate which goes first, so neither always runs on a cache the other warmed.
        if round_index % 2:
            contiguous_times.append(_cpu_ms(contiguous))
            paged_times.append(_cpu_ms(paged))
        else:
            paged_times.append(_cpu_ms(paged))
            contiguous_times.append(_cpu_ms(contiguous))
    ratios = [p / c for p, c in zip(paged_times, contiguous_times, strict=True)]
    return PairTiming(
        statistics.median(paged_times), statistics.median(contiguous_times),
        statistics.median(ratios),
    )  # fmt: skip


def device_copy_gb_per_s(device: torch.device | str, num_bytes: int = 1 << 30) -> float:
    """Bus throughput of a plain tensor copy of ``num_bytes``: (bytes read + written) / s, in GB/s.

    The yardstick for attention's achieved bandwidth (bytes it reads / time; its writes are
    negligible): both count every byte that crosses the memory bus, so their ratio is the share of
    a streaming copy's speed the kernel reaches.
    """
    num_elems = num_bytes // 2
    source = torch.empty(num_elems, dtype=torch.float16, device=device)  # [num_elems]
    target = torch.empty_like(source)  # [num_elems]

    def copy() -> object:
        return target.copy_(source)

    if torch.device(device).type == "cuda":
        seconds = gpu_median_ms(copy) / 1e3
    else:
        copy()
        seconds = statistics.median(_cpu_ms(copy) for _ in range(5)) / 1e3
    return 2 * num_bytes / seconds / 1e9
