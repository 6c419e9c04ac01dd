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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.kernels import copy_blocks, write_kv


class KVMemory:
    """Per-layer K/V pools of one allocator, and the swap space of its preempted sequences.

    Args:
        num_layers, num_kv_heads, head_dim: the model's K/V shape.
        num_slots: the allocator's pool in token slots.
        block_size: slots per block-table entry (the allocator's; 1 for contiguous ones).
        dtype: the storage dtype (the model's).
        device: where the pools live (the model's device); swap space is host memory.
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
    ) -> None:
        num_blocks = num_slots // block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # zeros, not empty: the kernels multiply masked rows by probability 0, and 0 * NaN is NaN;
        # and writing every page now makes the pool resident, as a GPU's preallocated pool is.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.device = torch.device(device)
        # On a GPU, Triton's cache kernels: torch's index a boolean mask and read a mapping back
        # to the host, a device sync per layer that stops the host queueing work ahead.
        self._cache_backend = "triton" if self.device.type == "cuda" else "torch"
        self.block_size = block_size
        self._swap_space: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

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
        write_kv(key, value, self.keys[layer], self.values[layer], slots, self._cache_backend)

    def gather(
        self, layer: int, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's K/V of one layer, copied out in the model's layout.

        Args:
            slots: int64 [num_tokens] on the pools' device, the pool slots of its tokens in order.
        Returns:
            key, value: [1, num_kv_heads, num_tokens, head_dim], contiguous.
        """
        key, value = self._rows(layer, slots)  # each [num_tokens, num_kv_heads, head_dim]
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
        key, value = self._rows(layer, slots.clamp(min=0).flatten())  # [seqs * width, heads, dim]
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
            copy_blocks(key_cache, value_cache, list(pairs), backend=self._cache_backend)

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
        for layer in range(len(self.keys)):
            self.write(layer, keys[layer], values[layer], slots)

    def drop_swapped(self, seq_id: int) -> None:
        """Forget a sequence's swap space (it will be recomputed instead), if it has one."""
        self._swap_space.pop(seq_id, None)

    def _rows(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value rows [num_tokens, num_kv_heads, head_dim] of ``slots``, copied."""
        rows_shape = (-1, *self.keys[layer].shape[2:])  # [num_slots, num_kv_heads, head_dim]
        return (self.keys[layer].view(rows_shape).index_select(0, slots),
                self.values[layer].view(rows_shape).index_select(0, slots))  # fmt: skip
