"""Workloads: read real request traces, shape them, and build the requests a run replays.

Typical use::

    from kvbench.workloads import WorkloadConfig, build_workload, to_requests

    requests = to_requests(build_workload(WorkloadConfig(name="sharegpt"), max_model_len=2048))

``load_trace`` reads Vidur/Sarathi, Azure, Mooncake, lengths CSVs, Alpaca and ShareGPT raw text
(tokenized) and kvbench's own parquet; the shipped profiles (``sample_profile``) make the
default workloads run offline.

Modules, bottom to top: ``schema`` (columns, errors, row locations, what a trace format is),
``raw_reading`` (a file's own rows: container sniffing, reading, diagnosis), ``frame`` (value
checks and the typed canonical frame), ``tokenizer``, ``formats`` (one ``TraceSchema`` entry per
format, its converter on it), ``trace_io`` (``load_trace``, ``save_trace``), ``generators``
(seeding, arrival processes, synthetic workloads), ``transforms`` (filter, clip, sample;
statistics), ``profiles`` (derive, ship, sample), ``prefix_reuse``, ``beam_ancestry``, ``config``
(``WorkloadConfig``) and ``build`` (``build_workload`` = ``workload_rows`` then
``with_arrivals``; ``to_requests``).
"""

from kvbench.workloads.build import (
    build_workload,
    check_rate_rescales,
    to_requests,
    with_arrivals,
    workload_rows,
)
from kvbench.workloads.config import WorkloadConfig, validate_workload_config
from kvbench.workloads.generators import (
    burst_arrivals,
    fixed_workload,
    gamma_arrivals,
    poisson_arrivals,
    scale_trace_arrivals,
    system_prompt_workload,
)
from kvbench.workloads.profiles import available_profiles, load_profile, sample_profile
from kvbench.workloads.schema import TokenizerUnavailableError, TraceError, UnsortedTraceWarning
from kvbench.workloads.tokenizer import load_tokenizer
from kvbench.workloads.trace_io import load_trace, save_trace
from kvbench.workloads.transforms import (
    clip_to_max_len,
    filter_vllm,
    sample_requests,
    sort_and_renumber,
    trace_statistics,
)

__all__ = [
    "TokenizerUnavailableError",
    "TraceError",
    "UnsortedTraceWarning",
    "WorkloadConfig",
    "available_profiles",
    "build_workload",
    "burst_arrivals",
    "check_rate_rescales",
    "clip_to_max_len",
    "filter_vllm",
    "fixed_workload",
    "gamma_arrivals",
    "load_profile",
    "load_tokenizer",
    "load_trace",
    "poisson_arrivals",
    "sample_profile",
    "sample_requests",
    "save_trace",
    "scale_trace_arrivals",
    "sort_and_renumber",
    "system_prompt_workload",
    "to_requests",
    "trace_statistics",
    "validate_workload_config",
    "with_arrivals",
    "workload_rows",
]
