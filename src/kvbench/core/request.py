"""The request record every stage of kvbench passes along."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """One LLM request as the engine sees it (token counts only, no text).

    Attributes:
        request_id: unique id within a workload.
        arrival_s: arrival time in seconds from the start of the run.
        prompt_tokens: tokens in the prompt (prefill).
        output_tokens: tokens the request generates (its output length, clipped to the
            model's context when the input asked for more).
        prefix_group: explicit shared-prefix group (requests of one group share their first
            ``prefix_tokens`` prompt tokens), or None.
        prefix_tokens: length of the shared prefix of ``prefix_group``, in tokens.
        prefix_block_hashes: hashes naming consecutive prompt blocks of ``hash_block_tokens``
            tokens each (Mooncake's ``hash_ids``); equal hashes mean identical prefix blocks.
        hash_block_tokens: tokens covered by one entry of ``prefix_block_hashes``.
        num_samples: parallel samples (n) generated from one prompt.
        beam_width: beam width for beam search (1 = no beam search).
        requested_output_tokens: the output length the input asked for (None: ``output_tokens``,
            nothing was clipped).
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None = None
    prefix_tokens: int = 0
    prefix_block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0
    num_samples: int = 1
    beam_width: int = 1
    requested_output_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        """Prompt plus output: the length the request's KV cache reaches at its end."""
        return self.prompt_tokens + self.output_tokens
