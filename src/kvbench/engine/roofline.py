"""Iteration latency from a roofline of model x hardware x tensor parallelism.

One iteration runs every scheduled sequence through the model once. Its time is

    overhead + allreduce + max(flops / (num_gpus x peak x compute_eff),
                               bytes / (num_gpus x HBM bandwidth x bandwidth_eff))

with the weights read once per iteration, the KV cache of every sequence read once and the new
tokens' KV written, and FLOPs = 2 x active parameters per token + attention (QK^T and PV).
An optional ``attention_time_s`` hook replaces the roofline's decode-attention term by times
measured with real kernels. Derivation and constants: ``docs/cost_model.md``.

Sliding-window layers (a hybrid model's) attend to their last ``w`` tokens only: their share of
the layers reads, per decoding sequence, ``min(context, w)`` tokens of KV, and a prefill token
attends to at most ``w`` tokens. Prefill is counted exactly from each prefilled sequence's
span (``IterationShape.prefill_spans``): token ``i`` attends to ``min(i + 1, w)`` tokens.
Decode gets only the batch's summed context (the engine's fast path keeps that sum, not each
sequence's length), so its windowed read is bounded from the sum: ``min(sum of contexts, decode
sequences x w)``, exact when every decoding sequence is at least the window long (or none is),
otherwise above the true figure (the roofline never under-charges); a shape without spans
bounds prefill the same way, ``min(causal pairs, prefill tokens x w)``. A model without sliding
layers keeps the formula above, float for float.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from kvbench.core.specs import Deployment
from kvbench.engine.cost_model import DecodeTimeFn, IterationShape, decode_time_by_shape

# Attention FLOPs per (query token, context token) per layer and query-head dim: QK^T and PV,
# each a multiply-add (2 FLOPs).
ATTENTION_FLOPS_PER_PAIR = 4

AttentionTimer = Callable[[IterationShape], float]


class IterationTimeFn(Protocol):
    """Seconds of an iteration of a given token count (``RooflineTerms.time_fn``)."""

    def __call__(
        self,
        decode_context_tokens: int,
        prefill_attention_pairs: int = 0,
        prefill_window_pairs: int | None = None,
    ) -> float:
        """Seconds, given the KV tokens decode reads and the causal pairs prefill attends to
        (``prefill_window_pairs``: those within a sliding layer's window, when known)."""
        ...


def windowed_prefill_pairs(spans: tuple[tuple[int, int], ...], window_tokens: int) -> int:
    """(query, key) pairs a sliding layer of ``window_tokens`` computes in prefilling ``spans``
    ((KV tokens, cached tokens) per sequence): token ``i`` attends to ``min(i + 1, w)``."""
    return sum(
        _window_pairs_below(length, window_tokens) - _window_pairs_below(cached, window_tokens)
        for length, cached in spans
    )


def _window_pairs_below(num_tokens: int, window_tokens: int) -> int:
    """Pairs of a sliding layer over tokens ``0 .. num_tokens - 1``."""
    if num_tokens <= window_tokens:
        return num_tokens * (num_tokens + 1) // 2
    return window_tokens * (window_tokens + 1) // 2 + (num_tokens - window_tokens) * window_tokens


@dataclass(frozen=True, slots=True)
class RooflineTerms:
    """The roofline's constants for one deployment, looked up once, and its formula."""

    active_parameters: float
    weight_bytes: float
    kv_bytes_per_token: int
    attention_flops_per_pair: int  # per (query token, context token), all layers and heads
    fixed_s: float  # launch/scheduling overhead plus the all-reduces under tensor parallelism
    flops_per_s: float  # effective, all GPUs
    bytes_per_s: float  # effective HBM bandwidth, all GPUs
    window_tokens: int | None = None  # the sliding layers' window (None: no layer slides)
    sliding_layer_fraction: float = 0.0  # of the layers (and so of the KV bytes and FLOPs)

    def time_fn(self, num_tokens: int, num_decode_tokens: int | None = None) -> IterationTimeFn:
        """Seconds of an iteration of ``num_tokens`` tokens, ``num_decode_tokens`` of them
        decoding (None: all), as a function ``time_s(decode_context_tokens,
        prefill_attention_pairs=0)`` of the KV its decode sequences read and the causal pairs
        its prefill attends to: the roofline formula, its only copy, with the terms that depend
        on the token counts alone computed once (the fast path calls it every iteration). Every
        caller gets the same float operations in the same order, so identical floats."""
        if self.window_tokens is not None:
            num_decode = num_tokens if num_decode_tokens is None else num_decode_tokens
            return self._windowed_time_fn(num_tokens, num_decode, self.window_tokens)
        kv_bytes_per_token = self.kv_bytes_per_token
        attention_flops_per_pair = self.attention_flops_per_pair
        fixed_s = self.fixed_s
        flops_per_s = self.flops_per_s
        bytes_per_s = self.bytes_per_s
        dense_flops = 2.0 * self.active_parameters * num_tokens
        dense_bytes = self.weight_bytes + num_tokens * kv_bytes_per_token

        def time_s(
            decode_context_tokens: int,
            prefill_attention_pairs: int = 0,
            prefill_window_pairs: int | None = None,  # no layer slides: not used
        ) -> float:
            attention_pairs = prefill_attention_pairs + decode_context_tokens
            flops = dense_flops + attention_flops_per_pair * attention_pairs
            bytes_moved = dense_bytes + decode_context_tokens * kv_bytes_per_token
            return fixed_s + max(flops / flops_per_s, bytes_moved / bytes_per_s)

        return time_s

    def _windowed_time_fn(
        self, num_tokens: int, num_decode_tokens: int, window_tokens: int
    ) -> IterationTimeFn:
        """``time_fn`` of a model with sliding layers: their share of the attention reads and
        FLOPs bounded by the window (module doc)."""
        kv_bytes_per_token = self.kv_bytes_per_token
        attention_flops_per_pair = self.attention_flops_per_pair
        fixed_s = self.fixed_s
        flops_per_s = self.flops_per_s
        bytes_per_s = self.bytes_per_s
        sliding = self.sliding_layer_fraction
        full = 1.0 - sliding
        dense_flops = 2.0 * self.active_parameters * num_tokens
        dense_bytes = self.weight_bytes + num_tokens * kv_bytes_per_token
        decode_window_tokens = num_decode_tokens * window_tokens
        prefill_window_bound = (num_tokens - num_decode_tokens) * window_tokens

        def time_s(
            decode_context_tokens: int,
            prefill_attention_pairs: int = 0,
            prefill_window_pairs: int | None = None,
        ) -> float:
            # Tokens (decode) and pairs (prefill) of the whole model's layers, the sliding
            # layers' part within the window (prefill's bounded when not given).
            decode_tokens_read = full * decode_context_tokens + sliding * min(
                decode_context_tokens, decode_window_tokens
            )
            if prefill_window_pairs is None:
                prefill_window_pairs = min(prefill_attention_pairs, prefill_window_bound)
            prefill_pairs = full * prefill_attention_pairs + sliding * prefill_window_pairs
            flops = dense_flops + attention_flops_per_pair * (prefill_pairs + decode_tokens_read)
            bytes_moved = dense_bytes + decode_tokens_read * kv_bytes_per_token
            return fixed_s + max(flops / flops_per_s, bytes_moved / bytes_per_s)

        return time_s


@dataclass(frozen=True, slots=True)
class PageMapping:
    """What mapping vAttention's physical pages costs an iteration (``docs/kv_designs.md``).

    A request's K/V grows into a new page group every ``tokens_per_page`` tokens: one
    ``cuMemMap`` per layer and K/V tensor (``pages_per_group``), on every GPU at once. Priced at
    its expectation, ``tokens / tokens_per_page x pages_per_group x latency_s_per_page``, for the
    iteration's new tokens. Synchronous (vAttention's ``_sync`` backends): before the iteration
    runs, so it adds up. ``overlapped`` (its default ``step_async``): a background thread maps the
    next iteration's pages ahead while this one computes, and a new request mostly takes over an
    idle span's pages (deferred reclamation), so the mapping costs only what exceeds the
    iteration. (vAttention's own code maps a prefill's missing pages synchronously, a path its
    comments expect "not to get triggered frequently" with those optimizations.)
    """

    tokens_per_page: int
    pages_per_group: int
    latency_s_per_page: float
    overlapped: bool

    def mapping_s(self, num_tokens: int) -> float:
        """Seconds of mapping the pages ``num_tokens`` new tokens need, on average."""
        return num_tokens / self.tokens_per_page * self.pages_per_group * self.latency_s_per_page

    def with_mapping_s(self, body_s: float, num_tokens: int) -> float:
        """An iteration of ``body_s`` seconds that writes ``num_tokens`` new tokens, its pages
        mapped."""
        mapping_s = self.mapping_s(num_tokens)
        return max(body_s, mapping_s) if self.overlapped else body_s + mapping_s


@dataclass(frozen=True)
class RooflineCostModel:
    """Prices an iteration and a swap from a Deployment and efficiency factors (a ``CostModel``)."""

    deployment: Deployment
    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    pcie_efficiency: float = 0.8
    iteration_overhead_s: float = 0.002
    allreduce_latency_s: float = 1.0e-5
    attention_time_s: AttentionTimer | None = None
    # vAttention's page mapping (None: an allocator that maps nothing at run time).
    page_mapping: PageMapping | None = None

    @cached_property
    def terms(self) -> RooflineTerms:
        """The formula's constants for this deployment and these factors."""
        deployment = self.deployment
        model = deployment.model
        hardware = deployment.hardware
        num_gpus = deployment.num_gpus
        allreduce_s = 0.0
        if num_gpus > 1:  # two all-reduces per layer when sharded
            allreduce_s = 2 * model.num_layers * self.allreduce_latency_s
        return RooflineTerms(
            active_parameters=model.active_parameters,
            weight_bytes=model.weight_bytes,
            kv_bytes_per_token=deployment.kv_bytes_per_token,
            attention_flops_per_pair=ATTENTION_FLOPS_PER_PAIR
            * model.num_layers
            * model.num_attention_heads
            * model.head_dim,
            fixed_s=self.iteration_overhead_s + allreduce_s,
            flops_per_s=num_gpus * hardware.peak_tflops * 1e12 * self.compute_efficiency,
            bytes_per_s=num_gpus * hardware.hbm_bandwidth_gb_per_s * 1e9
            * self.bandwidth_efficiency,
            window_tokens=model.sliding_window if model.is_hybrid else None,
            sliding_layer_fraction=sum(window is not None for window in model.layer_windows)
            / model.num_layers,
        )

    def iteration_time_s(self, shape: IterationShape) -> float:
        """Seconds one iteration of this shape takes."""
        num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
        if num_tokens == 0:
            return 0.0
        if self.page_mapping is not None:
            body_s = self._body_time_s(shape, num_tokens)
            return self.page_mapping.with_mapping_s(body_s, num_tokens)
        return self._body_time_s(shape, num_tokens)

    def _body_time_s(self, shape: IterationShape, num_tokens: int) -> float:
        """The iteration's compute and memory traffic (what ``iteration_time_s`` prices without
        page mapping)."""
        if self.attention_time_s is not None:
            # Measured kernels replace decode attention (its FLOPs and KV reads); prefill
            # attention stays in the roofline.
            time_fn = self.terms.time_fn(num_tokens, shape.num_decode_tokens)
            body_s = time_fn(0, shape.prefill_attention_pairs)
            return body_s + self.attention_time_s(shape)
        time_s = self.terms.time_fn(num_tokens, shape.num_decode_tokens)
        window_tokens = self.terms.window_tokens
        if window_tokens is not None and shape.prefill_spans:
            window_pairs = windowed_prefill_pairs(shape.prefill_spans, window_tokens)
            return time_s(shape.decode_context_tokens, shape.prefill_attention_pairs, window_pairs)
        return time_s(shape.decode_context_tokens, shape.prefill_attention_pairs)

    def decode_time_fn(self, num_decode_tokens: int) -> DecodeTimeFn:
        """``iteration_time_s`` of a decode-only iteration of ``num_decode_tokens`` sequences, as
        a function of their summed context (identical floats: the same formula)."""
        if self.attention_time_s is not None:
            return decode_time_by_shape(self, num_decode_tokens)
        body_time_s = self.terms.time_fn(num_decode_tokens)
        mapping = self.page_mapping
        if mapping is None:
            return body_time_s

        def time_s(decode_context_tokens: int) -> float:
            return mapping.with_mapping_s(body_time_s(decode_context_tokens), num_decode_tokens)

        return time_s

    def wake_time_s(self, idle_s: float) -> float:
        """0.0: peak figures say nothing of a device waking from an idle wait."""
        return 0.0

    def swap_time_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens of KV over PCIe (one direction, all GPUs)."""
        link_bytes_per_s = (
            self.deployment.num_gpus
            * self.deployment.hardware.pcie_gb_per_s
            * 1e9
            * self.pcie_efficiency
        )
        return num_tokens * self.deployment.kv_bytes_per_token / link_bytes_per_s
