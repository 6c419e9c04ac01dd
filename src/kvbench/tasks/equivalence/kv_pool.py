"""Per-layer K/V block pools: the memory a paged KV cache lives in (vLLM's layout)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.kernels import copy_blocks, write_kv


class KVPool:
    """One key pool and one value pool per layer, each
    [num_blocks, block_size, num_kv_heads, head_dim], addressed by physical block ids."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        """``dtype`` is the pool's storage dtype: the model's, or ``torch.float8_e4m3fn`` (K/V
        rounded to fp8 with scale 1 on write, vLLM's uncalibrated ``kv_cache_dtype=fp8``)."""
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zero-filled, not NaN-filled: the kernels read the unused rows of a sequence's last block
        # and mask their scores, but multiply them by probability 0, and 0 * NaN is NaN.
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.block_size = block_size

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Store new tokens' K/V of one layer.

        Args:
            key, value: [1, num_kv_heads, num_tokens, head_dim], the model's layout.
            slots: int64 [num_tokens], pool slots; -1 leaves a token unwritten.
        """
        storage = self.keys[layer].dtype  # fp8 pools round on write
        # [num_tokens, num_kv_heads, head_dim]
        token_key = key[0].transpose(0, 1).contiguous().to(storage)
        token_value = value[0].transpose(0, 1).contiguous().to(storage)
        write_kv(token_key, token_value, self.keys[layer], self.values[layer], slots, "torch")

    def gather(
        self, layer: int, block_table: torch.Tensor, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's K/V of one layer, copied out contiguously in the model's layout.

        Args:
            block_table: int32 [num_blocks_of_seq], physical blocks in logical order.
            num_tokens: tokens of the sequence to return.
        Returns:
            key, value: [1, num_kv_heads, num_tokens, head_dim], contiguous.
        """
        blocks = block_table.long()  # [num_blocks_of_seq]
        return (
            _gathered(self.keys[layer], blocks, num_tokens),
            _gathered(self.values[layer], blocks, num_tokens),
        )

    def copy(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Perform an allocator's copy-on-writes, (src, dst) block pairs, in every layer."""
        if not pairs:
            return
        for key_cache, value_cache in zip(self.keys, self.values, strict=True):
            copy_blocks(key_cache, value_cache, list(pairs), backend="torch")


def _gathered(cache: torch.Tensor, blocks: torch.Tensor, num_tokens: int) -> torch.Tensor:
    rows = cache[blocks].flatten(0, 1)[:num_tokens]  # [num_tokens, num_kv_heads, head_dim]
    # The stock cache holds [1, heads, tokens, dim] contiguously; the same strides keep SDPA on
    # the same code path, which the bit-identity check relies on.
    return rows.transpose(0, 1).unsqueeze(0).contiguous()  # [1, num_kv_heads, num_tokens, dim]
