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
        calibrate_scales: bool = False,
    ) -> None:
        """``dtype`` is the pool's storage dtype: the model's, or ``torch.float8_e4m3fn`` (K/V
        divided by their layer's scale and rounded to fp8 on write, saturating at +-448, as
        vLLM's ``kv_cache_dtype=fp8``). Scales are 1.0 (vLLM without calibration) unless
        ``calibrate_scales``: then each layer's are set by its first write (vLLM's
        ``calculate_kv_scales``: ``CALIBRATION_DIVISORS``) and fixed from then on."""
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zero-filled, not NaN-filled: the kernels read the unused rows of a sequence's last block
        # and mask their scores, but multiply them by probability 0, and 0 * NaN is NaN.
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.block_size = block_size
        # Per layer (k_scale, v_scale): a stored element e means e x scale.
        self.scales = [(1.0, 1.0)] * num_layers
        self._uncalibrated = set(range(num_layers)) if calibrate_scales else set()

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Store new tokens' K/V of one layer.

        Args:
            key, value: [1, num_kv_heads, num_tokens, head_dim], the model's layout.
            slots: int64 [num_tokens], pool slots; -1 leaves a token unwritten.
        """
        if layer in self._uncalibrated:
            self._uncalibrated.discard(layer)
            self.scales[layer] = calibrated_scales(key, value)
        k_scale, v_scale = self.scales[layer]
        storage = self.keys[layer].dtype
        # [num_tokens, num_kv_heads, head_dim]
        token_key = _stored(key[0].transpose(0, 1).contiguous(), k_scale, storage)
        token_value = _stored(value[0].transpose(0, 1).contiguous(), v_scale, storage)
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


# vLLM's divisors of the first forward's amax (K_SCALE_CONSTANT, V_SCALE_CONSTANT in vllm/envs.py):
# the calibration tokens' largest |K| lands at 200 and |V| at 100 of e4m3's 448, headroom for
# later tokens larger than the prompt's.
CALIBRATION_DIVISORS = (200.0, 100.0)


def calibrated_scales(key: torch.Tensor, value: torch.Tensor) -> tuple[float, float]:
    """vLLM's ``calculate_kv_scales`` of one layer from the K/V of its first forward
    (any shape): ``(amax|K| / 200, amax|V| / 100)``; a scale of an all-zero tensor stays 1."""
    k_amax, v_amax = float(key.abs().amax()), float(value.abs().amax())
    k_divisor, v_divisor = CALIBRATION_DIVISORS
    return (k_amax / k_divisor or 1.0, v_amax / v_divisor or 1.0)


def _stored(tokens: torch.Tensor, scale: float, storage: torch.dtype) -> torch.Tensor:
    """Tokens' K or V as the pool stores them: unchanged in a float pool; in an fp8 pool divided
    by ``scale`` and saturated to the format's largest finite value, as vLLM's conversion
    saturates (explicit here rather than left to how a torch version casts out-of-range
    values: e4m3fn has no infinity)."""
    if storage.itemsize != 1:
        return tokens.to(storage)
    largest = torch.finfo(storage).max
    return (tokens.float() / scale).clamp(-largest, largest).to(storage)


def _gathered(cache: torch.Tensor, blocks: torch.Tensor, num_tokens: int) -> torch.Tensor:
    rows = cache[blocks].flatten(0, 1)[:num_tokens]  # [num_tokens, num_kv_heads, head_dim]
    # The stock cache holds [1, heads, tokens, dim] contiguously; the same strides keep SDPA on
    # the same code path, which the bit-identity check relies on.
    return rows.transpose(0, 1).unsqueeze(0).contiguous()  # [1, num_kv_heads, num_tokens, dim]
