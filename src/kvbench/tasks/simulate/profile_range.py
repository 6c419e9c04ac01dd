"""What ``executor=profiled``'s profile was timed on, and the requests and steps of a run beyond it.

A profile prices a step by its fitted terms (engine.profiled); a step larger than every step
its grid timed is priced by extrapolating them. A profile written by ``task=profile`` records
its grid, so a run can count such requests (``requests_beyond_profile_pct``) and steps
(``steps_beyond_profile_pct``) and warn, naming the settings that widen the grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvbench.config import KvbenchConfig, ProfileGridConfig
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine.records import StepRecords, StepSink
from kvbench.tasks.profile.grid import (
    beyond_grid,
    grid_shapes,
    longest_prompt_tokens,
    longest_sequence_tokens,
    range_bounds,
    steps_beyond,
)
from kvbench.tasks.profile.profile_file import read_profile, recorded_grid
from kvbench.tasks.simulate.run_summary import rate_text


@dataclass(frozen=True)
class ProfileRange:
    """The grid ``profile`` records (None: it records none, and what it spans is not known) and
    the largest step of it in each range feature (``range_bounds`` of ``grid_shapes``)."""

    profile: str
    grid: ProfileGridConfig | None
    bounds: Mapping[str, int] | None

    @classmethod
    def of(cls, cfg: KvbenchConfig, deployment: Deployment) -> ProfileRange:
        """``executor.profile``'s range; for a profile that records no grid, a line saying so."""
        profile = cfg.executor.profile
        assert profile  # config validation requires it with executor=profiled
        grid = recorded_grid(read_profile(profile), profile)
        if grid is None:
            print(f"simulate: {profile} records no profile grid: whether these requests and "
                  "steps are larger than any it timed is not known")  # fmt: skip
            return cls(profile, None, None)
        shapes = grid_shapes(grid, deployment.model.kv_bytes_per_token)
        return cls(profile, grid, range_bounds(shapes))

    def requests_beyond_pct(self, requests: list[Request], workload_label: str) -> float:
        """Percent of ``requests`` longer than any sequence the grid timed (``beyond_grid``; NaN
        without a grid), with a warning naming them and the fix where there are any."""
        grid = self.grid
        if grid is None or not requests:
            return float("nan")
        beyond = beyond_grid([request.prompt_tokens for request in requests],
                             [request.output_tokens for request in requests], grid)  # fmt: skip
        num_beyond = int(beyond.sum())
        if num_beyond:
            print(f"simulate: warning: {num_beyond:,} of {len(requests):,} requests of "
                  f"{workload_label} are longer than any sequence {self.profile} timed "
                  f"(prompts to {longest_prompt_tokens(grid):,} tokens, sequences to "
                  f"{longest_sequence_tokens(grid):,}): their prices extrapolate the profile; "
                  "profile a grid that spans them (profile_grid.prefill_prompts, "
                  "profile_grid.decode_mean_contexts)")  # fmt: skip
        return 100 * num_beyond / len(requests)

    def steps_warnings(self, summary: pd.DataFrame) -> list[str]:
        """One warning per workload of ``summary`` with steps beyond the grid
        (``steps_beyond_profile_pct`` > 0), naming its run with the most and the grid's largest
        step, with the settings that widen it."""
        if self.bounds is None or summary.empty:
            return []
        bounds = self.bounds
        lines = []
        for workload, runs in summary.groupby("workload", sort=False):
            pcts = runs["steps_beyond_profile_pct"]  # NaN for a run of no steps
            if not (pcts > 0).any():
                continue
            worst = runs.loc[pcts.idxmax()]
            lines.append(
                f"simulate: warning: {worst['steps_beyond_profile_pct']:.1f} % of the steps of "
                f"{workload} ({worst['allocator']} at {rate_text(worst['request_rate'])} req/s, "
                f"the most of its runs) are larger than every step {self.profile} timed "
                f"(prefills to {bounds['num_prefill_tokens']:,} tokens and "
                f"{bounds['prefill_attention_pairs']:,} attention pairs, decode batches to "
                f"{bounds['num_decode_tokens']:,} sequences and to "
                f"{bounds['decode_context_tokens']:,} context tokens in all): their prices "
                "extrapolate the profile; profile a grid that spans them "
                "(profile_grid.prefill_prompts, profile_grid.prefill_counts, "
                "profile_grid.decode_batches, profile_grid.decode_mean_contexts)")  # fmt: skip
        return lines


@dataclass
class StepsBeyond:
    """Counts a run's steps above ``bounds`` (``steps_beyond``): those streamed through
    ``through``'s sink on the way, then those the run kept (``pct``)."""

    bounds: Mapping[str, int] | None
    num_streamed_beyond: int = 0

    def through(self, sink: StepSink | None) -> StepSink | None:
        """``sink``, counting the steps of each chunk it takes (None stays None)."""
        bounds = self.bounds
        if sink is None or bounds is None:
            return sink

        def counting_sink(chunk: dict[str, np.ndarray]) -> None:
            self.num_streamed_beyond += int(steps_beyond(chunk, bounds).sum())
            sink(chunk)

        return counting_sink

    def pct(self, steps: StepRecords) -> float:
        """``steps_beyond_profile_pct`` of the run whose records are ``steps`` (NaN without
        bounds or steps)."""
        if self.bounds is None or not len(steps):
            return float("nan")
        num_kept_beyond = int(steps_beyond(steps.columns, self.bounds).sum())
        return 100 * (self.num_streamed_beyond + num_kept_beyond) / len(steps)
