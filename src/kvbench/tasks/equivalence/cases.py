"""What the harness generates: prompts (token ids), their shared prefix and their samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvbench.core.request import Request


@dataclass(frozen=True)
class PromptCase:
    """One prompt and how it is decoded.

    Attributes:
        prompt_id: index of the prompt in the run.
        token_ids: the prompt's token ids.
        prefix_tokens: leading tokens identical across the run's prompts (prefix group 0), which
            ``paged_prefix`` shares; 0: none.
        num_samples: sequences decoded from the prompt. Sample ``s`` starts with the token
            ranked ``s`` (0: the argmax) and continues greedily, so samples diverge and a second
            sample is a fork whose first write into a shared partial block copies it.
    """

    prompt_id: int
    token_ids: tuple[int, ...]
    prefix_tokens: int = 0
    num_samples: int = 1

    def seq_id(self, sample: int) -> int:
        """The allocator's sequence id of sample ``sample`` (unique across the run's cases)."""
        return self.prompt_id * self.num_samples + sample

    def request(self, num_decode_steps: int) -> Request:
        """The request the allocators see (token counts and the prefix group only)."""
        return Request(
            request_id=self.prompt_id,
            arrival_s=0.0,
            prompt_tokens=len(self.token_ids),
            output_tokens=num_decode_steps + 1,
            prefix_group=0 if self.prefix_tokens > 0 else None,
            prefix_tokens=self.prefix_tokens,
            num_samples=self.num_samples,
        )


@dataclass
class Trajectory:
    """One sequence's logits and tokens.

    Attributes:
        logits: [num_decode_steps + 1, vocab]: row 0 from the prompt, row k after the k-th
            generated token was fed.
        tokens: the token chosen from each row of ``logits``.
    """

    logits: torch.Tensor
    tokens: list[int]


def choose_token(logits: torch.Tensor, rank: int) -> int:
    """The token ranked ``rank`` by ``logits`` [vocab] (0: greedy)."""
    return int(torch.topk(logits, rank + 1).indices[rank])


def shared_prefix_cases(
    prompts: Sequence[Sequence[int]], num_samples: int
) -> list[PromptCase]:
    """Cases for ``prompts`` with their common leading tokens marked as a shared prefix."""
    prefix_tokens = _common_prefix_len(prompts) if len(prompts) > 1 else 0
    return [
        PromptCase(index, tuple(ids), prefix_tokens, num_samples)
        for index, ids in enumerate(prompts)
    ]


def _common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    length = 0
    for column in zip(*prompts, strict=False):
        if len(set(column)) != 1:
            break
        length += 1
    # The last token of a prompt is always computed, so a prefix is at most len - 1 of the
    # shortest prompt.
    return min(length, min(len(ids) for ids in prompts) - 1)
