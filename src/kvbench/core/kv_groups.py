"""vLLM v1's KV-cache groups: how a model whose layers differ in attention shares one block pool.

vLLM's hybrid KV-cache manager (``_get_kv_cache_groups_uniform_page_size`` in
``vllm.v1.core.kv_cache_utils``) buckets the layers by attention type (full; sliding window
of a given size), then splits every bucket into groups of the same number of layers,
``group_size``: the fewest layers of any type (the "1" of a 5:1 pattern), or the most when
no type has 1.5 times as many as another. A bucket that does not divide evenly gets padding
layers ("Add N padding layers, may waste at most X % KV cache memory"); bucket ``b`` splits
into ``ceil(len(b) / group_size)`` groups, group ``i`` taking layers ``i, i + num_groups, ...``
of the bucket.

Every group's block holds ``block_size`` tokens of ``group_size`` layers, so every block has one
size whatever group holds it: the pool is one list of block ids any group draws from, and vLLM
sizes it as KV memory // (``group_size`` x one layer's page). A model of one attention type is
one group of all its layers (plain paging).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# vLLM sizes groups by the largest bucket when no bucket has this many times the layers of the
# smallest (gpt-oss with a draft model: 12 sliding + 13 full become 13 + 13, not 12 + 24).
_LARGEST_BUCKET_RATIO = 1.5


@dataclass(frozen=True)
class KvCacheGroup:
    """Layers that share one block table.

    Attributes:
        window_tokens: tokens each layer attends to, None for the whole context (full
            attention); a sliding group frees the blocks that fall out of its window.
        num_layers: the model's layers in the group; the group's other ``group_size - num_layers``
            layers are vLLM's padding (memory held, no K/V in it).
    """

    window_tokens: int | None
    num_layers: int


@dataclass(frozen=True)
class KvGroupLayout:
    """The groups vLLM builds for one model.

    Attributes:
        groups: in vLLM's order (attention types in the order their first layer appears).
        group_size: layers per group, padding included: one block holds ``block_size`` tokens of
            this many layers.
        num_model_layers: the model's attention layers.
    """

    groups: tuple[KvCacheGroup, ...]
    group_size: int
    num_model_layers: int

    @property
    def num_padding_layers(self) -> int:
        """Layers of padding over all groups."""
        return self.group_size * len(self.groups) - self.num_model_layers

    @property
    def is_uniform(self) -> bool:
        """One group of full attention: plain paging."""
        return len(self.groups) == 1 and self.groups[0].window_tokens is None


def padding_waste_pct(layer_windows: Sequence[int | None]) -> dict[int | None, float]:
    """vLLM's warning per attention type with padding: padding layers / the type's layers x 100
    ("may waste at most X % KV cache memory"), keyed by window (None: full attention)."""
    buckets = _buckets(layer_windows)
    group_size = _group_size(buckets)
    waste = {}
    for window, num_layers in buckets.items():
        num_padding = -num_layers % group_size
        if num_padding:
            waste[window] = num_padding / num_layers * 100
    return waste


def kv_group_layout(layer_windows: Sequence[int | None]) -> KvGroupLayout:
    """vLLM's groups for a model whose layer ``i`` attends to ``layer_windows[i]`` tokens
    (None: full attention). ValueError for a model without layers."""
    buckets = _buckets(layer_windows)
    group_size = _group_size(buckets)
    groups: list[KvCacheGroup] = []
    for window, num_layers in buckets.items():
        num_groups = -(-num_layers // group_size)
        # Group i takes the bucket's layers i, i + num_groups, ...: the first groups get the
        # extra layer when the bucket does not divide evenly.
        groups.extend(
            KvCacheGroup(window, len(range(index, num_layers, num_groups)))
            for index in range(num_groups)
        )
    return KvGroupLayout(tuple(groups), group_size, len(layer_windows))


def _buckets(layer_windows: Sequence[int | None]) -> dict[int | None, int]:
    """Layers per attention type, in the order each type first appears."""
    if not layer_windows:
        raise ValueError("a model needs at least one attention layer")
    buckets: dict[int | None, int] = {}
    for window in layer_windows:
        buckets[window] = buckets.get(window, 0) + 1
    return buckets


def _group_size(buckets: dict[int | None, int]) -> int:
    fewest = min(buckets.values())
    most = max(buckets.values())
    return most if most < fewest * _LARGEST_BUCKET_RATIO else fewest
