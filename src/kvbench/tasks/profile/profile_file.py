"""The profile file: a fitted cost model, named by device, model and versions.

A small JSON file (``profile_<hardware>_<model>_<dtype>[_kv<kv_dtype>]_torch<version>_kvbench
<version>.json``; ``_kv<kv_dtype>`` where the K/V pools stored another dtype than the weights')
holding the coefficients of ``engine.profiled.ProfiledCostModel`` and what they were measured on
(device, CPU or GPU name, threads, versions) and how well they fit. ``executor=profiled
executor.profile=FILE`` reads it here, at the edge; the engine gets the coefficients.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvbench.config import ProfileGridConfig
from kvbench.core.specs import Deployment
from kvbench.engine.profiled import (
    ProfiledCostModel,
    missing_terms,
    signed_terms,
    unknown_terms,
)
from kvbench.tables.atomic import write_text_atomic

FORMAT_VERSION = 1


def profile_file_name(hardware: str, model: str, dtype: str, versions: dict[str, str],
                      kv_dtype: str | None = None) -> str:  # fmt: skip
    """The file's name: what the coefficients are valid for (``kv_dtype``: the K/V pools'
    storage dtype, named where it is not ``dtype``)."""
    kv = f"_kv{kv_dtype}" if kv_dtype not in (None, dtype) else ""
    return (f"profile_{hardware}_{model}_{dtype}{kv}_torch{versions['torch']}"
            f"_kvbench{versions['kvbench']}.json")  # fmt: skip


def write_profile(path: Path, profile: dict[str, Any]) -> None:
    """Write ``profile`` (its ``coefficients`` and descriptive keys) as JSON, atomically."""
    document = {"format_version": FORMAT_VERSION, **profile}
    write_text_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n")


def read_profile(path: str | Path) -> dict[str, Any]:
    """A profile file's contents; ValueError (one line) when it is not one."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a profile file (not UTF-8 JSON text: a binary file, "
                         "such as a parquet table?); give the .json file `python -m kvbench "
                         "task=profile` writes") from None  # fmt: skip
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a profile file (invalid JSON: {error.msg}); write one "
                         "with `python -m kvbench task=profile`") from None  # fmt: skip
    coefficients = document.get("coefficients") if isinstance(document, dict) else None
    if not isinstance(coefficients, dict):
        raise ValueError(f"{path}: not a profile file (no mapping of coefficients); write one "
                         "with `python -m kvbench task=profile`")  # fmt: skip
    not_numbers = [name for name, value in coefficients.items()
                   if isinstance(value, bool) or not isinstance(value, int | float)]  # fmt: skip
    if not_numbers:
        raise ValueError(f"{path}: profile coefficient {not_numbers[0]} is "
                         f"{coefficients[not_numbers[0]]!r}, not seconds; write it again with "
                         "`python -m kvbench task=profile`")  # fmt: skip
    _check_coefficient_values(coefficients, path)
    missing = missing_terms(coefficients)
    if missing:
        raise ValueError(f"{path}: profile has no coefficient {missing[0]}; write it again with "
                         "`python -m kvbench task=profile`")  # fmt: skip
    unknown = unknown_terms(coefficients)
    if unknown:
        raise ValueError(f"{path}: profile has coefficient {unknown[0]}, which this kvbench does "
                         "not price (another version's terms); write it again with "
                         "`python -m kvbench task=profile`")  # fmt: skip
    return dict(document)


def _check_coefficient_values(coefficients: dict[str, float], path: str | Path) -> None:
    """A ValueError (one line) for a coefficient no fit writes: one that is not finite (NaN
    seconds would stall the simulated clock) or a negative one of a term the fit keeps >= 0
    (every term but the stairs, ``signed_terms``), which would price steps below zero."""
    for name, value in coefficients.items():
        if not math.isfinite(value):
            problem = f"is {value}, not a finite number of seconds"
        elif value < 0 and not signed_terms([name])[0]:
            problem = f"is {value} s, below 0 (a fit keeps every term but the stairs >= 0)"
        else:
            continue
        raise ValueError(f"{path}: profile coefficient {name} {problem}; write it again with "
                         "`python -m kvbench task=profile`")


def load_profiled_cost_model(
    path: str | Path, block_size: int, deployment: Deployment
) -> ProfiledCostModel:
    """The cost model of the profile at ``path`` for a kernel block size of ``block_size``.

    ValueError (one line) when the profile was measured on another model or dtype than
    ``deployment``'s (``check_profile_fits``).
    """
    document = read_profile(path)
    check_profile_fits(document, path, deployment)
    coefficients = {name: float(value) for name, value in document["coefficients"].items()}
    return ProfiledCostModel(coefficients, block_size)


def recorded_grid(document: dict[str, Any], path: str | Path) -> ProfileGridConfig | None:
    """The grid the points of the profile at ``path`` were timed on (``task=profile`` records
    it); None for a profile fitted on served runs (``experiment=sim_to_real``'s) or a grid of
    other keys than this version's (its span is not known here). ValueError (one line) for a
    grid of this version's keys whose values are not its types (a file edited by hand)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    grid = document.get("grid")
    keys = {field.name for field in fields(ProfileGridConfig)}
    if not isinstance(grid, dict) or set(grid) != keys:
        return None
    try:
        typed = OmegaConf.merge(OmegaConf.structured(ProfileGridConfig), grid)
    except OmegaConfBaseException as error:
        reason = str(error).splitlines()[0]
        raise ValueError(f"{path}: its grid is malformed ({reason}); write the profile again "
                         "with `python -m kvbench task=profile`") from None  # fmt: skip
    return OmegaConf.to_object(typed)  # type: ignore[return-value]


def check_profile_fits(document: dict[str, Any], path: str | Path,
                       deployment: Deployment) -> None:  # fmt: skip
    """ValueError (one line, naming the fix) when the profile ``document`` was measured on
    another model, at another dtype or with K/V stored in another dtype than ``deployment``'s:
    its coefficients would price another network (a bf16 step does not take an fp32 step's time;
    fp8 K/V are quantized on every write and dequantized on every read). A profile without a
    dtype (an older file) is checked on its model alone; one without a K/V dtype stored K/V in
    its dtype (fp8 pools came later)."""
    model = document.get("model")
    if model != deployment.model.name:
        raise ValueError(f"{path}: profile measured on model {model}, this run is "
                         f"model={deployment.model.name}; profile it with `python -m kvbench "
                         f"task=profile model={deployment.model.name}`")  # fmt: skip
    dtype = document.get("dtype")
    if dtype is not None and dtype != deployment.model.dtype:
        raise ValueError(f"{path}: profile measured at dtype {dtype}, this run is "
                         f"model.dtype={deployment.model.dtype}; set model.dtype={dtype} or "
                         f"profile it with `python -m kvbench task=profile "
                         f"model={deployment.model.name} model.dtype={deployment.model.dtype}`")
    kv_dtype = document.get("kv_dtype", dtype)
    run_kv_dtype = deployment.model.kv_dtype
    if dtype is not None and kv_dtype != (run_kv_dtype or dtype):
        raise ValueError(f"{path}: profile stored K/V in {kv_dtype}, this run in "
                         f"{run_kv_dtype or dtype}; set {_kv_setting(kv_dtype, dtype)} or profile "
                         f"it with `python -m kvbench task=profile model={deployment.model.name} "
                         f"model.dtype={dtype} {_kv_setting(run_kv_dtype, dtype)}`")  # fmt: skip


def _kv_setting(kv_dtype: str | None, dtype: str) -> str:
    """The ``model.kv_dtype`` override that stores K/V in ``kv_dtype`` (null: the model's)."""
    return f"model.kv_dtype={'null' if kv_dtype in (None, dtype) else kv_dtype}"


def device_name() -> str:
    """The present device's name, as a profile records it: the GPU's when torch sees one, else
    the CPU's model name."""
    import platform

    import torch

    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The code whose speed a profile prices: the kernels and the executor that runs the model's
# forward over the pools. A change there can move every price (fp8's byte table moved an fp8
# run's by a third) without moving kvbench's version.
CODE_PACKAGES = ("kvbench.kernels", "kvbench.executors")


def code_digest(folders: Sequence[Path] | None = None) -> str:
    """12 hex digits of SHA-256 over the ``.py`` files of ``folders`` (None: where
    ``CODE_PACKAGES`` are installed), in order: the same while that code is."""
    import hashlib
    import importlib

    if folders is None:  # where installed: an editable install maps kvbench.kernels to kernels/
        folders = [Path(importlib.import_module(name).__file__ or "").parent
                   for name in CODE_PACKAGES]  # fmt: skip
    digest = hashlib.sha256()
    for folder in folders:
        for file in sorted(folder.glob("*.py")):
            digest.update(f"{folder.name}/{file.name}\n".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


def checked_profile(path: str | Path, deployment: Deployment, decode_backend: str,
                    linear_backend: str) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """The profile at ``path`` for runs about to start here, checked against their model and
    dtype (``check_profile_fits``), and what it was measured on that they differ in
    (``setup_differences``: the device, torch's threads as ``executor.num_threads`` pinned them,
    the decode backend, the matmuls' library, the kernels' and executor's code)."""
    import torch

    document = read_profile(path)
    check_profile_fits(document, path, deployment)
    present = {"device": device_name(), "num_threads": torch.get_num_threads(),
               "decode_backend": decode_backend, "linear_backend": linear_backend,
               "code_digest": code_digest()}  # fmt: skip
    return document, setup_differences(document, present)


def setup_differences(document: dict[str, Any], present: dict[str, Any]) -> list[str]:
    """What the profile was measured on that differs from ``present`` (``checked_profile``'s
    keys), one phrase each: such a profile prices another executor, so its absolute times do not
    predict these runs (its ratios may still compare). Keys the profile does not record are not
    compared."""
    return [f"{key} {document[key]} (here {value})" for key, value in present.items()
            if document.get(key) is not None and document[key] != value]  # fmt: skip
