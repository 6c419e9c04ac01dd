"""Shared fixtures: composing kvbench configs in-process and running small experiments.

Also switches Triton to its CPU interpreter when there is no CUDA. pytest imports this file before
any test module, and nothing imports triton before it: the variable must be set before the process
first imports triton (triton.language wraps tl.max, tl.sum, ... in triton.jit on import, and
interpreted kernels then fail obscurely). kvbench.kernels imports triton only on first use.
"""

import os
import sys
from pathlib import Path

# `python -m pytest` puts the working directory on sys.path: run from the repository root, its
# `kernels/` (shipped as kvbench.kernels) would then be importable as a top-level `kernels`, the
# name of a Hugging Face package that transformers probes for. Tests import the installed package.
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != REPO_ROOT]

import torch  # noqa: E402

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    if "triton" in sys.modules:
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 could be set")
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402

from kvbench.config import validate_config  # noqa: E402

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
# The real traces under SHARED_TRACES, one file each, that replays and equality tests walk.
SHARED_TRACE_FILES = [
    "sharegpt/sharegpt_val_10k_llama2.csv",
    "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "alpaca/alpaca_5000_gpt2bpe_lengths.csv",
    "azure2023/AzureLLMInferenceTrace_conv.csv",
    "mooncake/conversation_trace.jsonl",
    "arxiv/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
]


def compose_config(*overrides: str):
    """The validated (config, deployment) that `python -m kvbench OVERRIDES` would run."""
    with initialize_config_module(config_module="kvbench.conf", version_base="1.3"):
        raw = compose(config_name="config", overrides=list(overrides))
    typed, deployment = validate_config(raw)
    return typed, deployment, raw


def priced_grid_table(costs, *overrides: str, scale=lambda shape: 1.0):
    """A ``profile.parquet`` table of the cpu grid's points (``task=profile`` of SmolLM2 in fp32,
    with ``overrides``) timed on a device that costs exactly what ``costs`` (a profile's
    coefficients) price, times ``scale(shape)``."""
    from kvbench.engine.profiled import ProfiledCostModel
    from kvbench.tasks.profile.grid import iteration_grid, point_shape
    from kvbench.tasks.profile.table import iteration_row, profile_frame

    cfg, deployment, _ = compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                                        "model.dtype=fp32", *overrides)  # fmt: skip
    rows = []
    for point in iteration_grid(cfg.profile_grid, deployment.model.kv_bytes_per_token):
        shape = point_shape(point)
        model = ProfiledCostModel(costs, point.block_size)
        priced_s = model.iteration_time_s(shape) + model.wake_time_s(point.wait_s)
        measured_s = priced_s * scale(shape)
        rows.append(iteration_row(shape, point.block_size, point.wait_s, measured_s, 0.0, model))
    return profile_frame(rows)


@pytest.fixture
def shared_traces() -> Path:
    """The real traces beside the checkout; skips the test where they are absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"{SHARED_TRACES} is absent (real traces live in ../shared/traces)")
    return SHARED_TRACES


def assert_least_squares_optimum(features, times_s, coefficients, signed=None) -> None:
    """``coefficients`` minimise the relative squared error of ``features`` against ``times_s``
    over all coefficients >= 0 but the ``signed`` ones (Karush-Kuhn-Tucker): moving a positive
    or signed coefficient either way, or raising one at 0, lowers it nowhere."""
    import numpy as np

    targets = np.asarray(times_s, dtype=np.float64)  # [num_points]
    weighted = np.asarray(features, dtype=np.float64) / targets[:, None]  # [num_points, num_terms]
    residual = weighted @ np.asarray(coefficients) - 1.0  # [num_points]
    norms = np.linalg.norm(weighted, axis=0) * np.linalg.norm(residual)  # [num_terms]
    # Each term's slope of the error, as a cosine between its column and the residual.
    slopes = np.divide(weighted.T @ residual, norms, out=np.zeros(len(norms)), where=norms > 0)
    positive = np.asarray(coefficients) > 0
    if signed is not None:
        positive |= np.asarray(signed, dtype=bool)
    assert np.all(np.abs(slopes[positive]) < 1e-6), f"a positive term's slope: {slopes}"
    assert np.all(slopes[~positive] > -1e-6), f"a term at 0 would lower the error: {slopes}"


@pytest.fixture
def kv_memories(monkeypatch) -> list:
    """Every K/V pool (``KVMemory``) made while the test runs, in order."""
    from kvbench.executors.kv_memory import KVMemory

    made: list[KVMemory] = []
    real_init = KVMemory.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(KVMemory, "__init__", recording_init)
    return made


def forbid_model_load(monkeypatch, module) -> None:
    """Make ``module.load_real_model`` fail the test: a check that must refuse before the model
    loads (seconds of it) did not."""

    def never(cfg):
        raise AssertionError("the model was loaded before the profile was checked")

    monkeypatch.setattr(module, "load_real_model", never)
