"""The K/V memory an allocator manages, made real: one key and one value pool per layer.

Every allocator hands out slots of one pool: the paged ones in blocks of ``block_size`` slots
(their block tables list block ids), the contiguous ones one slot at a time (``block_size`` 1:
their "block table" is the slot range of the sequence's extent at its buddy offset). Both
become the same tensor layout, vLLM's ``[num_blocks, block_size, num_kv_heads, head_dim]`` per
layer: for a contiguous allocator that is one arena of ``num_slots`` rows whose offsets are the
allocator's, so a reservation really is a span of this memory. The pools are written once at
start-up (zero-filled), so every page is resident from the first iteration, as a GPU engine's
preallocated pool is.

The pools live on the model's device. Preempted-by-swap sequences are copied out to host tensors
(``swap_out``) and back into the new blocks the allocator gives them (``swap_in``): across PCIe
from a GPU; on a CPU both sides are RAM, the copy is real.

The pools hold the model's dtype, or fp8 (e4m3) K/V under per-layer scales (``kv_dtype``,
``calibrate_scales``): written divided by the scale, read back times it, as vLLM's
``kv_cache_dtype=fp8``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.kernels import copy_blocks, fp8_as_bytes, fp8_dequantized, write_kv


class KVMemory:
    """Per-layer K/V pools of one allocator, and the swap space of its preempted sequences.

    Args:
        num_layers, num_kv_heads, head_dim: the model's K/V shape.
        num_slots: the allocator's pool in token slots.
        block_size: slots per block-table entry (the allocator's; 1 for contiguous ones).
        dtype: the model's dtype: K/V come in and go out in it.
        device: where the pools live (the model's device); swap space is host memory.
        kv_dtype: the storage dtype (None: ``dtype``). ``torch.float8_e4m3fn``: K/V divided by
            their layer's scale and rounded to fp8 on write, saturating at +-448, as vLLM's
            ``kv_cache_dtype=fp8``; read back times the scale (the paged kernels take the scales).
        calibrate_scales: fp8 scales of each layer from its first write (vLLM's
            ``calculate_kv_scales``: ``calibrated_scales``), fixed from then on; False: 1.0.
        cache_backend: the K/V write and block copy kernels' backend (``kvbench.kernels``);
            None: ``triton`` on a GPU, ``torch`` elsewhere.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_slots: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        kv_dtype: torch.dtype | None = None,
        calibrate_scales: bool = False,
        cache_backend: str | None = None,
    ) -> None:
        num_blocks = num_slots // block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        storage = kv_dtype or dtype
        # zeros, not empty: the kernels multiply masked rows by probability 0, and 0 * NaN is NaN;
        # and writing every page now makes the pool resident, as a GPU's preallocated pool is.
        self.keys = [torch.zeros(shape, dtype=storage, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=storage, device=device) for _ in range(num_layers)]
        self.dtype = dtype
        # Per layer (k_scale, v_scale): a stored element e means e x scale (1 unless fp8).
        self.scales = [(1.0, 1.0)] * num_layers
        self._uncalibrated = set(range(num_layers)) if calibrate_scales else set()
        self.device = torch.device(device)
        # On a GPU, Triton's cache kernels: torch's index a boolean mask and read a mapping back
        # to the host, a device sync per layer that stops the host queueing work ahead.
        self.cache_backend = cache_backend or ("triton" if self.device.type == "cuda" else "torch")
        self.block_size = block_size
        self._swap_space: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_slots(self) -> int:
        """Token slots of each layer's pool (whole blocks)."""
        return self.keys[0].shape[0] * self.block_size

    @property
    def pool_bytes(self) -> int:
        """Bytes of every layer's key and value pool."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @property
    def swapped_bytes(self) -> int:
        """Bytes held in swap space now."""
        return sum(k.numel() * k.element_size() * 2 for k, _ in self._swap_space.values())

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Store new tokens' K/V of one layer.

        Args:
            key, value: [num_tokens, num_kv_heads, head_dim].
            slots: int64 [num_tokens] on the pools' device, pool slots; -1 leaves a token
                unwritten (its K/V are in a shared prefix block already).
        """
        if layer in self._uncalibrated:
            self._uncalibrated.discard(layer)
            self.scales[layer] = calibrated_scales(key, value)
        k_scale, v_scale = self.scales[layer]
        storage = self.keys[layer].dtype
        write_kv(stored(key, k_scale, storage), stored(value, v_scale, storage), self.keys[layer],
                 self.values[layer], slots, self.cache_backend)  # fmt: skip

    def fill_noise(self, seed: int = 0) -> None:
        """Fill every slot of every layer with standard-normal K/V (stored as ``write`` stores
        them), one draw for ``seed`` copied into every pool. For timing: what reading K/V costs
        may depend on their bits (torch's fp8 cast took 0.59 ns an element on zeros and 1.32 ns
        on normal values on this project's AMD EPYC), so a pool of zeros need not time what real
        K/V cost. One draw, not one per pool: a draw per pool took 18 s of a CPU profile's 2 min."""
        generator = torch.Generator(self.device).manual_seed(seed)
        noise = torch.randn(self.keys[0].shape, generator=generator, device=self.device,
                            dtype=self.dtype)  # a pool's shape  # fmt: skip
        by_scale: dict[float, torch.Tensor] = {}  # scale -> the draw as a pool stores it
        for layer, pools in enumerate(zip(self.keys, self.values, strict=True)):
            for pool, scale in zip(pools, self.scales[layer], strict=True):
                if scale not in by_scale:
                    by_scale[scale] = stored(noise, scale, pool.dtype)
                pool.copy_(by_scale[scale])

    def gather(
        self, layer: int, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's K/V of one layer, copied out in the model's layout.

        Args:
            slots: int64 [num_tokens] on the pools' device, the pool slots of its tokens in order.
        Returns:
            key, value: [1, num_kv_heads, num_tokens, head_dim], contiguous.
        """
        key, value = self._loaded(layer, slots)  # each [num_tokens, num_kv_heads, head_dim]
        # [num_tokens, heads, dim] -> [1, heads, num_tokens, dim], SDPA's layout.
        return (key.transpose(0, 1).unsqueeze(0).contiguous(),
                value.transpose(0, 1).unsqueeze(0).contiguous())  # fmt: skip

    def gather_padded(
        self, layer: int, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Several sequences' K/V of one layer, copied out as one padded batch.

        Args:
            slots: int64 [num_seqs, width], each row's pool slots in order; -1: a pad position.
        Returns:
            key, value: [num_seqs, num_kv_heads, width, head_dim], contiguous, zero at pads.
        """
        key, value = self._loaded(layer, slots.clamp(min=0).flatten())  # [seqs * width, heads, dim]
        is_pad = (slots < 0).flatten()[:, None, None]  # [seqs * width, 1, 1]
        shape = (*slots.shape, *key.shape[1:])  # [seqs, width, heads, dim]
        return tuple(
            rows.masked_fill(is_pad, 0).view(shape).transpose(1, 2).contiguous()
            for rows in (key, value)
        )  # type: ignore[return-value]

    def copy(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Perform an allocator's copy-on-writes, (src, dst) block pairs, in every layer."""
        if not pairs:
            return
        for key_cache, value_cache in zip(self.keys, self.values, strict=True):
            copy_blocks(key_cache, value_cache, list(pairs), backend=self.cache_backend)

    def swap_out(self, seq_id: int, slots: torch.Tensor) -> None:
        """Copy a preempted sequence's K/V (its tokens' ``slots``, int64 [num_tokens]) out of
        the pools into swap space (host memory), before anything overwrites the blocks it held."""
        slots = slots.to(self.device)
        rows = [self._rows(layer, slots) for layer in range(len(self.keys))]
        # [num_layers, num_tokens, num_kv_heads, head_dim] each; .to: the host copy (none on a CPU)
        self._swap_space[seq_id] = (torch.stack([k for k, _ in rows]).to("cpu"),
                                 torch.stack([v for _, v in rows]).to("cpu"))  # fmt: skip

    def swap_in(self, seq_id: int, slots: torch.Tensor) -> None:
        """Copy a swapped-out sequence's K/V back into the pools at its new ``slots``
        (int64 [num_tokens]) and drop its swap space."""
        keys, values = self._swap_space.pop(seq_id)
        keys, values, slots = keys.to(self.device), values.to(self.device), slots.to(self.device)
        for layer in range(len(self.keys)):  # as stored: no second scaling
            write_kv(keys[layer], values[layer], self.keys[layer], self.values[layer], slots,
                     self.cache_backend)  # fmt: skip

    def drop_swapped(self, seq_id: int) -> None:
        """Forget a sequence's swap space (it will be recomputed instead), if it has one."""
        self._swap_space.pop(seq_id, None)

    def _loaded(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``_rows`` in the model's dtype: fp8 K/V times their layer's scales."""
        key, value = self._rows(layer, slots)
        k_scale, v_scale = self.scales[layer]
        return dequantized(key, k_scale, self.dtype), dequantized(value, v_scale, self.dtype)

    def _rows(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value rows [num_tokens, num_kv_heads, head_dim] of ``slots``, copied."""
        rows_shape = (-1, *self.keys[layer].shape[2:])  # [num_slots, num_kv_heads, head_dim]
        # fp8 selected as bytes: the same rows, with no need for a device's index_select to
        # know fp8.
        key, value = (fp8_as_bytes(pool).view(rows_shape).index_select(0, slots).view(pool.dtype)
                      for pool in (self.keys[layer], self.values[layer]))  # fmt: skip
        return key, value


# ``model.kv_dtype`` / ``equivalence.kv_dtype`` names a pool stores in a dtype of its own (other
# names, and None, store the model's dtype).
KV_STORAGE_DTYPES = {"fp8": torch.float8_e4m3fn}


def kv_storage_dtype(name: str | None) -> torch.dtype | None:
    """The pools' storage dtype a ``kv_dtype`` setting names (None: the model's dtype)."""
    return KV_STORAGE_DTYPES.get(name or "")


# vLLM's divisors of the first forward's amax (K_SCALE_CONSTANT, V_SCALE_CONSTANT in vllm/envs.py):
# the calibration tokens' largest |K| lands at 200 and |V| at 100 of e4m3's 448, headroom for
# later tokens larger than the first forward's.
CALIBRATION_DIVISORS = (200.0, 100.0)


def calibrated_scales(key: torch.Tensor, value: torch.Tensor) -> tuple[float, float]:
    """vLLM's ``calculate_kv_scales`` of one layer from the K/V of its first forward
    (any shape): ``(amax|K| / 200, amax|V| / 100)``; a scale of an all-zero tensor stays 1."""
    k_amax, v_amax = float(key.abs().amax()), float(value.abs().amax())
    k_divisor, v_divisor = CALIBRATION_DIVISORS
    return (k_amax / k_divisor or 1.0, v_amax / v_divisor or 1.0)


def stored(tokens: torch.Tensor, scale: float, storage: torch.dtype) -> torch.Tensor:
    """Tokens' K or V as a pool of ``storage`` dtype holds them: unchanged in a float pool; in an
    fp8 pool divided by ``scale`` and saturated to the format's largest finite value, as vLLM's
    conversion saturates (explicit here rather than left to how a torch version casts
    out-of-range values: e4m3fn has no infinity)."""
    if storage.itemsize != 1:
        return tokens.to(storage)
    largest = torch.finfo(storage).max
    return (tokens.float() / scale).clamp(-largest, largest).to(storage)


def dequantized(rows: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Pool K or V (any shape) in ``dtype``: fp8 times ``scale`` (``fp8_dequantized``), a float
    pool's unchanged (its scale is 1; the bit-identity checks rely on it)."""
    return fp8_dequantized(rows, scale, dtype) if rows.element_size() == 1 else rows.to(dtype)
