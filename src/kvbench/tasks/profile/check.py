"""``python -m kvbench task=profile_check executor.profile=FILE ...``: does a profile still price
this machine's steps?

A profile is fitted once and used for hours; the machine under it moves (on this project's
shared AMD EPYC, the real executor's steps ran at 1.04-1.11x one profile's prices in the morning
and at 0.78-0.86x in the afternoon, docs/sim_to_real_measured.md). This task times a sample of the
profile's own grid again (``points_per_kind`` decode, prefill and mixed points, drawn with a
fixed seed, so every check times the same ones; wake-ups and swaps are left out), prices each with
the profile, and says how far the two are apart: the median of measured / priced, how many points
ran slower than priced with a two-sided sign test, and whether the profile has drifted. It has
when the shift is both systematic (sign test p < ``SIGNIFICANCE``) and larger than the fit's own
median error over its grid (a shift within that moves no prediction beyond what the fit already
misses). Writes ``profile_check.parquet`` (``profile.parquet``'s columns), a predicted-vs-measured
chart and ``report.md``.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from scipy.stats import binomtest

from kvbench.config import ProfileGridConfig
from kvbench.engine.profiled import ProfiledCostModel
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.profile.grid import IterationPoint, iteration_grid
from kvbench.tasks.profile.plot import plot_predicted_vs_measured
from kvbench.tasks.profile.profile_file import checked_profile
from kvbench.tasks.profile.table import iteration_row, profile_frame
from kvbench.tasks.simulate.real_runner import load_real_model, pin_threads
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report

POINT_KINDS = ("decode", "prefill", "mixed")
SIGNIFICANCE = 0.05  # the sign test's level for a systematic shift
SAMPLE_SEED = 0  # the same points every check, so that checks compare


@dataclass(frozen=True)
class ProfileCheck:
    """A profile's prices against its points timed again.

    Attributes:
        num_points: points timed.
        median_ratio: median over points of measured / priced seconds.
        ratio_quartiles: that ratio's first and third quartiles.
        num_slower: points measured slower than priced.
        sign_test_p: two-sided sign test of ``num_slower`` against half (ties left out).
        median_abs_pct_error: the profile's median |priced - measured| / measured x 100 now.
        fit_median_abs_pct_error: the same over its whole grid when it was fitted.
    """

    num_points: int
    median_ratio: float
    ratio_quartiles: tuple[float, float]
    num_slower: int
    sign_test_p: float
    median_abs_pct_error: float
    fit_median_abs_pct_error: float

    @property
    def drifted(self) -> bool:
        """Whether the machine has moved from the profile: systematically (the sign test) and
        by more than the fit's own median error."""
        shift_pct = abs(self.median_ratio - 1.0) * 100
        return self.sign_test_p < SIGNIFICANCE and shift_pct > self.fit_median_abs_pct_error


def point_kind(point: IterationPoint) -> str | None:
    """``point``'s kind of ``POINT_KINDS`` (None for a wake-up point: its idle wait prices the
    wake terms, not the step)."""
    if point.wait_s:
        return None
    if not point.prefill_prompts:
        return "decode"
    return "mixed" if point.decode_contexts else "prefill"


def sample_points(points: list[IterationPoint], points_per_kind: int,
                  seed: int = SAMPLE_SEED) -> list[IterationPoint]:  # fmt: skip
    """Up to ``points_per_kind`` of ``points`` of each kind, drawn at random with ``seed`` (a
    stride through the grid's nested order would repeat one context or block size), in the
    grid's order."""
    draw = random.Random(seed)
    chosen: set[int] = set()
    for kind in POINT_KINDS:
        of_kind = [index for index, point in enumerate(points) if point_kind(point) == kind]
        chosen.update(draw.sample(of_kind, min(points_per_kind, len(of_kind))))
    return [points[index] for index in sorted(chosen)]


def recorded_grid(recorded: dict[str, Any] | None,
                  configured: ProfileGridConfig) -> ProfileGridConfig:  # fmt: skip
    """The grid a profile records (``configured``'s values for what it does not record: a
    profile written before a setting existed, or before grids were recorded at all)."""
    known = {item.name for item in fields(ProfileGridConfig)}
    values = {**asdict(configured), **{k: v for k, v in (recorded or {}).items() if k in known}}
    return ProfileGridConfig(**values)


def compare(table: pd.DataFrame, fit_median_abs_pct_error: float) -> ProfileCheck:
    """The figures of ``table`` (rows of ``profile.parquet``'s columns: ``measured_s`` and the
    profile's ``predicted_s``), beside the fit's ``fit_median_abs_pct_error``."""
    if table.empty:
        raise ValueError("no points were timed: the profile's grid has no decode, prefill or "
                         "mixed point")  # fmt: skip
    ratios = (table["measured_s"] / table["predicted_s"]).tolist()
    first, _, third = (statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1
                       else (ratios[0],) * 3)  # fmt: skip
    num_slower = int((table["measured_s"] > table["predicted_s"]).sum())
    num_faster = int((table["measured_s"] < table["predicted_s"]).sum())
    untied = num_slower + num_faster
    return ProfileCheck(
        num_points=len(table), median_ratio=statistics.median(ratios),
        ratio_quartiles=(first, third), num_slower=num_slower,
        sign_test_p=binomtest(num_slower, untied).pvalue if untied else 1.0,
        median_abs_pct_error=float(table["abs_pct_error"].median()),
        fit_median_abs_pct_error=fit_median_abs_pct_error,
    )  # fmt: skip


def run_profile_check(cfg: Any, deployment: Any, raw_cfg: Any, output_dir: Path) -> pd.DataFrame:
    """Time ``cfg.profile_check``'s sample of ``cfg.executor.profile``'s grid on this machine;
    returns the table of timed points, priced by the profile."""
    from kvbench.tasks.profile.measure import time_grid

    path = cfg.executor.profile
    backend = cfg.executor.decode_backend
    document, differences = checked_profile(path, deployment, backend,
                                            cfg.executor.linear_backend)  # fmt: skip
    fit_error_pct = document.get("fit", {}).get("median_abs_pct_error")
    if fit_error_pct is None:  # coefficients written by hand: no fit to measure a shift against
        raise ValueError(f"{path}: profile records no fit.median_abs_pct_error (not written by "
                         "task=profile); write it with `python -m kvbench task=profile`")
    recorded = document.get("grid")  # None in a profile written before grids were recorded
    grid = recorded_grid(recorded, cfg.profile_grid)
    repeats = int(document.get("repeats", grid.repeats))
    points = sample_points(iteration_grid(grid, deployment.model.kv_bytes_per_token),
                           cfg.profile_check.points_per_kind)  # fmt: skip
    pin_threads(cfg.executor.num_threads)
    model = load_real_model(cfg)
    coefficients = {name: float(value) for name, value in document["coefficients"].items()}
    kv_dtype = cfg.model.kv_dtype
    timings, _ = time_grid(model, points, [], repeats, backend, kv_dtype, progress=cfg.progress)
    table = profile_frame([
        iteration_row(shape, point.block_size, point.wait_s, timing.median_s, timing.spread,
                      ProfiledCostModel(coefficients, point.block_size))
        for point, (shape, timing) in zip(points, timings, strict=True)
    ])  # fmt: skip
    check = compare(table, float(fit_error_pct))
    write_table(table, output_dir / "profile_check.parquet", provenance(raw_cfg))
    if cfg.plots:
        plot_predicted_vs_measured(table, output_dir / "plots", "profile_check",
                                   f"{path}: priced vs measured now")  # fmt: skip
    lines = check_lines(path, document, check, points, repeats, recorded is not None,
                        differences)  # fmt: skip
    print("\n".join(lines))
    section = "## Profile check\n\n" + "\n".join(f"- {line}" for line in lines)
    write_task_report(output_dir, f"{cfg.experiment_name}: check of a profile of "
                      f"{cfg.model.name}", raw_cfg, [section])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def check_lines(path: str, document: dict[str, Any], check: ProfileCheck,
                points: list[IterationPoint], repeats: int, grid_recorded: bool,
                differences: list[str], now: datetime | None = None) -> list[str]:  # fmt: skip
    """The check's report, one line a bullet: the profile, the points timed and how the two
    compare, the verdict, and what the profile was measured on that differs from here."""
    counts = ", ".join(f"{sum(point_kind(p) == kind for p in points)} {kind}"
                       for kind in POINT_KINDS)  # fmt: skip
    grid = "its grid" if grid_recorded else ("this config's profile_grid (the profile does not "
                                             "record its grid)")  # fmt: skip
    low, high = check.ratio_quartiles
    lines = [
        f"profile {path}: {document.get('model')} ({document.get('dtype')}) on "
        f"{document.get('device')}, {_age(document, now)}; fit median |error| "
        f"{check.fit_median_abs_pct_error:.1f} % over its grid",
        f"timed now: {check.num_points} points of {grid} ({counts}; wake-ups and swaps left "
        f"out), timed in {repeats} round{'s' if repeats > 1 else ''}: median |error| "
        f"{check.median_abs_pct_error:.1f} %; measured / priced median {check.median_ratio:.2f} "
        f"(quartiles {low:.2f}-{high:.2f}); slower than priced at {check.num_slower} of "
        f"{check.num_points} (sign test p = {check.sign_test_p:.2g})",
    ]
    if check.drifted:
        lines.append(
            f"drifted: this machine runs the profile's steps at {check.median_ratio:.2f}x its "
            f"prices, a shift beyond the fit's own {check.fit_median_abs_pct_error:.1f} %; profile "
            "it again (`python -m kvbench task=profile` with this run's model, hardware and "
            "executor settings)")  # fmt: skip
    elif check.sign_test_p >= SIGNIFICANCE:
        lines.append(f"holds: no systematic shift (sign test p >= {SIGNIFICANCE})")
    else:
        lines.append(f"holds: a systematic shift to {check.median_ratio:.2f}x its prices, within "
                     f"the fit's own {check.fit_median_abs_pct_error:.1f} % median error")
    if differences:
        lines.append("measured on " + "; ".join(differences) + ": its prices are another "
                     "executor's, whatever this check finds")  # fmt: skip
    return lines


def _age(document: dict[str, Any], now: datetime | None) -> str:
    """When the profile was written and how long before ``now`` ("its time not recorded" for
    a profile written before kvbench recorded it: a file's modification time would be its
    checkout's, for a committed one)."""
    written = document.get("written_utc")
    if not written:
        return "its time not recorded"
    when = datetime.fromisoformat(written)
    when = when if when.tzinfo else when.replace(tzinfo=UTC)  # written by hand, without a zone
    hours = ((now or datetime.now(UTC)) - when).total_seconds() / 3600
    return f"written {written} ({hours:.1f} h ago)"
