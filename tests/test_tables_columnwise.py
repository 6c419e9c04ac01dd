"""Request and step tables built column by column equal the construction they replace
(``pd.DataFrame([asdict(record)])``, ``pd.DataFrame(lists)``): same columns, order, dtypes and
values."""

import dataclasses
from dataclasses import asdict

import numpy as np
import pandas as pd

from kvbench.allocators import make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.engine.records import RequestRecord
from kvbench.tables.parquet_stream import ParquetStream
from kvbench.tables.record_columns import record_columns, records_frame
from kvbench.tasks.simulate.table import (
    GB,
    add_request_latencies,
    requests_frame,
    step_table,
    steps_frame,
)

OPT13B = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12)
MAX_LEN = 2048


def _finished_and_rejected_run():
    """A run with finished requests, one rejected as too long and one too large for the pool,
    and enough pressure to preempt."""
    lengths = [(20 + 37 * i % 500, 10 + 53 * i % 480) for i in range(60)]
    lengths[3] = (MAX_LEN + 5, 10)  # longer than the model's context
    lengths[7] = (1500, 400)  # more than the 1,024-slot pool
    requests = [Request(request_id=i, arrival_s=i * 0.002, prompt_tokens=p, output_tokens=o)
                for i, (p, o) in enumerate(lengths)]  # fmt: skip
    allocator = make_allocator("paged", 1024, 16, MAX_LEN)
    scheduler = Scheduler(SchedulerLimits(max_model_len=MAX_LEN))
    return simulate(requests, scheduler, allocator, RooflineCostModel(OPT13B))


def _rowwise_requests_frame(result):
    return add_request_latencies(pd.DataFrame([asdict(record) for record in result.requests]))


def _step_lists(columns):
    """The step columns as the engine once held them: lists of Python values."""
    return {name: [bool(value) for value in values] if name == "memory_blocked" else list(values)
            for name, values in columns.items()}


def _rowwise_step_table(columns, deployment):
    steps = pd.DataFrame(_step_lists(columns))
    for category in ("token_states", "reservation", "internal_frag", "external_frag", "free",
                     "shared"):
        slots = steps[f"{category}_slots"].astype("float64")
        steps[f"{category}_gb"] = deployment.slots_to_bytes(slots) / GB
    return steps


def test_requests_frame_equals_the_asdict_table_on_finished_and_rejected_records():
    result = _finished_and_rejected_run()
    statuses = {record.status for record in result.requests}
    assert statuses == {"finished", "rejected"}
    assert any(record.num_preemptions for record in result.requests)
    columnwise = requests_frame(result)
    pd.testing.assert_frame_equal(columnwise, _rowwise_requests_frame(result))
    fields = [field.name for field in dataclasses.fields(RequestRecord)]
    assert list(columnwise.columns[: len(fields)]) == fields


def test_steps_frame_equals_the_table_pandas_infers_from_the_step_lists():
    result = _finished_and_rejected_run()
    columnwise = steps_frame(result, OPT13B)
    pd.testing.assert_frame_equal(columnwise, _rowwise_step_table(result.steps.columns, OPT13B))
    assert columnwise["memory_blocked"].dtype == np.bool_
    # A streamed chunk comes as typed arrays: the same table.
    lists = _step_lists(result.steps.columns)
    arrays = {name: np.asarray(values) for name, values in lists.items()}
    pd.testing.assert_frame_equal(step_table(arrays, OPT13B), columnwise)


@dataclasses.dataclass(slots=True)
class _GrownRecord:
    """A record with fields of every kind, as RequestRecord grows them (``output_clipped``)."""

    request_id: int
    arrival_s: float
    requested_output_tokens: int
    output_clipped: bool
    reject_reason: str = ""
    finish_s: float = float("nan")


def test_a_field_added_to_the_record_becomes_a_column_without_naming_it():
    records = [_GrownRecord(i, 0.5 * i, 10 + i, i % 2 == 0, "" if i else "empty_prompt")
               for i in range(5)]  # fmt: skip
    records[2].finish_s = 3.25
    expected = pd.DataFrame([asdict(record) for record in records])
    pd.testing.assert_frame_equal(records_frame(records, _GrownRecord), expected)
    assert records_frame(records, _GrownRecord)["output_clipped"].dtype == np.bool_


def test_an_empty_table_keeps_the_columns_typed_by_the_fields():
    empty = records_frame([], _GrownRecord)
    assert list(empty.columns) == [field.name for field in dataclasses.fields(_GrownRecord)]
    assert empty.dtypes.to_dict() == {
        "request_id": np.int64, "arrival_s": np.float64, "requested_output_tokens": np.int64,
        "output_clipped": np.bool_, "reject_reason": object, "finish_s": np.float64,
    }  # fmt: skip
    assert record_columns([], _GrownRecord) == {name: [] for name in empty.columns}


def test_streamed_request_records_equal_the_table(tmp_path):
    result = _finished_and_rejected_run()
    stream = ParquetStream(tmp_path / "requests.parquet", {})
    stream.write_records(result.requests[:10])
    stream.write_records(result.requests[10:])
    read_back = pd.read_parquet(stream.close())
    pd.testing.assert_frame_equal(read_back, records_frame(result.requests, RequestRecord))
