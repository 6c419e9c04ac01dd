"""``WorkloadConfig``: the Hydra ``workload`` config group's schema, and its validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from kvbench.workloads.formats import FORMAT_NAMES
from kvbench.workloads.transforms import (
    VLLM_MAX_PROMPT_TOKENS,
    VLLM_MAX_TOTAL_TOKENS,
    VLLM_MIN_OUTPUT_TOKENS,
    VLLM_MIN_PROMPT_TOKENS,
)

SOURCES = ("profile", "trace", "synthetic")
SYNTHETIC_NAMES = ("fixed", "system_prompt")
ARRIVALS = ("poisson", "gamma", "trace", "burst")
FILTERS = ("vllm", "none")
# How a rate is set, named by every message that asks for one.
RATE_KEYS = "workload.request_rate=R or request_rates=[R,...]"


class UntimedTraceWarning(UserWarning):
    """A trace without timestamps replayed with ``arrival=trace``: kvbench gave it Poisson
    arrivals (``python -m kvbench`` prints the message as one ``kvbench:`` line)."""


@dataclass
class WorkloadConfig:
    """What requests a run replays (one ``conf/workload/*.yaml`` file fills these fields).

    Attributes:
        name: the workload: a shipped profile (``sharegpt``, ``alpaca``, ``azure_conv``,
            ``sharegpt_multiturn``, ``arxiv``, ``mooncake``) for source ``profile``; ``fixed`` or
            ``system_prompt`` for source ``synthetic``; any label for source ``trace``.
        source: ``profile`` (shipped length profile, offline), ``trace`` (a file read by
            ``load_trace``) or ``synthetic``.
        path: the trace file (or hub dataset id) for source ``trace``.
        format: trace format for ``load_trace`` (``auto`` detects it from the content).
        tokenizer: hub tokenizer for raw-text traces; None = offline SmolLM2.
        num_requests: requests in the workload; None = every row of the trace (source trace)
            or one per user (``system_prompt``).
        request_rate: requests/s for ``poisson``/``gamma`` (infinite = all at once: ``inf``
            on the command line, ``.inf`` in YAML); for
            ``trace`` arrivals, None or 0 keeps the trace's timestamps and a rate > 0 rescales
            them to that mean rate (a trace without timestamps: Poisson at that rate).
        arrival: ``poisson``, ``gamma`` (gaps with coefficient of variation ``cv``), ``trace``
            (the trace's timestamps, times ``time_scale``; a trace without any gets Poisson
            arrivals, see ``untimed_request_rate``) or ``burst`` (all at t = 0).
        untimed_request_rate: requests/s of the Poisson arrivals that ``arrival=trace`` gives a
            trace without timestamps when no ``request_rate`` is set.
        cv: coefficient of variation of the gamma gaps (1 = Poisson).
        time_scale: factor on a trace's timestamps (0.5 = twice as fast).
        filter: ``vllm`` (vLLM benchmark's length filter, bounds below) or ``none``.
        min_prompt_tokens, min_output_tokens, max_prompt_tokens, max_total_tokens: the
            ``vllm`` filter's bounds.
        prompt_tokens, output_tokens: synthetic lengths; for ``system_prompt`` the prompt
            tokens each user adds after the shared system prompt.
        num_users: users (= requests) of ``system_prompt``.
        system_prompt_tokens: length of the shared system prompt.
        seed: seeds sampling and arrivals.
        num_samples: parallel samples (n) each request generates from its one prompt.
        beam_width: beam search width (k) of each request: 1 (no beam search) or a width the
            shipped beam ancestry records (2, 4, 6); not together with num_samples > 1.
        conversations: source ``trace`` only: the rows are the turns of conversations in order,
            each prompt the whole history (``transforms.conversation_prefixes`` names the
            history consecutive turns share, for prefix caching).
    """

    name: str = "sharegpt"
    source: str = "profile"
    path: str | None = None
    format: str = "auto"
    tokenizer: str | None = None
    num_requests: int | None = 1000
    request_rate: float | None = 2.0
    arrival: str = "poisson"
    untimed_request_rate: float = 2.0
    cv: float = 1.0
    time_scale: float = 1.0
    filter: str = "vllm"
    min_prompt_tokens: int = VLLM_MIN_PROMPT_TOKENS
    min_output_tokens: int = VLLM_MIN_OUTPUT_TOKENS
    max_prompt_tokens: int = VLLM_MAX_PROMPT_TOKENS
    max_total_tokens: int = VLLM_MAX_TOTAL_TOKENS
    prompt_tokens: int = 512
    output_tokens: int = 128
    num_users: int = 8
    system_prompt_tokens: int = 1024
    seed: int = 0
    num_samples: int = 1
    beam_width: int = 1
    conversations: bool = False


def as_workload_config(cfg: Any) -> WorkloadConfig:
    """``cfg`` as a WorkloadConfig: itself, an OmegaConf DictConfig (as Hydra passes it) or a
    mapping of field names."""
    if isinstance(cfg, WorkloadConfig):
        return cfg
    if type(cfg).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    known = {field.name for field in fields(WorkloadConfig)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"workload.{unknown[0]} is not a workload setting; expected one of "
                         f"{', '.join(sorted(known))}")
    return WorkloadConfig(**cfg)


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"workload.{key}={value!r} is invalid; expected {allowed}")


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(key, value, f"one of {', '.join(choices)}")


def _check_int_at_least(key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(key, value, f"an integer >= {minimum}")


def _check_positive_number(
    key: str, value: Any, allow_inf: bool = False, how_to_set: str = ""
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        _fail(key, value, "a number > 0" + (" (inf allowed)" if allow_inf else "") + how_to_set)
    if math.isinf(value) and not allow_inf:
        _fail(key, value, "a finite number > 0")


def _validate_source(cfg: WorkloadConfig) -> None:
    from kvbench.workloads.profiles import available_profiles

    _check_choice("source", cfg.source, SOURCES)
    if cfg.source == "profile":
        _check_choice("name", cfg.name, available_profiles())
    elif cfg.source == "synthetic":
        _check_choice("name", cfg.name, SYNTHETIC_NAMES)
    elif not cfg.path:
        _fail("path", cfg.path, "a trace file or hub dataset id when source=trace")
    if not cfg.name:
        _fail("name", cfg.name, "a non-empty workload name")
    if cfg.tokenizer is not None and not str(cfg.tokenizer).strip():
        _fail("tokenizer", cfg.tokenizer, "a local tokenizer folder or a hub id, or null for "
              "the offline SmolLM2 tokenizer")
    _check_choice("format", cfg.format, FORMAT_NAMES)


def _validate_size(cfg: WorkloadConfig) -> None:
    if cfg.num_requests is None:
        if cfg.source == "profile" or (cfg.source == "synthetic" and cfg.name == "fixed"):
            _fail("num_requests", None, f"an integer >= 1 for source={cfg.source}")
    else:
        _check_int_at_least("num_requests", cfg.num_requests, 1)
    if cfg.source == "synthetic":
        _check_int_at_least("prompt_tokens", cfg.prompt_tokens, 1)
        _check_int_at_least("output_tokens", cfg.output_tokens, 1)
    if cfg.source == "synthetic" and cfg.name == "system_prompt":
        _check_int_at_least("num_users", cfg.num_users, 1)
        _check_int_at_least("system_prompt_tokens", cfg.system_prompt_tokens, 1)
        if cfg.num_requests not in (None, cfg.num_users):
            _fail("num_requests", cfg.num_requests,
                  f"null or num_users ({cfg.num_users}): system_prompt makes one request per user")


def _validate_arrivals(cfg: WorkloadConfig) -> None:
    _check_choice("arrival", cfg.arrival, ARRIVALS)
    if cfg.arrival in ("poisson", "gamma"):
        _check_positive_number("request_rate", cfg.request_rate, allow_inf=True,
                               how_to_set=f" for arrival={cfg.arrival}: set {RATE_KEYS}")
    elif cfg.request_rate is not None and cfg.request_rate != 0:
        # burst ignores the rate and trace rescales to it: both accept any rate > 0 (or none).
        _check_positive_number("request_rate", cfg.request_rate, allow_inf=cfg.arrival == "burst")
    _check_positive_number("untimed_request_rate", cfg.untimed_request_rate, allow_inf=True)
    _check_positive_number("cv", cfg.cv)
    _check_positive_number("time_scale", cfg.time_scale)
    if cfg.arrival == "trace":
        if cfg.source != "trace":
            _fail("arrival", cfg.arrival, "poisson, gamma or burst unless source=trace "
                  "(only a trace file has timestamps)")
        if cfg.request_rate and cfg.time_scale != 1.0:
            _fail("time_scale", cfg.time_scale, "1.0 when request_rate rescales the trace's "
                  "timestamps (set one of the two)")


def _validate_filter(cfg: WorkloadConfig) -> None:
    _check_choice("filter", cfg.filter, FILTERS)
    for key in ("min_prompt_tokens", "min_output_tokens", "max_prompt_tokens",
                "max_total_tokens"):
        _check_int_at_least(key, getattr(cfg, key), 0)
    _check_int_at_least("seed", cfg.seed, 0)
    _check_int_at_least("num_samples", cfg.num_samples, 1)
    _validate_beam_width(cfg)


def _validate_beam_width(cfg: WorkloadConfig) -> None:
    _check_int_at_least("beam_width", cfg.beam_width, 1)
    if cfg.beam_width == 1:
        return
    if cfg.num_samples > 1:
        _fail("beam_width", cfg.beam_width, f"1 when num_samples={cfg.num_samples} > 1 "
              "(parallel sampling and beam search are separate workloads; set one of the two)")
    from kvbench.workloads.beam_ancestry import recorded_beam_widths

    widths = recorded_beam_widths()
    if cfg.beam_width not in widths:
        _fail("beam_width", cfg.beam_width,
              f"1 or a width with recorded beam ancestry ({', '.join(map(str, widths))})")


def untimed_arrival_rate(cfg: WorkloadConfig) -> float:
    """Requests/s of the Poisson arrivals ``arrival=trace`` gives a trace without timestamps:
    the run's ``request_rate`` when set (> 0), else ``untimed_request_rate``."""
    return float(cfg.request_rate or cfg.untimed_request_rate)


def untimed_trace_note(cfg: WorkloadConfig) -> str:
    """The one line that says a trace without timestamps got Poisson arrivals, at which rate
    and how to choose another (the same line for every rate of a sweep: it is said once)."""
    if cfg.request_rate:
        rate = "each run's request rate (request_rates, else workload.request_rate)"
    else:
        rate = (f"{cfg.untimed_request_rate:g} req/s (workload.untimed_request_rate, the default "
                "when no rate is set)")
    return (f"{cfg.path} has no arrival times; replaying it with Poisson arrivals at {rate}; "
            f"set {RATE_KEYS} or workload.arrival=gamma|burst to choose")


def validate_workload_config(cfg: WorkloadConfig) -> None:
    """Check every field of ``cfg``.

    Raises:
        ValueError: one line naming the first bad key, its value and what is allowed, e.g.
            ``workload.request_rate=-1.0 is invalid; expected a number > 0 (inf allowed)``.
    """
    _validate_source(cfg)
    if cfg.conversations and cfg.source != "trace":
        _fail("conversations", cfg.conversations, "false unless workload.source=trace (the "
              "turns of conversations, in order, in a trace file)")
    _validate_size(cfg)
    _validate_arrivals(cfg)
    _validate_filter(cfg)
