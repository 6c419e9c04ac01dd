"""``python -m kvbench.tools.async_gap``: how far vLLM's async scheduling moves the schedule.

``scheduler=vllm_v1`` models vLLM 0.32 with synchronous scheduling by default, the CPU
platform's setting, and asynchronous scheduling, a GPU's default, with
``scheduler.async_scheduling=true``; both agree with vLLM step for step (docs/referee.md). Async,
step N+1 is scheduled before step N's output is taken in, so the requests finishing in step N
hold their blocks and seats through step N+1's scheduling. This tool runs the referee's real
scheduler both ways on the trace slices its tests replay (``--traces``, the first 80 requests
that fit an 8K context, arrivals at 20 steps per trace second, 1,200 blocks of 16 tokens: a pool
that preempts) and prints, per slice, the steps each took and how many steps later than under
synchronous scheduling each request was admitted and produced its last token: what choosing one
setting for the other costs, in steps (needs the referee, docs/referee.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from kvbench.core.request import Request
from kvbench.referee.vllm_v1 import RefereeLimits, RefereeStep, run_referee
from kvbench.workloads import load_trace, to_requests

TRACES = (
    "sharegpt/sharegpt_val_10k_llama2.csv",
    "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "azure2023/AzureLLMInferenceTrace_conv.csv",
    "mooncake/conversation_trace.jsonl",
    "arxiv/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
)
LIMITS = RefereeLimits(block_size=16, num_gpu_blocks=1200, max_num_seqs=64,
                       max_num_batched_tokens=2048, max_model_len=8192,
                       enable_prefix_caching=False)  # fmt: skip
NUM_REQUESTS = 80
STEPS_PER_S = 20


def trace_slice(path: Path) -> tuple[list[Request], list[int]]:
    """The slice's requests (ids 0..) and their arrival steps (all 0 without timestamps)."""
    frame = load_trace(path).head(400)
    fits = (frame["prompt_tokens"] >= 1) & (frame["output_tokens"] >= 1)
    fits &= frame["prompt_tokens"] + frame["output_tokens"] <= LIMITS.max_model_len
    frame = frame[fits].head(NUM_REQUESTS)
    timed = not frame["arrival_s"].isna().any()
    if not timed:  # a burst
        frame = frame.assign(arrival_s=0.0)
    requests = [dataclasses.replace(request, request_id=index)
                for index, request in enumerate(to_requests(frame))]  # fmt: skip
    if not timed:
        return requests, [0] * len(requests)
    first_s = min(request.arrival_s for request in requests)
    return requests, [int((r.arrival_s - first_s) * STEPS_PER_S) for r in requests]


def request_steps(steps: Sequence[RefereeStep], num_requests: int) -> list[tuple[int, int]]:
    """Per request: (the step it was first scheduled in, the last step it was scheduled in:
    the step that produced its last token)."""
    first = [-1] * num_requests
    last = [-1] * num_requests
    for step in steps:
        for request_id, _ in step.scheduled_tokens:
            if first[request_id] < 0:
                first[request_id] = step.step_index
            last[request_id] = step.step_index
    return list(zip(first, last, strict=True))


def gap_line(name: str, requests: list[Request], arrivals: list[int]) -> str:
    """One slice, both ways: steps, and the per-request delays of async over sync."""
    sync_steps = run_referee(requests, LIMITS, arrivals)
    async_steps = run_referee(requests, dataclasses.replace(LIMITS, async_scheduling=True),
                              arrivals)  # fmt: skip
    sync = request_steps(sync_steps, len(requests))
    lagged = request_steps(async_steps, len(requests))
    admit_delays = [a[0] - s[0] for s, a in zip(sync, lagged, strict=True)]
    end_delays = [a[1] - s[1] for s, a in zip(sync, lagged, strict=True)]
    spans = [s[1] - arrival + 1 for s, arrival in zip(sync, arrivals, strict=True)]
    num_preempted = sum(len(step.preempted_request_ids) for step in sync_steps)
    return (
        f"{name}: {len(requests)} requests, {len(sync_steps)} steps sync / {len(async_steps)} "
        f"async, {num_preempted} preemptions sync; admitted later async: "
        f"{sum(d > 0 for d in admit_delays)} (mean {statistics.fmean(admit_delays):+.2f} "
        f"steps, max {max(admit_delays):+d}); last token later: "
        f"{sum(d > 0 for d in end_delays)}, earlier: {sum(d < 0 for d in end_delays)} (mean "
        f"{statistics.fmean(end_delays):+.2f} steps, {100 * statistics.fmean(end_delays) / statistics.fmean(spans):+.2f} % "  # noqa: E501
        f"of the mean {statistics.fmean(spans):.0f}-step request)"
    )


def main(argv: list[str] | None = None) -> int:
    """Print one line per trace slice."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces"),
                        help="the folder holding the shared traces")  # fmt: skip
    args = parser.parse_args(argv)
    missing = [name for name in TRACES if not (args.traces / name).is_file()]
    if missing:  # before the first slice's replay, not after it
        parser.error(f"--traces {args.traces}: no {', '.join(missing)} there; expected the "
                     "shared traces folder (../shared/traces beside the checkout)")
    for name in TRACES:
        requests, arrivals = trace_slice(args.traces / name)
        print(gap_line(name, requests, arrivals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
