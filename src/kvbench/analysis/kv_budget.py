"""The budgeting claim: as context and batch grow, the KV cache overtakes the model's weights.

Pure arithmetic on a ``Deployment`` (the catalog's bytes): the weights, the KV bytes the tokens
use, and the KV bytes each allocator holds for them, over the context length of the running
sequences and over their number. The crossover is where the KV cache equals the weights:
``weight_bytes / kv_bytes_per_token`` tokens in flight (Llama-2-70B fp16: 137.96 GB / 327,680
B = 421,020 tokens; Llama-3-8B bf16: 16.06 GB / 131,072 B = 122,528 tokens).

What each allocator holds for one sequence of ``L`` tokens (prompt + output so far, at the end of
its generation, so that Oracle's reservation is all used):

- ``naive_max``: ``max_model_len`` slots, rounded up to a power of two by its buddy allocator;
- ``naive_oracle``: ``L`` rounded up to a power of two (the buddy block of its true length);
- ``paged``: ``L`` rounded up to a whole block.

``naive_pow2`` is left out: its reservation depends on how ``L`` splits into prompt and output
(it lies between Oracle's and Max's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kvbench.core.specs import Deployment

BUDGET_ALLOCATORS = ("naive_max", "naive_oracle", "paged")


def _next_power_of_two(value: int) -> int:
    # The buddy allocator's rounding (kvbench.allocators.buddy.next_power_of_two, which the
    # analysis stage may not import).
    return 1 << max(0, value - 1).bit_length()


def held_slots_per_sequence(
    allocator: str, context_tokens: int, max_model_len: int, block_size: int
) -> int:
    """Slots ``allocator`` holds for one sequence of ``context_tokens`` tokens (module doc)."""
    if allocator == "naive_max":
        return _next_power_of_two(max_model_len)
    if allocator == "naive_oracle":
        return _next_power_of_two(min(context_tokens, max_model_len))
    if allocator == "paged":
        return math.ceil(context_tokens / block_size) * block_size
    raise ValueError(
        f"allocator={allocator}: the budget holds a rule for {', '.join(BUDGET_ALLOCATORS)} only"
    )


@dataclass(frozen=True)
class KvBudget:
    """The memory figures of one deployment that the budget series are drawn against."""

    weight_bytes: float
    kv_bytes_per_token: int
    kv_cache_bytes: float
    max_model_len: int

    @property
    def crossover_tokens(self) -> float:
        """Tokens in flight whose KV equals the weights: ``weight_bytes / kv_bytes_per_token``."""
        return self.weight_bytes / self.kv_bytes_per_token

    @property
    def pool_tokens(self) -> int:
        """Tokens the deployment's KV pool holds."""
        return int(self.kv_cache_bytes // self.kv_bytes_per_token)


def kv_budget(deployment: Deployment) -> KvBudget:
    """The weights, KV bytes per token and KV pool of ``deployment``."""
    return KvBudget(
        weight_bytes=deployment.model.weight_bytes,
        kv_bytes_per_token=deployment.kv_bytes_per_token,
        kv_cache_bytes=deployment.kv_cache_bytes,
        max_model_len=deployment.model.max_model_len,
    )


def budget_series(
    budget: KvBudget, context_tokens: list[int], num_seqs: list[int], block_size: int
) -> pd.DataFrame:
    """One row per (context length, sequence count): weights, KV used and KV held per allocator.

    Columns: ``context_tokens``, ``num_seqs``, ``tokens_in_flight`` (their product),
    ``weights_gb``, ``kv_used_gb`` and ``kv_held_gb_<allocator>`` for each of
    ``BUDGET_ALLOCATORS`` (GB = 10^9 bytes).
    """
    rows = []
    for context in context_tokens:
        held_slots = {
            name: held_slots_per_sequence(name, context, budget.max_model_len, block_size)
            for name in BUDGET_ALLOCATORS
        }
        for count in num_seqs:
            row: dict[str, float] = {
                "context_tokens": context,
                "num_seqs": count,
                "tokens_in_flight": context * count,
                "weights_gb": budget.weight_bytes / 1e9,
                "kv_used_gb": context * count * budget.kv_bytes_per_token / 1e9,
            }
            for name, slots in held_slots.items():
                row[f"kv_held_gb_{name}"] = slots * count * budget.kv_bytes_per_token / 1e9
            rows.append(row)
    return pd.DataFrame(rows)


def crossover_num_seqs(budget: KvBudget, allocator: str | None, context_tokens: int,
                       block_size: int) -> float:  # fmt: skip
    """Sequences of ``context_tokens`` whose KV (used, or held by ``allocator``) equals the
    weights."""
    slots = (
        context_tokens
        if allocator is None
        else held_slots_per_sequence(allocator, context_tokens, budget.max_model_len, block_size)
    )
    return budget.weight_bytes / (slots * budget.kv_bytes_per_token)


def crossover_context_tokens(
    budget: KvBudget, allocator: str | None, num_seqs: int, block_size: int
) -> int | None:
    """The shortest context at which ``num_seqs`` sequences' KV (used, or held by
    ``allocator``) reaches the weights; None when even ``max_model_len`` tokens do not."""

    def reaches(context: int) -> bool:
        slots = (
            context
            if allocator is None
            else held_slots_per_sequence(allocator, context, budget.max_model_len, block_size)
        )
        return slots * num_seqs * budget.kv_bytes_per_token >= budget.weight_bytes

    if not reaches(budget.max_model_len):
        return None
    low, high = 1, budget.max_model_len  # held slots never shrink as the context grows
    while low < high:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle + 1
    return low
