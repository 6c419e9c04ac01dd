"""The KV pool in blocks, as vLLM v1 counts it: ``num_gpu_blocks`` and its two startup figures.

vLLM sizes its pool as ``available KV memory // bytes per block`` (per GPU, with each GPU's share
of the KV heads), or takes ``num_gpu_blocks_override`` as given; either count includes block 0,
which its block pool keeps as the null block and never hands out. At startup it logs two figures
from that count: "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per request:
X" (``vllm.v1.core.kv_cache_utils.get_kv_cache_capacity``). The functions here reproduce both from
a ``Deployment``; tests/test_capacity_parity.py checks them against vLLM's own code. A model whose
layers differ in attention (sliding windows) gets vLLM's hybrid pool: ``hybrid_num_gpu_blocks``,
``hybrid_pool`` (what ``paged_hybrid`` is given), ``hybrid_startup_figures``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.kv_groups import KvGroupLayout, kv_group_layout
from kvbench.core.specs import Deployment

# vLLM's block pool reserves one block (block 0) as the null block: it never holds tokens.
NUM_NULL_BLOCKS = 1


def num_gpu_blocks(deployment: Deployment, block_size: int, override: int | None = None) -> int:
    """Blocks in vLLM's pool for this deployment, the null block included.

    ``override`` is vLLM's ``num_gpu_blocks_override`` (kvbench's ``allocator.num_gpu_blocks``):
    when given it is the count. Otherwise the count comes from the KV memory, exactly as vLLM
    divides it: whole blocks of ``block_size`` tokens.
    """
    if override is not None:
        return override
    return deployment.num_kv_blocks(block_size)


def pool_slots(deployment: Deployment, block_size: int, override: int | None) -> int:
    """Token slots kvbench's allocators get.

    Without an override, every slot the KV memory holds (the paper's engine, vLLM v0, has no null
    block). With ``override`` = N blocks, vLLM v1's meaning: N - 1 blocks hold tokens.
    """
    if override is None:
        return deployment.num_kv_slots
    return (override - NUM_NULL_BLOCKS) * block_size


@dataclass(frozen=True)
class VllmStartupFigures:
    """What vLLM v1 logs about its KV cache at startup.

    Attributes:
        kv_cache_size_tokens: "GPU KV cache size: N tokens" (concurrency x max model length).
        max_concurrency: "Maximum concurrency for L tokens per request: X" (pool blocks over the
            blocks one max-length request takes).
        max_model_len: L, the request length the concurrency is for, in tokens.
    """

    kv_cache_size_tokens: int
    max_concurrency: float
    max_model_len: int

    def log_line(self) -> str:
        """The figures as vLLM prints them."""
        return (
            f"GPU KV cache size: {self.kv_cache_size_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )


def vllm_startup_figures(
    num_blocks: int, block_size: int, max_model_len: int
) -> VllmStartupFigures:
    """vLLM's two startup figures for a pool of ``num_blocks`` blocks (null block included).

    A max-length request takes ceil(max_model_len / block_size) blocks; vLLM divides the pool's
    whole count, the null block included, by that, and multiplies back by the length.
    """
    blocks_per_request = -(-max_model_len // block_size)
    max_concurrency = num_blocks / blocks_per_request
    return VllmStartupFigures(
        kv_cache_size_tokens=int(max_concurrency * max_model_len),
        max_concurrency=max_concurrency,
        max_model_len=max_model_len,
    )


def deployment_startup_figures(
    deployment: Deployment, block_size: int, override: int | None = None
) -> VllmStartupFigures:
    """The figures vLLM would log serving ``deployment`` with ``block_size``-token blocks."""
    return vllm_startup_figures(
        num_gpu_blocks(deployment, block_size, override),
        block_size,
        deployment.model.max_model_len,
    )


@dataclass(frozen=True)
class HybridPool:
    """The block pool of vLLM v1's hybrid KV-cache manager (``paged_hybrid``) for a deployment.

    Attributes:
        layout: the model's KV-cache groups (``kv_groups.kv_group_layout``).
        num_blocks: blocks the allocator hands out: vLLM's count from the KV memory
            (``hybrid_num_gpu_blocks``), or ``num_gpu_blocks`` - 1 with an override (its null
            block).
        num_slots: the pool in token slots of the whole model (``Deployment.num_kv_slots``,
            rounded up where the blocks hold a fraction of a slot more), the unit every
            allocator's breakdown adds up to.
    """

    layout: KvGroupLayout
    num_blocks: int
    num_slots: int


def hybrid_num_gpu_blocks(
    deployment: Deployment, block_size: int, override: int | None = None
) -> int:
    """Blocks in vLLM's pool for a model of several KV-cache groups, the null block included.

    One block holds ``block_size`` tokens of ``group_size`` layers, on each GPU its share of the
    KV heads; vLLM divides each GPU's whole bytes of KV memory by that
    (``get_kv_cache_config_from_groups``). For a model of one attention type this is
    ``num_gpu_blocks``.
    """
    if override is not None:
        return override
    model = deployment.model
    layout = kv_group_layout(model.layer_windows)
    layer_token_bytes_per_gpu = deployment.kv_bytes_per_token // (
        deployment.num_gpus * model.num_layers
    )
    block_bytes_per_gpu = layout.group_size * block_size * layer_token_bytes_per_gpu
    per_gpu_bytes = int(deployment.kv_cache_bytes // deployment.num_gpus)
    return max(0, per_gpu_bytes // block_bytes_per_gpu)


def hybrid_pool(deployment: Deployment, block_size: int, override: int | None) -> HybridPool:
    """The pool ``paged_hybrid`` gets: every block of vLLM's count without an override (as
    ``pool_slots`` gives the paged allocators every slot), ``override`` - 1 with one."""
    model = deployment.model
    layout = kv_group_layout(model.layer_windows)
    num_blocks = hybrid_num_gpu_blocks(deployment, block_size, override)
    if override is not None:
        num_blocks -= NUM_NULL_BLOCKS
    block_layer_slots = num_blocks * block_size * layout.group_size
    blocks_slots = -(-block_layer_slots // model.num_layers)
    num_slots = blocks_slots if override is not None else deployment.num_kv_slots
    return HybridPool(layout, num_blocks, max(num_slots, blocks_slots))


def hybrid_startup_figures(
    deployment: Deployment, block_size: int, max_num_batched_tokens: int,
    override: int | None = None,
) -> VllmStartupFigures:  # fmt: skip
    """vLLM's two startup figures for a hybrid model's pool
    (``get_max_concurrency_for_kv_cache_config``).

    A max-length request takes, in every group, the blocks its spec may hold at once: a full
    group ``ceil(max_model_len / block_size)``; a sliding group the window less one token plus
    the tokens in flight (``max_num_batched_tokens``), at most ``max_model_len``, in blocks, plus
    one (a window need not start at a block's first slot). The pool's blocks over their sum.
    """
    model = deployment.model
    max_model_len = model.max_model_len
    layout = kv_group_layout(model.layer_windows)
    blocks_per_request = 0
    for group in layout.groups:
        held_tokens = max_model_len
        extra_blocks = 0
        if group.window_tokens is not None:
            held_tokens = min(group.window_tokens - 1 + max_num_batched_tokens, max_model_len)
            extra_blocks = 1
        blocks_per_request += -(-held_tokens // block_size) + extra_blocks
    max_concurrency = hybrid_num_gpu_blocks(deployment, block_size, override) / blocks_per_request
    return VllmStartupFigures(
        kv_cache_size_tokens=int(max_concurrency * max_model_len),
        max_concurrency=max_concurrency,
        max_model_len=max_model_len,
    )
