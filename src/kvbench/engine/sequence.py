"""The engine's mutable view of one request while it is served."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.request import Request
from kvbench.engine.records import RequestRecord


@dataclass(slots=True, eq=False)  # identity: two samples of one request are distinct
class Sequence:
    """One sequence of a request in the engine: how many tokens it generated, where its KV lives.

    A request with ``num_samples`` n > 1 is prefilled once as one sequence, which forks into n
    sequences (parallel samples sharing the prompt's KV) once its first token is out; one with
    ``beam_width`` k > 1 forks into k beams, which ``kvbench.engine.beams`` forks and drops
    along recorded beam ancestry after every later step.

    Its KV cache holds ``prompt + generated`` tokens while it runs (the slot of a generated token
    is taken in the iteration that produces it), so it ends at ``prompt + output`` tokens.
    """

    request: Request
    record: RequestRecord
    seq_id: int  # the allocator's id: the request's id, or a fresh one for a forked sample
    num_generated: int = 0
    # Leading tokens whose KV the allocator already held at the last admission (prefix cache
    # hits): prefill does not compute them.
    num_cached_tokens: int = 0

    def fork(self, seq_id: int) -> Sequence:
        """A sibling under ``seq_id`` that generated what this one did (a forked sample or beam):
        same request, same record, nothing cached yet."""
        return Sequence(
            request=self.request,
            record=self.record,
            seq_id=seq_id,
            num_generated=self.num_generated,
        )

    @property
    def num_kv_tokens(self) -> int:
        """Tokens whose K/V the sequence holds (or held before it was preempted)."""
        return self.request.prompt_tokens + self.num_generated

    @property
    def num_reused_tokens(self) -> int:
        """Leading tokens a (re)admission does not compute: its cached prefix, less its last
        token (a prompt cached whole computes that one, for its logits; vLLM never reports the
        whole prompt cached)."""
        return min(self.num_cached_tokens, self.num_kv_tokens - 1)

    @property
    def is_done(self) -> bool:
        """Whether every output token has been generated."""
        return self.num_generated >= self.request.output_tokens
