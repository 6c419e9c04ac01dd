"""Workloads: read real request traces, shape them, and build the requests a run replays.

Typical use::

    from kvbench.workloads import WorkloadConfig, build_workload, to_requests

    requests = to_requests(build_workload(WorkloadConfig(name="sharegpt"), max_model_len=2048))

``load_trace`` reads Vidur/Sarathi, Azure, Mooncake, lengths CSVs, Alpaca and ShareGPT raw text
(tokenized) and kvbench's own parquet; the shipped profiles (``sample_profile``) make the
default workloads run offline.
"""

from kvbench.workloads.arrivals import (
    burst_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    scale_trace_arrivals,
)
from kvbench.workloads.build import build_workload
from kvbench.workloads.config import WorkloadConfig, validate_workload_config
from kvbench.workloads.errors import TokenizerUnavailableError, TraceError, UnsortedTraceWarning
from kvbench.workloads.load import load_trace
from kvbench.workloads.parquet_io import save_trace
from kvbench.workloads.profiles import available_profiles, load_profile, sample_profile
from kvbench.workloads.request_conversion import to_requests
from kvbench.workloads.stats import trace_statistics
from kvbench.workloads.synthetic import fixed_workload, system_prompt_workload
from kvbench.workloads.tokenizer import load_tokenizer
from kvbench.workloads.transforms import (
    clip_to_max_len,
    filter_vllm,
    sample_requests,
    sort_and_renumber,
)

__all__ = [
    "TokenizerUnavailableError",
    "TraceError",
    "UnsortedTraceWarning",
    "WorkloadConfig",
    "available_profiles",
    "build_workload",
    "burst_arrivals",
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
]
