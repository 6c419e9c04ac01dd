"""The KV pool in blocks, as vLLM v1 counts it: ``num_gpu_blocks`` and its two startup figures.

vLLM sizes its pool as ``available KV memory // bytes per block`` (per GPU, with each GPU's share
of the KV heads), or takes ``num_gpu_blocks_override`` as given; either count includes block 0,
which its block pool keeps as the null block and never hands out. At startup it logs two figures
from that count: "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per request:
X" (``vllm.v1.core.kv_cache_utils.get_kv_cache_capacity``). The functions here reproduce both from
a ``Deployment``; tests/test_capacity_parity.py checks them against vLLM's own code.
"""

from __future__ import annotations

from dataclasses import dataclass

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
