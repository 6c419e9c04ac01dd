"""The top of the workloads stage: ``build_workload`` turns a WorkloadConfig into the replayable
request table, ``to_requests`` that table into the frozen Request records the engine consumes."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd

from kvbench.core.request import Request
from kvbench.workloads.config import (
    UntimedTraceWarning,
    WorkloadConfig,
    as_workload_config,
    untimed_arrival_rate,
    untimed_trace_note,
    validate_workload_config,
)
from kvbench.workloads.frame import trace_frame
from kvbench.workloads.generators import (
    burst_arrivals,
    fixed_workload,
    gamma_arrivals,
    poisson_arrivals,
    scale_trace_arrivals,
    stream,
    system_prompt_workload,
)
from kvbench.workloads.profiles import load_profile, sample_lengths
from kvbench.workloads.schema import (
    ARRIVAL_S,
    BEAM_WIDTH,
    HASH_BLOCK_TOKENS_ATTR,
    NUM_SAMPLES,
    OUTPUT_TOKENS,
    PREFIX_BLOCK_HASHES,
    PREFIX_GROUP,
    PREFIX_TOKENS,
    PROMPT_TOKENS,
    REQUEST_ID,
    REQUESTED_OUTPUT_TOKENS,
)
from kvbench.workloads.trace_io import load_trace
from kvbench.workloads.transforms import (
    clip_to_max_len,
    conversation_prefixes,
    filter_vllm,
    sample_requests,
    sort_and_renumber,
)

# Independent random streams of one seed (see generators.stream).
_SAMPLING_STREAM = 0
_ARRIVAL_STREAM = 1
# DataFrame.attrs of a trace workload: rows read from the file, and rows its filter removed.
NUM_READ_ROWS_ATTR = "num_read_rows"
# Records of the file a reader skipped before any row (ShareGPT conversations without a
# prompt-answer pair): the file held them, no request came of them.
NUM_SKIPPED_RECORDS_ATTR = "num_skipped_records"
NUM_FILTERED_ROWS_ATTR = "num_filtered_rows"
# Profile sampling draws until enough requests pass the filter; give up after this many
# draws per wanted request (a filter that nearly nothing passes is a configuration mistake).
_MAX_DRAWS_PER_REQUEST = 100


def _shape(df: pd.DataFrame, cfg: WorkloadConfig, max_model_len: int) -> pd.DataFrame:
    if cfg.filter == "vllm":
        df = filter_vllm(df, cfg.min_prompt_tokens, cfg.min_output_tokens,
                         cfg.max_prompt_tokens, cfg.max_total_tokens)
    return clip_to_max_len(df, max_model_len)


def _profile_rows(cfg: WorkloadConfig, max_model_len: int) -> pd.DataFrame:
    """Draw from the profile until ``num_requests`` requests survive filter and clipping."""
    profile = load_profile(cfg.name)
    rng = stream(cfg.seed, _SAMPLING_STREAM)
    assert cfg.num_requests is not None  # validate_workload_config requires it for profiles
    num_wanted = int(cfg.num_requests)
    kept: list[pd.DataFrame] = []
    num_kept = num_drawn = 0
    while num_kept < num_wanted:
        if num_drawn >= _MAX_DRAWS_PER_REQUEST * num_wanted:
            raise ValueError(f"workload {cfg.name}: only {num_kept} of {num_drawn} sampled "
                             f"requests pass filter={cfg.filter} and max_model_len="
                             f"{max_model_len}; expected a filter that keeps some of them")
        keep_rate = num_kept / num_drawn if num_kept else 0.5
        num_draws = math.ceil((num_wanted - num_kept) / keep_rate * 1.1) + 16
        prompt_tokens, output_tokens = sample_lengths(profile, num_draws, rng)
        batch = _shape(trace_frame(prompt_tokens, output_tokens), cfg, max_model_len)
        kept.append(batch)
        num_kept += len(batch)
        num_drawn += num_draws
    return pd.concat(kept, ignore_index=True).iloc[:num_wanted].reset_index(drop=True)


def _trace_rows(cfg: WorkloadConfig, max_model_len: int) -> pd.DataFrame:
    """The trace, shaped; then its first N rows (arrival=trace keeps the trace's time order) or
    N rows sampled at random (other arrivals; with replacement when N exceeds the rows)."""
    assert cfg.path is not None  # validate_workload_config requires it for traces
    loaded = load_trace(cfg.path, cfg.format, tokenizer=cfg.tokenizer)
    num_skipped = int(loaded.attrs.get("num_skipped", 0))
    if cfg.conversations:  # before filtering: a conversation is read from consecutive rows
        loaded = conversation_prefixes(loaded)
    trace = _shape(loaded, cfg, max_model_len)
    trace.attrs[NUM_READ_ROWS_ATTR] = len(loaded)
    trace.attrs[NUM_SKIPPED_RECORDS_ATTR] = num_skipped
    trace.attrs[NUM_FILTERED_ROWS_ATTR] = len(loaded) - len(trace)
    if trace.empty:
        raise ValueError(f"workload {cfg.name}: none of the {len(loaded)} requests of {cfg.path} "
                         f"passes filter={cfg.filter}; expected workload.filter=none or a "
                         f"trace with requests in the filter's bounds")
    if cfg.num_requests is None:
        return trace
    if cfg.arrival == "trace":
        if cfg.num_requests > len(trace):
            raise ValueError(f"workload.num_requests={cfg.num_requests} exceeds the {len(trace)} "
                             f"usable rows of {cfg.path}; expected at most that with "
                             f"arrival=trace (or another arrival process)")
        return trace.iloc[: cfg.num_requests].reset_index(drop=True)
    return sample_requests(trace, cfg.num_requests, stream(cfg.seed, _SAMPLING_STREAM))


def _synthetic_rows(cfg: WorkloadConfig, max_model_len: int) -> pd.DataFrame:
    if cfg.name == "fixed":
        assert cfg.num_requests is not None  # validate_workload_config requires it for fixed
        rows = fixed_workload(int(cfg.num_requests), cfg.prompt_tokens, cfg.output_tokens)
    else:
        rows = system_prompt_workload(cfg.num_users, cfg.system_prompt_tokens,
                                      cfg.prompt_tokens, cfg.output_tokens)
    return _shape(rows, cfg, max_model_len)


def _check_some_request_fits(rows: pd.DataFrame, cfg: WorkloadConfig, max_model_len: int) -> None:
    """A workload whose every prompt is empty or fills the context would only be rejected:
    that is a configuration mistake (the wrong model or workload), not a measurement."""
    prompt_tokens = rows[PROMPT_TOKENS]
    if not (prompt_tokens > 0).any():
        raise ValueError(f"workload {cfg.name}: all of its {len(rows)} prompts are empty (0 "
                         "tokens), and an engine rejects an empty prompt; expected prompts of "
                         "text or token counts >= 1 (is the trace's prompt column the right one?)")
    if not ((prompt_tokens > 0) & (prompt_tokens < max_model_len)).any():
        raise ValueError(f"workload {cfg.name}: none of its {len(rows)} prompts fits the model "
                         f"(longest {int(prompt_tokens.max())} tokens, max_model_len="
                         f"{max_model_len}); expected a model with a longer context or "
                         f"shorter prompts")


def _is_untimed_trace(cfg: WorkloadConfig, rows: pd.DataFrame) -> bool:
    """A trace replayed by its times that has none (it gets Poisson arrivals instead)."""
    return cfg.arrival == "trace" and bool(rows[ARRIVAL_S].isna().all())


def _arrival_times(cfg: WorkloadConfig, rows: pd.DataFrame, untimed: bool) -> np.ndarray:
    if cfg.arrival == "burst":
        return burst_arrivals(len(rows))
    rng = stream(cfg.seed, _ARRIVAL_STREAM)
    if untimed:
        # A trace without timestamps still runs, as the README's example promises: Poisson
        # arrivals at the run's rate (or the default), said in one line (the app prints it once).
        warnings.warn(untimed_trace_note(cfg), UntimedTraceWarning, stacklevel=3)
        return poisson_arrivals(len(rows), untimed_arrival_rate(cfg), rng)
    if cfg.arrival == "trace":
        check_rate_rescales(rows, cfg)
        return scale_trace_arrivals(rows[ARRIVAL_S].to_numpy(), cfg.time_scale,
                                    cfg.request_rate or None)
    # poisson or gamma: validate_workload_config requires a rate for them.
    assert cfg.request_rate is not None
    if cfg.arrival == "poisson":
        return poisson_arrivals(len(rows), float(cfg.request_rate), rng)
    return gamma_arrivals(len(rows), float(cfg.request_rate), cfg.cv, rng)


def check_rate_rescales(rows: pd.DataFrame, cfg: WorkloadConfig) -> None:
    """Raise the ValueError ``with_arrivals`` would for a trace replayed by its own times at a
    request rate when they span 0 s (a single request, or all at one time): no factor rescales
    them to a mean rate. Cheap, so a run can check every rate before its first simulation."""
    if cfg.arrival != "trace" or not cfg.request_rate or _is_untimed_trace(cfg, rows):
        return
    arrival_s = rows[ARRIVAL_S].to_numpy(dtype="float64")
    if arrival_s.size and arrival_s.max() > arrival_s.min():
        return
    raise ValueError(
        f"workload {cfg.name}: the {len(rows)} request(s) it replays from {cfg.path} all arrive "
        f"at {arrival_s.min() if arrival_s.size else 0:g} s, a span of 0 s that no request rate "
        f"({cfg.request_rate:g} req/s, from workload.request_rate or request_rates) can rescale; "
        "expected its own times without a rate, more requests (workload.num_requests), or "
        "workload.arrival=poisson (or gamma) for the rate"
    )


def build_workload(cfg: WorkloadConfig | Any, max_model_len: int) -> pd.DataFrame:
    """The requests a run replays, for a model of ``max_model_len`` tokens of context:
    ``with_arrivals(workload_rows(cfg, max_model_len), cfg)``.

    Steps: load (a shipped profile, a trace file, or a synthetic generator), filter
    (``cfg.filter``: the workload's definition, like vLLM's benchmark filter), clip outputs to
    ``max_model_len`` (``requested_output_tokens`` keeps the input's; rows are never dropped
    here: prompts that fill the context stay, for the engine to reject and count), pick
    ``num_requests`` (profiles draw until that many pass the filter), give arrivals
    (``cfg.arrival``), then sort by arrival with ``request_id`` 0..N-1. Deterministic for a
    given ``cfg.seed``.

    Args:
        cfg: a WorkloadConfig, or its OmegaConf/dict form.
        max_model_len: the model's context length in tokens.

    Raises:
        ValueError: an invalid config (one line naming the key), or a workload with no request
            that passes its filter or fits the model.
        TraceError: the trace file cannot be read.
    """
    cfg = as_workload_config(cfg)
    return with_arrivals(workload_rows(cfg, max_model_len), cfg)


def workload_rows(cfg: WorkloadConfig | Any, max_model_len: int) -> pd.DataFrame:
    """The rows of ``build_workload`` before arrivals: loaded, filtered, clipped and chosen.

    They do not depend on ``cfg.request_rate``, so a rate sweep builds them once and gives each
    rate its arrivals with ``with_arrivals`` (reading a trace once, not once per rate).
    """
    cfg = as_workload_config(cfg)
    validate_workload_config(cfg)
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
        raise ValueError(f"max_model_len={max_model_len!r} is invalid; expected an integer >= 2")
    if cfg.source == "profile":
        rows = _profile_rows(cfg, max_model_len)
    elif cfg.source == "trace":
        rows = _trace_rows(cfg, max_model_len)
    else:
        rows = _synthetic_rows(cfg, max_model_len)
    _check_some_request_fits(rows, cfg, max_model_len)
    rows.attrs["max_model_len"] = max_model_len
    return rows


def _replayed_rate(cfg: WorkloadConfig, untimed: bool) -> float:
    """The mean arrival rate (req/s) ``_arrival_times`` replays at, as a run is labelled
    (docs/metrics.md, ``request_rate``): inf for a burst (all at t = 0), the Poisson rate of an
    ``untimed`` trace, else ``cfg.request_rate`` (0 for a trace's own timestamps)."""
    if cfg.arrival == "burst":
        return math.inf
    return untimed_arrival_rate(cfg) if untimed else float(cfg.request_rate or 0.0)


def with_arrivals(rows: pd.DataFrame, cfg: WorkloadConfig | Any) -> pd.DataFrame:
    """``workload_rows``' rows with ``cfg``'s arrivals (at its ``request_rate``), sorted by
    arrival with ``request_id`` 0..N-1, and the samples and beam columns; ``rows`` is left as
    it is. Its ``attrs["request_rate"]`` is the rate replayed (``_replayed_rate``)."""
    cfg = as_workload_config(cfg)
    validate_workload_config(cfg)
    untimed = _is_untimed_trace(cfg, rows)
    timed = rows.copy()
    timed[ARRIVAL_S] = _arrival_times(cfg, timed, untimed)
    workload = sort_and_renumber(timed)
    workload.attrs["request_rate"] = _replayed_rate(cfg, untimed)
    if cfg.num_samples > 1:
        workload[NUM_SAMPLES] = cfg.num_samples
    if cfg.beam_width > 1:
        workload[BEAM_WIDTH] = cfg.beam_width
    workload.attrs["workload"] = cfg.name
    return workload


def _int_column(df: pd.DataFrame, name: str, default: int) -> list[int]:
    """The column as Python ints, converted once for the whole column (``default`` on every row
    when the frame has no such column)."""
    return df[name].astype("int64").tolist() if name in df.columns else [default] * len(df)


def _int_or_none_column(df: pd.DataFrame, name: str) -> list[int | None]:
    """The column as Python ints, None where it is missing (NaN, <NA>); None on every row when
    the frame has no such column."""
    if name not in df.columns:
        return [None] * len(df)
    missing = df[name].isna()
    values = df[name].where(~missing, 0).astype("int64").tolist()
    return [None if absent else value for value, absent in zip(values, missing.tolist(),
                                                                  strict=True)]  # fmt: skip


def to_requests(df: pd.DataFrame) -> list[Request]:
    """One :class:`~kvbench.core.request.Request` per row, in row order.

    ``prefix_group`` (<NA> → None) and ``prefix_tokens`` are mapped when present;
    ``prefix_block_hashes`` becomes a tuple, with ``hash_block_tokens`` from
    ``df.attrs["hash_block_tokens"]``. Each column is converted to Python values once, as a
    whole: a trace's tens of thousands of rows become requests in a few tens of milliseconds.

    Raises:
        ValueError: a row has no arrival time (NaN): give the workload arrivals first.
    """
    arrivals_s = df[ARRIVAL_S].astype("float64").tolist()
    missing = next((i for i, arrival in enumerate(arrivals_s) if math.isnan(arrival)), None)
    if missing is not None:
        raise ValueError(f"row {missing + 1} has arrival_s NaN; expected arrival times "
                         f"(build_workload assigns them)")
    if PREFIX_BLOCK_HASHES in df.columns:
        hashes = [tuple(int(block) for block in row) for row in df[PREFIX_BLOCK_HASHES]]
        hash_block_tokens = int(df.attrs.get(HASH_BLOCK_TOKENS_ATTR, 0))
    else:
        hashes, hash_block_tokens = [()] * len(df), 0
    columns = zip(
        _int_column(df, REQUEST_ID, 0), arrivals_s, _int_column(df, PROMPT_TOKENS, 0),
        _int_column(df, OUTPUT_TOKENS, 0), _int_or_none_column(df, PREFIX_GROUP),
        _int_column(df, PREFIX_TOKENS, 0), hashes, _int_column(df, NUM_SAMPLES, 1),
        _int_column(df, BEAM_WIDTH, 1), _int_or_none_column(df, REQUESTED_OUTPUT_TOKENS),
        strict=True,
    )
    return [
        Request(
            request_id=request_id,
            arrival_s=arrival_s,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            prefix_group=group,
            prefix_tokens=prefix_tokens,
            prefix_block_hashes=block_hashes,
            hash_block_tokens=hash_block_tokens,
            num_samples=num_samples,
            beam_width=beam_width,
            requested_output_tokens=requested,
        )
        for request_id, arrival_s, prompt_tokens, output_tokens, group, prefix_tokens,
        block_hashes, num_samples, beam_width, requested
        in columns
    ]
