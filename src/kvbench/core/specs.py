"""Model and GPU specifications: the only place where kvbench turns token slots into bytes.

The catalog values live in ``conf/model/*.yaml`` and ``conf/hardware/*.yaml`` (see
``kvbench.core.catalog``); these frozen dataclasses are their schema and hold the formulas. They
are pure: no defaults of their own and no file read, not even at import (the engine imports this
module). The deployment defaults live in ``conf/deployment/default.yaml`` alone;
``kvbench.core.catalog.get_deployment`` fills them, as the Hydra app does.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# A layer's attention: every token of the context ("full"), or the last ``sliding_window``.
ATTENTION_TYPES = ("full", "sliding")
# KV-cache storage dtypes a model may be served with (``model.kv_dtype``): 16-bit, or fp8 (e4m3,
# vLLM's ``kv_cache_dtype=fp8``: 1 byte per element, dequantized by the attention kernel on load).
KV_DTYPES = ("fp16", "bf16", "fp8")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as its KV cache and cost are concerned.

    Attributes:
        name: catalog name, e.g. ``llama-2-70b``.
        hf_id: the Hugging Face model id the figures come from.
        num_layers: transformer layers.
        num_attention_heads: query heads.
        num_kv_heads: key/value heads (< query heads for GQA, 1 for MQA).
        head_dim: dimension of one head.
        hidden_size: model width (FLOPs of the attention projections).
        num_parameters: total parameters (weights held in GPU memory).
        num_active_parameters: parameters used per token (differs for mixture-of-experts);
            None means all of them.
        max_model_len: the longest sequence (prompt + output) the model serves, in tokens.
        dtype: storage dtype of the weights (fp16, bf16, fp32, fp8), and of the KV cache unless
            ``kv_dtype`` says otherwise.
        kv_dtype: storage dtype of the KV cache (``KV_DTYPES``), or None for ``dtype``.
        attention_pattern: the layers' attention types (``ATTENTION_TYPES``) from layer 0 on,
            repeated over the layers: ``("full",)`` for a model of full attention only,
            ``("sliding", "full")`` for Gemma-2's alternation.
        sliding_window: tokens a sliding-window layer attends to (the token itself included,
            as Hugging Face's ``sliding_window``), or None when no layer slides.
    """

    name: str
    hf_id: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_parameters: float
    max_model_len: int
    dtype: str
    num_active_parameters: float | None
    attention_pattern: tuple[str, ...]
    sliding_window: int | None
    kv_dtype: str | None

    def __post_init__(self) -> None:
        problem = self._attention_problem()
        if problem:
            raise ValueError(f"model={self.name}: {problem}")

    def _attention_problem(self) -> str | None:
        """What is wrong with the attention pattern and window, with the fix (None: nothing)."""
        unknown = [kind for kind in self.attention_pattern if kind not in ATTENTION_TYPES]
        if not self.attention_pattern or unknown:
            return (f"model.attention_pattern={list(self.attention_pattern)}: give a non-empty "
                    f"list of {' / '.join(ATTENTION_TYPES)}")  # fmt: skip
        slides = "sliding" in self.attention_pattern
        if slides and (self.sliding_window is None or self.sliding_window < 1):
            return (f"model.sliding_window={self.sliding_window}: a sliding layer needs a "
                    "window of >= 1 token")  # fmt: skip
        if not slides and self.sliding_window is not None:
            return (f"model.sliding_window={self.sliding_window} but no layer slides: set it "
                    "to null or add 'sliding' to model.attention_pattern")  # fmt: skip
        return None

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer, the tokens its attention reads (None: the whole context)."""
        pattern = self.attention_pattern
        return tuple(
            self.sliding_window if pattern[layer % len(pattern)] == "sliding" else None
            for layer in range(self.num_layers)
        )

    @property
    def is_hybrid(self) -> bool:
        """Whether some layer attends to a sliding window (its KV can be freed behind it)."""
        return "sliding" in self.attention_pattern

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the weights' storage dtype."""
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes per K/V element of the KV cache's storage dtype (1 for fp8)."""
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers: 2 x layers x KV heads x head dim x KV dtype
        bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes of the weights in the storage dtype."""
        return self.num_parameters * self.dtype_bytes

    @property
    def active_parameters(self) -> float:
        """Parameters each token passes through (all of them for dense models)."""
        return self.num_active_parameters or self.num_parameters


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU type.

    Attributes:
        name: catalog name, e.g. ``a100-80gb``.
        memory_gib: device memory as the driver reports it, in GiB.
        hbm_bandwidth_gb_per_s: peak memory bandwidth, in GB/s (10^9 bytes/s).
        peak_tflops: peak dense bf16/fp16 tensor-core throughput, in TFLOP/s (no sparsity).
        pcie_gb_per_s: host link bandwidth per direction, in GB/s (swap cost).
    """

    name: str
    memory_gib: float
    hbm_bandwidth_gb_per_s: float
    peak_tflops: float
    pcie_gb_per_s: float

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes."""
        return self.memory_gib * GIB


@dataclass(frozen=True)
class Deployment:
    """A model served on ``num_gpus`` GPUs of one type with tensor parallelism.

    Every setting is required: their defaults live in ``conf/deployment/default.yaml`` alone, so
    that the Python API cannot drift from the Hydra app (it once reserved 0.0 GiB for activations
    where the app reserved 1.0). ``kvbench.core.catalog.get_deployment(m, h, **settings)`` fills
    them from that file and sizes the pool that ``model=m hardware=h hardware.KEY=VALUE`` does.

    Attributes:
        model: the model.
        hardware: the GPU type.
        num_gpus: tensor-parallel degree (GPUs holding one model replica).
        gpu_memory_utilization: fraction of device memory the engine may use (vLLM's 0.9).
        activation_reserve_gib: memory kept per GPU for activations and workspace, in GiB.
        kv_cache_gib: the KV cache size over all GPUs in GiB (vLLM's ``kv_cache_memory``), or None
            for what remains after weights and reserve.
    """

    model: ModelSpec
    hardware: HardwareSpec
    num_gpus: int
    gpu_memory_utilization: float
    activation_reserve_gib: float
    kv_cache_gib: float | None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token over all GPUs.

        With tensor parallelism each GPU holds KV heads / num_gpus heads; when there are fewer KV
        heads than GPUs (GQA on a wide node) each head is replicated, so the node stores
        max(KV heads, num_gpus) heads per token.
        """
        stored_heads = max(self.model.num_kv_heads, self.num_gpus)
        return self.model.kv_bytes_per_token * stored_heads // self.model.num_kv_heads

    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads each GPU stores (at least one: heads are replicated when GPUs outnumber
        them)."""
        return max(self.model.num_kv_heads, self.num_gpus) // self.num_gpus

    def tokens_per_page(self, page_bytes: int) -> int:
        """Tokens one physical page of ``page_bytes`` holds in one layer's K (or V) tensor on one
        GPU: ``page_bytes / (KV heads per GPU x head dim x KV dtype bytes)`` (vAttention's pages;
        0 when a page is smaller than one token's slice)."""
        model = self.model
        token_bytes = self.kv_heads_per_gpu * model.head_dim * model.kv_dtype_bytes
        return page_bytes // token_bytes

    @property
    def usable_bytes(self) -> float:
        """Memory the engine may use over all GPUs, before weights."""
        per_gpu_bytes = self.hardware.memory_bytes * self.gpu_memory_utilization
        return self.num_gpus * (per_gpu_bytes - self.activation_reserve_gib * GIB)

    @property
    def kv_cache_bytes(self) -> float:
        """Bytes of KV cache over all GPUs (may be negative when the weights do not fit)."""
        if self.kv_cache_gib is not None:
            return self.kv_cache_gib * GIB
        return self.usable_bytes - self.model.weight_bytes

    @property
    def num_kv_slots(self) -> int:
        """KV cache capacity in tokens."""
        return max(0, int(self.kv_cache_bytes // self.kv_bytes_per_token))

    def num_kv_blocks(self, block_size: int) -> int:
        """KV cache capacity in whole blocks of ``block_size`` tokens."""
        return self.num_kv_slots // block_size

    def slots_to_bytes(self, num_slots: float) -> float:
        """Bytes held by ``num_slots`` token slots."""
        return num_slots * self.kv_bytes_per_token

    def slots_in_gib(self, gib: float) -> int:
        """Whole token slots ``gib`` GiB of memory hold (a CPU tier's, over all GPUs)."""
        return int(gib * GIB // self.kv_bytes_per_token)

    def check_fits(self) -> None:
        """Raise ValueError (one line, with the fix) when the model cannot be served here."""
        weight_gib = self.model.weight_bytes / GIB
        usable_gib = self.usable_bytes / GIB
        if self.kv_cache_gib is not None:
            if self.kv_cache_gib <= 0:
                raise ValueError(
                    f"hardware.kv_cache_gib={self.kv_cache_gib}: must be > 0 (or null to use "
                    "what the weights leave)"
                )
            if weight_gib + self.kv_cache_gib > usable_gib:
                raise ValueError(
                    f"model={self.model.name} ({weight_gib:.1f} GiB of weights) plus "
                    f"hardware.kv_cache_gib={self.kv_cache_gib} exceed the "
                    f"{usable_gib:.1f} GiB usable on {self.num_gpus}x {self.hardware.name}: "
                    "lower kv_cache_gib or raise hardware.num_gpus"
                )
        if self.num_kv_slots < self.model.max_model_len:
            needed_gpus = self._gpus_needed()
            raise ValueError(
                f"model={self.model.name} does not fit hardware={self.hardware.name} with "
                f"num_gpus={self.num_gpus}: {weight_gib:.1f} GiB of weights leave room for "
                f"{self.num_kv_slots} KV tokens of {usable_gib:.1f} GiB usable, fewer than one "
                f"{self.model.max_model_len}-token sequence; use hardware.num_gpus={needed_gpus} "
                "or a larger GPU"
            )

    def _gpus_needed(self) -> int:
        """Smallest power-of-two GPU count that fits one max-length sequence (for the error)."""
        num_gpus = max(1, self.num_gpus)
        while num_gpus < 1024:
            num_gpus *= 2
            trial = Deployment(
                self.model,
                self.hardware,
                num_gpus,
                self.gpu_memory_utilization,
                self.activation_reserve_gib,
                kv_cache_gib=None,  # how many GPUs the weights need, whatever KV size was asked
            )
            if trial.num_kv_slots >= self.model.max_model_len:
                return num_gpus
        return num_gpus
