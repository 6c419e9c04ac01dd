"""Every request of every shared trace finishes or is rejected with a reason, under every allocator.

The fast version replays the first requests of each trace all at once (the hardest case for the
pool: a burst); the `slow` one replays every request of every trace at the trace's own pace.
"""

import numpy as np
import pytest
from conftest import SHARED_TRACE_FILES

from kvbench.allocators import ALLOCATOR_NAMES, make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.engine.records import REJECT_REASONS
from kvbench.workloads import load_trace, to_requests

TRACES = SHARED_TRACE_FILES
# Llama-3-8B (8K context) on one L40S: a small pool (about 16K slots after the weights), so long
# traces preempt, and Mooncake's 100K-token prompts are rejected as too long.
DEPLOYMENT = get_deployment("llama-3-8b", "l40s")


def _replay(trace_path, allocator_name, num_requests=None, burst=True):
    frame = load_trace(trace_path)
    if num_requests is not None:
        frame = frame.head(num_requests)
    if burst or frame["arrival_s"].isna().any():
        frame = frame.assign(arrival_s=np.zeros(len(frame)))
    max_model_len = DEPLOYMENT.model.max_model_len
    allocator = make_allocator(allocator_name, DEPLOYMENT.num_kv_slots, 16, max_model_len)
    limits = SchedulerLimits(max_model_len=max_model_len, max_num_batched_tokens=max_model_len)
    return simulate(to_requests(frame), Scheduler(limits), allocator, RooflineCostModel(DEPLOYMENT))


def _check_no_request_lost(result, num_requests):
    records = result.requests
    assert len(records) == num_requests
    statuses = {record.status for record in records}
    assert statuses <= {"finished", "rejected"}
    for record in records:
        if record.status == "rejected":
            assert record.reject_reason in REJECT_REASONS
            assert record.prompt_tokens + record.output_tokens > DEPLOYMENT.model.max_model_len or (
                record.reject_reason == "exceeds_pool"
            )
        else:
            assert record.finish_s >= record.first_token_s >= record.arrival_s


@pytest.mark.parametrize("allocator_name", ALLOCATOR_NAMES)
@pytest.mark.parametrize("trace", TRACES)
def test_first_requests_of_each_trace_all_end(shared_traces, trace, allocator_name):
    result = _replay(shared_traces / trace, allocator_name, num_requests=150)
    _check_no_request_lost(result, 150)


@pytest.mark.slow
@pytest.mark.parametrize("allocator_name", ALLOCATOR_NAMES)
@pytest.mark.parametrize("trace", TRACES)
def test_every_request_of_each_trace_ends(shared_traces, trace, allocator_name):
    frame_rows = len(load_trace(shared_traces / trace))
    result = _replay(shared_traces / trace, allocator_name, burst=False)
    _check_no_request_lost(result, frame_rows)
