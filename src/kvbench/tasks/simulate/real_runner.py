"""``executor=real`` inside a simulate run: the model loaded once, each run on the wall clock.

The edge between the experiment loop and ``kvbench.executors``: it loads the run's model (the
equivalence harness's loader, offline), pins torch's threads, and runs one allocator's requests
through ``executors.real.run_real`` (docs/sim_to_real.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from kvbench.allocators.base import Allocator
from kvbench.config import KvbenchConfig
from kvbench.core.request import Request
from kvbench.engine.records import SimulationResult
from kvbench.engine.scheduler import Scheduler

TORCH_DTYPES = ("fp32", "bf16", "fp16")


def load_real_model(name: str, dtype: str) -> Any:
    """The catalog model ``name`` as a transformers causal LM in ``dtype`` (cached per process:
    every run of an experiment shares one copy)."""
    return _load(name, dtype)


@lru_cache(maxsize=2)
def _load(name: str, dtype: str) -> Any:
    import torch

    from kvbench.tasks.equivalence.models import load_model

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    return load_model(name, torch_dtype)


def pin_threads(num_threads: int | None) -> None:
    """Give torch ``num_threads`` threads (None: leave torch's choice)."""
    if num_threads is not None:
        import torch

        torch.set_num_threads(num_threads)


def run_on_real_model(
    cfg: KvbenchConfig,
    requests: Sequence[Request],
    scheduler: Scheduler,
    allocator: Allocator,
    on_finish: Callable[[int], None] | None,
) -> tuple[SimulationResult, dict[str, Any]]:
    """Serve ``requests`` on the real model; returns the engine's result and the summary's
    measured columns (``docs/metrics.md``)."""
    from kvbench.executors.real import RealExecutor, run_real

    pin_threads(cfg.executor.num_threads)
    executor = RealExecutor(load_real_model(cfg.model.name, cfg.model.dtype), allocator,
                            cfg.executor.decode_backend)
    executor.warm_up()
    run = run_real(requests, scheduler, allocator, executor, on_finish)
    measured: dict[str, Any] = {
        "executor": "real",
        "kv_pool_bytes": run.kv_pool_bytes,
        "peak_rss_bytes": run.peak_rss_bytes,
        "num_forwards": run.num_forwards,
    }
    return run.result, measured
