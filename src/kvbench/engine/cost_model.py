"""Iteration latency from a roofline of model x hardware x tensor parallelism.

One iteration runs every scheduled sequence through the model once. Its time is

    overhead + allreduce + max(flops / (num_gpus x peak x compute_eff),
                               bytes / (num_gpus x HBM bandwidth x bandwidth_eff))

with the weights read once per iteration, the KV cache of every sequence read once and the new
tokens' KV written, and FLOPs = 2 x active parameters per token + attention (QK^T and PV).
An optional ``attention_time_s`` hook replaces the roofline's attention term by times measured
with real kernels. Derivation and constants: ``docs/cost_model.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvbench.core.specs import Deployment

# Attention FLOPs per (query token, context token) per layer and query-head dim: QK^T and PV,
# each a multiply-add (2 FLOPs).
ATTENTION_FLOPS_PER_PAIR = 4


@dataclass(frozen=True, slots=True)
class IterationShape:
    """What one iteration computes, in tokens.

    Attributes:
        num_prefill_tokens: prompt tokens processed (including recomputed ones).
        prefill_attention_pairs: sum over prefill tokens of the context each attends to.
        num_decode_tokens: sequences decoding one token each.
        decode_context_tokens: sum of the decode sequences' context lengths (KV read).
        decode_context_lens: per decode sequence context length, only when a measured attention
            hook needs it (else empty).
    """

    num_prefill_tokens: int
    prefill_attention_pairs: int
    num_decode_tokens: int
    decode_context_tokens: int
    decode_context_lens: tuple[int, ...] = ()


AttentionTimer = Callable[[IterationShape], float]


@dataclass(frozen=True)
class RooflineCostModel:
    """Prices an iteration and a swap from a Deployment and efficiency factors."""

    deployment: Deployment
    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    pcie_efficiency: float = 0.8
    iteration_overhead_s: float = 0.002
    allreduce_latency_s: float = 1.0e-5
    attention_time_s: AttentionTimer | None = None

    @property
    def _flops_per_s(self) -> float:
        hardware = self.deployment.hardware
        return self.deployment.num_gpus * hardware.peak_tflops * 1e12 * self.compute_efficiency

    @property
    def _bytes_per_s(self) -> float:
        hardware = self.deployment.hardware
        return (
            self.deployment.num_gpus
            * hardware.hbm_bandwidth_gb_per_s
            * 1e9
            * self.bandwidth_efficiency
        )

    def _attention_flops_per_pair(self) -> float:
        model = self.deployment.model
        return (
            ATTENTION_FLOPS_PER_PAIR * model.num_layers * model.num_attention_heads * model.head_dim
        )

    def _fixed_s(self) -> float:
        """Launch/scheduling overhead plus two all-reduces per layer when sharded."""
        num_gpus = self.deployment.num_gpus
        allreduce_s = 0.0
        if num_gpus > 1:
            allreduce_s = 2 * self.deployment.model.num_layers * self.allreduce_latency_s
        return self.iteration_overhead_s + allreduce_s

    def iteration_time_s(self, shape: IterationShape) -> float:
        """Seconds one iteration of this shape takes."""
        model = self.deployment.model
        kv_bytes_per_token = self.deployment.kv_bytes_per_token
        num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
        if num_tokens == 0:
            return 0.0
        dense_flops = 2.0 * model.active_parameters * num_tokens
        dense_bytes = model.weight_bytes + num_tokens * kv_bytes_per_token
        if self.attention_time_s is not None:
            # Measured kernels replace decode attention; prefill attention stays in the roofline.
            attention_flops = self._attention_flops_per_pair() * shape.prefill_attention_pairs
            body_s = max(
                (dense_flops + attention_flops) / self._flops_per_s, dense_bytes / self._bytes_per_s
            )
            return self._fixed_s() + body_s + self.attention_time_s(shape)
        attention_pairs = shape.prefill_attention_pairs + shape.decode_context_tokens
        flops = dense_flops + self._attention_flops_per_pair() * attention_pairs
        kv_read_bytes = shape.decode_context_tokens * kv_bytes_per_token
        bytes_moved = dense_bytes + kv_read_bytes
        return self._fixed_s() + max(flops / self._flops_per_s, bytes_moved / self._bytes_per_s)

    def decode_time_fn(self, num_decode_tokens: int) -> Callable[[int], float]:
        """``iteration_time_s`` of a decode-only iteration of ``num_decode_tokens`` sequences, as
        a function of their summed context: the same arithmetic in the same order (identical
        floats), with the constant terms computed once (the engine's fast path calls it per
        iteration)."""
        if self.attention_time_s is not None:
            return lambda decode_context_tokens: self.iteration_time_s(
                IterationShape(0, 0, num_decode_tokens, decode_context_tokens)
            )
        model = self.deployment.model
        kv_bytes_per_token = self.deployment.kv_bytes_per_token
        num_tokens = 0 + num_decode_tokens
        dense_flops = 2.0 * model.active_parameters * num_tokens
        dense_bytes = model.weight_bytes + num_tokens * kv_bytes_per_token
        flops_per_pair = self._attention_flops_per_pair()
        fixed_s = self._fixed_s()
        flops_per_s = self._flops_per_s
        bytes_per_s = self._bytes_per_s

        def decode_time_s(decode_context_tokens: int) -> float:
            flops = dense_flops + flops_per_pair * decode_context_tokens
            bytes_moved = dense_bytes + decode_context_tokens * kv_bytes_per_token
            return fixed_s + max(flops / flops_per_s, bytes_moved / bytes_per_s)

        return decode_time_s

    def iteration_time_fn(self) -> Callable[[IterationShape], float]:
        """``iteration_time_s``: the same arithmetic in the same order (identical floats), with
        the deployment's constants looked up once (the engine's fast path calls it per
        admitting iteration)."""
        if self.attention_time_s is not None:
            return self.iteration_time_s
        model = self.deployment.model
        active_parameters = model.active_parameters
        weight_bytes = model.weight_bytes
        kv_bytes_per_token = self.deployment.kv_bytes_per_token
        flops_per_pair = self._attention_flops_per_pair()
        fixed_s = self._fixed_s()
        flops_per_s = self._flops_per_s
        bytes_per_s = self._bytes_per_s

        def iteration_time_s(shape: IterationShape) -> float:
            num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
            if num_tokens == 0:
                return 0.0
            decode_context_tokens = shape.decode_context_tokens
            dense_flops = 2.0 * active_parameters * num_tokens
            dense_bytes = weight_bytes + num_tokens * kv_bytes_per_token
            attention_pairs = shape.prefill_attention_pairs + decode_context_tokens
            flops = dense_flops + flops_per_pair * attention_pairs
            kv_read_bytes = decode_context_tokens * kv_bytes_per_token
            bytes_moved = dense_bytes + kv_read_bytes
            return fixed_s + max(flops / flops_per_s, bytes_moved / bytes_per_s)

        return iteration_time_s

    def swap_time_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens of KV over PCIe (one direction, all GPUs)."""
        link_bytes_per_s = (
            self.deployment.num_gpus
            * self.deployment.hardware.pcie_gb_per_s
            * 1e9
            * self.pcie_efficiency
        )
        return num_tokens * self.deployment.kv_bytes_per_token / link_bytes_per_s
