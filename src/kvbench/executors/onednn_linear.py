"""``executor.linear_backend=onednn``: a model's linear layers through oneDNN on the CPU.

A transformers model's ``nn.Linear`` calls aten's matmul, which on an x86 CPU is MKL's sgemm.
vLLM's CPU backend calls oneDNN on weights it prepacked at load. On some CPUs the two libraries
differ by 2x at serving's batch sizes (an AMD EPYC: SmolLM2's 211 linears on 16 rows, 93 ms
through MKL, 45 ms through oneDNN; docs/sim_to_real.md), and that difference is the matmul
library's, not the serving engine's. This module gives the real executor vLLM's library: each
linear's weight is reordered once into oneDNN's blocked layout and its forward calls oneDNN's
linear on it. Outputs equal aten's up to float rounding (a different summation order), so the
logits are no longer bit for bit the stock model's: ``aten`` stays the default.
"""

from __future__ import annotations

from typing import Any

import torch


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Route every ``nn.Linear`` of ``model`` (on the CPU) through oneDNN with its weight
    prepacked; returns how many. The plain weight is then dropped (kept on the meta device, so
    its shape and dtype still read) unless another module shares it (tied embeddings): the
    packed copy replaces it rather than doubling the model's memory."""
    shared = {id(module.weight) for module in model.modules()
              if not isinstance(module, torch.nn.Linear) and hasattr(module, "weight")}  # fmt: skip
    num_linears = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight = module.weight.detach()  # [out_features, in_features]
        # No batch-size hint: measured as quick as a hint of 16 rows at 1-64 rows.
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)  # opaque oneDNN tensor
        bias = None if module.bias is None else module.bias.detach()  # [out_features]
        module.forward = _onednn_forward(packed, bias)  # type: ignore[method-assign]
        if id(module.weight) not in shared:
            module.weight = torch.nn.Parameter(weight.to("meta"), requires_grad=False)
        num_linears += 1
    return num_linears


def _onednn_forward(packed: torch.Tensor, bias: torch.Tensor | None) -> Any:
    def forward(hidden: torch.Tensor) -> torch.Tensor:
        # hidden [..., in_features] -> [..., out_features]
        return torch.ops.mkldnn._linear_pointwise(hidden, packed, bias, "none", [], "")

    return forward
