"""Shared fixtures: composing kvbench configs in-process and running small experiments."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from kvbench.config import validate_config

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def compose_config(*overrides: str):
    """The validated (config, deployment) that `python -m kvbench OVERRIDES` would run."""
    with initialize_config_module(config_module="kvbench.conf", version_base="1.3"):
        raw = compose(config_name="config", overrides=list(overrides))
    typed, deployment = validate_config(raw)
    return typed, deployment, raw


@pytest.fixture
def shared_traces() -> Path:
    """The real traces beside the checkout; skips the test where they are absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"{SHARED_TRACES} is absent (real traces live in ../shared/traces)")
    return SHARED_TRACES
