"""Requests waiting to arrive: the engine takes them in arrival order as the clock passes them."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as SequenceOf

from kvbench.core.request import Request
from kvbench.engine.records import RequestRecord, request_record
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.sequence import Sequence

RECORDS_PER_CHUNK = 65_536
RecordSink = Callable[[list[RequestRecord]], None]


class Arrivals:
    """The requests of a run sorted by (arrival, id), and how many have arrived so far.

    A request's engine sequence and record are made when it arrives, so a run holds only the
    records of requests that arrived (``records``, in arrival order). With a ``sink``, each time
    ``RECORDS_PER_CHUNK`` leading records have ended (finished or rejected) they are handed to it
    and dropped, so the records held are those of requests in flight plus less than a chunk.
    """

    def __init__(
        self, requests: SequenceOf[Request], sink: RecordSink | None = None
    ) -> None:
        self._pending = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self._num_arrived = 0
        self.records: list[RequestRecord] = []
        self._sink = sink
        self._num_ended_leading = 0  # records[:this] have all ended

    @property
    def first_free_seq_id(self) -> int:
        """An id above every request id: forked sequences count up from it."""
        return max((r.request_id for r in self._pending), default=-1) + 1

    @property
    def num_pending(self) -> int:
        """Requests still to arrive."""
        return len(self._pending) - self._num_arrived

    @property
    def latest_arrival_s(self) -> float:
        """When the latest request queued so far arrived (-inf before any)."""
        if self._num_arrived:
            return self._pending[self._num_arrived - 1].arrival_s
        return float("-inf")

    def next_arrival_s(self) -> float:
        """When the next request arrives (inf when none is left)."""
        if self._num_arrived < len(self._pending):
            return self._pending[self._num_arrived].arrival_s
        return float("inf")

    def admit_until(self, now_s: float, scheduler: Scheduler, samples: SampleGroups) -> int:
        """Queue every request that arrived by ``now_s`` (or reject it for good, with its
        reason); returns how many were rejected."""
        num_rejected = 0
        while (request := self.pop_arrived(now_s)) is not None:
            seq = _new_sequence(request)
            self.records.append(seq.record)
            reason = scheduler.rejection_reason(seq)
            if reason:
                seq.record.mark_rejected(reason)
                num_rejected += 1
            else:
                samples.start(seq)
                scheduler.add(seq)
        return num_rejected

    def pop_arrived(self, now_s: float) -> Request | None:
        """The next request, taken out of those pending, if it arrived by ``now_s``; else
        None."""
        num_arrived = self._num_arrived
        if num_arrived < len(self._pending):
            request = self._pending[num_arrived]
            if request.arrival_s <= now_s:
                self._num_arrived = num_arrived + 1
                return request
        return None

    def flush_ended(self) -> None:
        """Hand the leading ended records to the sink once they fill a chunk (no sink: keep)."""
        if self._sink is None:
            return
        records = self.records
        num_ended = self._num_ended_leading
        while num_ended < len(records) and records[num_ended].status != "pending":
            num_ended += 1
        self._num_ended_leading = num_ended
        if num_ended >= RECORDS_PER_CHUNK:
            self._sink(records[:num_ended])
            del records[:num_ended]
            self._num_ended_leading = 0

    def close(self) -> None:
        """Hand every remaining record to the sink (at the end of the run)."""
        if self._sink is not None and self.records:
            self._sink(self.records)
            self.records = []
            self._num_ended_leading = 0


def _new_sequence(request: Request) -> Sequence:
    return Sequence(request=request, record=request_record(request), seq_id=request.request_id)
