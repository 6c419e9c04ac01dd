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

# The catalog entry's keys a model is loaded (or built, for random weights) from.
MODEL_KEYS = ("name", "dtype", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
              "hidden_size", "max_model_len", "vocab_size", "intermediate_size", "tied_embeddings")


def load_real_model(cfg: KvbenchConfig) -> Any:
    """The run's model as a transformers causal LM in ``model.dtype`` on ``executor.device``
    (cached per process: every run of an experiment shares one copy): the catalog's offline
    weights, ``executor.model_dir``'s, or random weights of the catalog entry's shape
    (``executor.weights``), its matmuls through ``executor.linear_backend``."""
    from kvbench.executors.names import resolve_device

    executor = cfg.executor
    # What the loaders read of the catalog entry, hashable for the cache.
    model_values = tuple((key, getattr(cfg.model, key)) for key in MODEL_KEYS)
    return _load(model_values, executor.weights, executor.model_dir,
                 resolve_device(executor.device), executor.linear_backend)  # fmt: skip


@lru_cache(maxsize=2)
def _load(model_values: tuple[tuple[str, Any], ...], weights: str, model_dir: str | None,
          device: str, linear_backend: str) -> Any:  # fmt: skip
    model = _load_weights(model_values, weights, model_dir, device)
    if linear_backend == "onednn":
        from kvbench.executors.onednn_linear import use_onednn_linears

        use_onednn_linears(model)
    return model


def _load_weights(model_values: tuple[tuple[str, Any], ...], weights: str,
                  model_dir: str | None, device: str) -> Any:  # fmt: skip
    import torch

    from kvbench.executors.forward import model_kv_shape
    from kvbench.tasks.equivalence.models import (
        catalog_llama_config,
        load_model,
        load_model_dir,
        random_model,
    )

    model = dict(model_values)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        model["dtype"]
    ]
    if weights == "random":
        return random_model(catalog_llama_config(model), torch_dtype, device)
    if model_dir is None:
        return load_model(model["name"], torch_dtype).to(device)
    loaded = load_model_dir(model_dir, torch_dtype, device)
    catalog_shape = (model["num_layers"], model["num_kv_heads"], model["head_dim"])
    if model_kv_shape(loaded) != catalog_shape:
        raise ValueError(
            f"executor.model_dir={model_dir} holds a model of (layers, KV heads, head dim) "
            f"{model_kv_shape(loaded)}, model={model['name']} says {catalog_shape}: the pool is "
            "sized by the catalog entry, so pick the entry of that model (or add one)"
        )
    return loaded


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
    executor = RealExecutor(load_real_model(cfg), allocator, cfg.executor.decode_backend,
                            cfg.model.kv_dtype)  # fmt: skip
    executor.warm_up(scheduler.limits)
    run = run_real(requests, scheduler, allocator, executor, on_finish)
    measured: dict[str, Any] = {
        "executor": "real",
        "kv_pool_bytes": run.kv_pool_bytes,
        "peak_rss_bytes": run.peak_rss_bytes,
        "peak_device_bytes": run.peak_device_bytes,
        "num_forwards": run.num_forwards,
    }
    return run.result, measured
