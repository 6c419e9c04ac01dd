"""The reference: transformers' stock contiguous cache (``DynamicCache``) and SDPA attention."""

from __future__ import annotations

import inspect
from typing import Any

import torch


class StockRunner:
    """One sequence at a time through the model's own cache: prefill, then one token a step."""

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache

        self.model = model
        self._new_cache = lambda: DynamicCache(config=model.config)
        self._caches: dict[int, Any] = {}
        self._cache_kwarg = cache_kwarg(model)

    def prefill(self, seq_id: int, prompt_ids: list[int]) -> torch.Tensor:
        """Run the prompt into a fresh cache; returns the last position's logits [vocab]."""
        self._caches[seq_id] = self._new_cache()
        return self._forward(seq_id, prompt_ids)

    def decode(self, seq_id: int, token: int) -> torch.Tensor:
        """Feed one token; returns its logits [vocab]."""
        return self._forward(seq_id, [token])

    def free(self, seq_id: int) -> None:
        """Drop the sequence's cache."""
        del self._caches[seq_id]

    def _forward(self, seq_id: int, token_ids: list[int]) -> torch.Tensor:
        input_ids = torch.tensor([token_ids])  # [1, num_new]
        with torch.inference_mode():
            cache = {self._cache_kwarg: self._caches[seq_id]}
            output = self.model(input_ids, use_cache=True, **cache)
        return output.logits[0, -1]  # [vocab]


def cache_kwarg(model: Any) -> str:
    """The name of the model's cache argument: transformers 5 renamed ``past_key_values`` to
    ``cache`` (the old name warns until 5.40)."""
    parameters = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
