"""``python -m kvbench task=profile hardware=cpu model=smollm2-135m``: time, fit, write.

Times every point of ``grid`` with the real executor on this machine (``measure``, in a shuffled
order), fits the profiled cost model (``fit``) and writes, in the run folder: the profile file
(named by device, model and versions; ``profile_file``), ``profile.parquet`` (every point, in the
grid's order, measured and fitted), ``plots/profile_fit.png|svg`` and ``report.md``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench import __version__
from kvbench.engine.profiled import (
    PROFILE_TERMS,
    SWAP_TERMS,
    WAKE_TERMS,
    ProfiledCostModel,
    iteration_features,
    swap_features,
    wake_features,
)
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.profile.fit import fit_terms
from kvbench.tasks.profile.grid import iteration_grid, swap_grid
from kvbench.tasks.profile.plot import plot_predicted_vs_measured
from kvbench.tasks.profile.profile_file import (
    code_digest,
    device_name,
    profile_file_name,
    write_profile,
)
from kvbench.tasks.profile.table import iteration_row, profile_frame, swap_row
from kvbench.tasks.simulate.real_runner import load_real_model, pin_threads
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report


def run_profile(cfg: Any, deployment: Any, raw_cfg: Any, output_dir: Path) -> pd.DataFrame:
    """Profile ``cfg.model`` on this machine; returns the table of timed points."""
    import torch
    import transformers

    from kvbench.tasks.profile.measure import time_grid

    started_s = time.perf_counter()
    pin_threads(cfg.executor.num_threads)
    model = load_real_model(cfg)
    backend = cfg.executor.decode_backend
    grid, token_bytes = cfg.profile_grid, deployment.model.kv_bytes_per_token
    repeats = grid.repeats
    points, swap_points = iteration_grid(grid, token_bytes), swap_grid(grid, token_bytes)
    kv_dtype = cfg.model.kv_dtype
    timed, swap_timings = time_grid(model, points, swap_points, repeats, backend, kv_dtype,
                                    progress=cfg.progress)  # fmt: skip
    iterations = [(point, *shape_timing) for point, shape_timing in zip(points, timed, strict=True)]
    swaps = list(zip(swap_points, swap_timings, strict=True))
    coefficients = fit_terms(
        [iteration_features(shape, point.block_size) + wake_features(point.wait_s)
         for point, shape, _ in iterations],
        [timing.median_s for _, _, timing in iterations],
        (*PROFILE_TERMS, *WAKE_TERMS),
    )  # fmt: skip
    coefficients.update(fit_terms(
        [swap_features(point.num_tokens, point.block_size) for point, _ in swaps],
        [timing.median_s for _, timing in swaps],
        SWAP_TERMS,
    ))  # fmt: skip
    rows = [
        iteration_row(shape, point.block_size, point.wait_s, timing.median_s, timing.spread,
                      ProfiledCostModel(coefficients, point.block_size))
        for point, shape, timing in iterations
    ]  # fmt: skip
    rows += [
        swap_row(point.num_tokens, point.block_size, timing.median_s, timing.spread,
                 ProfiledCostModel(coefficients, point.block_size))
        for point, timing in swaps
    ]  # fmt: skip
    table = profile_frame(rows)
    versions = {"kvbench": __version__, "torch": torch.__version__.split("+")[0],
                "transformers": transformers.__version__}  # fmt: skip
    iteration_errors = table.loc[table["kind"] == "iteration", "abs_pct_error"]
    profile = {
        "hardware": deployment.hardware.name, "model": cfg.model.name,
        "dtype": cfg.model.dtype, "kv_dtype": kv_dtype or cfg.model.dtype,
        "device": device_name(), "num_threads": torch.get_num_threads(),
        "decode_backend": backend, "linear_backend": cfg.executor.linear_backend,
        "weights": cfg.executor.weights, "code_digest": code_digest(),
        "versions": versions, "coefficients": coefficients, "repeats": repeats,
        "grid": asdict(grid),
        "fit": {"num_iteration_points": len(iterations), "num_swap_points": len(swaps),
                "median_abs_pct_error": float(iteration_errors.median()),
                "max_abs_pct_error": float(iteration_errors.max()),
                "median_spread": float(statistics.median(table["spread"]))},
        "profile_wall_s": time.perf_counter() - started_s,
        "written_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    name = profile_file_name(deployment.hardware.name, cfg.model.name, cfg.model.dtype, versions,
                             kv_dtype)  # fmt: skip
    write_profile(output_dir / name, profile)
    write_table(table, output_dir / "profile.parquet", provenance(raw_cfg))
    if cfg.plots:
        plot_predicted_vs_measured(table, output_dir / "plots", "profile_fit",
                                   f"{cfg.model.name} on {profile['device']}: fitted vs measured")
    lines = _summary_lines(profile, output_dir / name)
    print("\n".join(lines))
    write_task_report(output_dir, f"{cfg.experiment_name}: profile of {cfg.model.name} on "
                      f"{deployment.hardware.name}", raw_cfg,
                      ["## Profile\n\n" + "\n".join(f"- {line}" for line in lines)])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def _summary_lines(profile: dict[str, Any], path: Path) -> list[str]:
    fit = profile["fit"]
    coefficients = profile["coefficients"]
    terms = ", ".join(f"{term} {value:.3g}" for term, value in coefficients.items())
    grid = profile["grid"]
    batches, contexts = grid["decode_batches"], grid["decode_mean_contexts"]
    prompts = sorted(grid["prefill_prompts"])
    return [
        f"profile: {profile['model']} ({profile['dtype']}, K/V in {profile['kv_dtype']}) on "
        f"{profile['device']}, "
        f"{profile['num_threads']} threads, decode backend {profile['decode_backend']}, "
        f"matmuls through {profile['linear_backend']}, "
        f"{fit['num_iteration_points']} iterations and "
        f"{fit['num_swap_points']} swaps timed in {profile['profile_wall_s']:.0f} s -> {path.name}",
        f"fit: median |error| {fit['median_abs_pct_error']:.1f} %, max "
        f"{fit['max_abs_pct_error']:.1f} % (median spread over rounds "
        f"{100 * fit['median_spread']:.1f} %)",
        f"grid: decode batches of {min(batches)}-{max(batches)} sequences at mean contexts "
        f"{'-'.join(map(str, sorted(contexts)))}, prefills of {'-'.join(map(str, prompts))} "
        f"tokens (profile_grid; a profile prices what its grid spans)",
        f"coefficients (s per unit): {terms}",
        f"use it: executor=profiled executor.profile={path}",
    ]

