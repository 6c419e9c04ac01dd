"""How much prefix caching a workload allows, from its requests alone (no allocator, no engine).

``ideal_prefix_reuse`` is the hit rate of an unbounded prefix cache that sees every request in
arrival order and never evicts: a request reuses its leading full blocks of ``block_size`` tokens
whose content, and everything before it, was a full block of an earlier request. It is the ceiling
``paged_prefix`` (automatic prefix caching) can reach on the same requests and block size.

``lru_reuse_distances`` explains the gap to a bounded cache: for every reusable block, how many
distinct other tokens were touched since that block was last touched (the LRU stack distance,
Mattson et al. 1970). An LRU cache holding C tokens keeps a block until C other tokens have been
touched after it, so the share of distances below C is the hit rate an LRU cache of that size can
reach at best.

Block contents come from what a request says about its tokens, as in
``kvbench.allocators.prefix_hashes`` (this is an independent implementation, exact rather than
hashed): the trace's ``prefix_block_hashes`` (each names ``hash_block_tokens`` prompt tokens,
Mooncake's ``hash_ids``) or an explicit ``prefix_group`` sharing ``prefix_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.core.request import Request

_TRACE_TAG = 1
_GROUP_TAG = 2


@dataclass(frozen=True)
class PrefixReuse:
    """Prompt tokens and blocks of a workload, and how many of them an ideal cache reuses."""

    hit_tokens: int
    prompt_tokens: int
    hit_blocks: int
    prompt_blocks: int  # blocks the prompts occupy, a partial last block included

    @property
    def token_hit_rate(self) -> float:
        """Reused prompt tokens / prompt tokens (``prefix_hit_rate``'s ceiling)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else float("nan")

    @property
    def block_hit_rate(self) -> float:
        """Reused prompt blocks / prompt blocks (``prefix_block_hit_rate``'s ceiling)."""
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else float("nan")


def has_prefix_identity(requests: Iterable[Request]) -> bool:
    """Whether any request says which of its prompt tokens it shares (hashes or a group)."""
    return any(r.prefix_block_hashes or r.prefix_group is not None for r in requests)


def block_contents(request: Request, block_size: int) -> list[tuple[int, ...]]:
    """What each of the request's leading full blocks holds, as far as its tokens are known.

    For trace hashes, a block lists (hash, first offset in the hash block, tokens) for every hash
    block it overlaps, so blocks smaller or larger than the trace's, or straddling two of its
    blocks, are named exactly. Equal contents at equal positions after equal prefixes are equal
    tokens.
    """
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    if request.prefix_block_hashes:
        unit = request.hash_block_tokens
        if unit < 1:
            raise ValueError(
                f"request {request.request_id} has prefix_block_hashes but "
                f"hash_block_tokens={unit}"
            )
        hashes = request.prefix_block_hashes
        known = min(request.prompt_tokens, len(hashes) * unit)
        contents = []
        for first in range(0, known - block_size + 1, block_size):
            end = first + block_size
            content = [_TRACE_TAG]
            for index in range(first // unit, (end - 1) // unit + 1):
                start = max(first, index * unit)
                stop = min(end, (index + 1) * unit)
                content += [hashes[index], start - index * unit, stop - start]
            contents.append(tuple(content))
        return contents
    if request.prefix_group is not None:
        known = min(request.prefix_tokens, request.prompt_tokens)
        return [(_GROUP_TAG, request.prefix_group, i) for i in range(known // block_size)]
    return []


def _prefix_paths(requests: Sequence[Request], block_size: int) -> list[list[int]]:
    """Each request's leading full blocks as nodes of one prefix trie (equal node = equal
    tokens from the prompt's start to that block's end), in arrival order."""
    node_of: dict[tuple[int, tuple[int, ...]], int] = {}
    paths = []
    for request in requests:
        parent = -1
        path = []
        for content in block_contents(request, block_size):
            parent = node_of.setdefault((parent, content), len(node_of))
            path.append(parent)
        paths.append(path)
    return paths


def _in_arrival_order(requests: Iterable[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: (r.arrival_s, r.request_id))


def ideal_prefix_reuse(requests: Iterable[Request], block_size: int) -> PrefixReuse:
    """Hits of an unbounded, never-evicting prefix cache of ``block_size``-token blocks.

    Requests are taken in arrival order; a request hits its leading blocks up to the first one
    no earlier request held as a full block (prefix caching reuses a prefix, never a block after
    a miss).
    """
    ordered = _in_arrival_order(requests)
    seen: set[int] = set()
    hit_blocks = 0
    for path in _prefix_paths(ordered, block_size):
        for node in path:
            if node not in seen:
                break
            hit_blocks += 1
        seen.update(path)
    prompt_tokens = sum(r.prompt_tokens for r in ordered)
    prompt_blocks = sum(-(-r.prompt_tokens // block_size) for r in ordered)
    return PrefixReuse(hit_blocks * block_size, prompt_tokens, hit_blocks, prompt_blocks)


def lru_reuse_distances(requests: Iterable[Request], block_size: int) -> np.ndarray:
    """For every block an unbounded cache reuses, the distinct other tokens touched since it was
    last touched (LRU stack distance, in tokens), in arrival order.

    A request touches all its leading known blocks, in order, when it arrives; its other tokens
    (unknown content, never reusable) are not counted, so the distances are lower bounds of what
    a real cache, which also holds those tokens, sees.
    """
    ordered = _in_arrival_order(requests)
    paths = _prefix_paths(ordered, block_size)
    num_accesses = sum(len(path) for path in paths)
    tree = [0] * (num_accesses + 1)  # Fenwick tree over access times

    def add(position: int, delta: int) -> None:
        position += 1
        while position <= num_accesses:
            tree[position] += delta
            position += position & -position

    def prefix_sum(position: int) -> int:  # live blocks last touched at times < position
        total = 0
        while position > 0:
            total += tree[position]
            position -= position & -position
        return total

    last_touch: dict[int, int] = {}
    distances = []
    now = 0
    live = 0
    for path in paths:
        reusing = True
        for node in path:
            previous = last_touch.get(node)
            if previous is None:
                reusing = False
            else:
                if reusing:
                    distances.append(live - prefix_sum(previous + 1))
                add(previous, -1)
                live -= 1
            last_touch[node] = now
            add(now, 1)
            live += 1
            now += 1
    return np.asarray(distances, dtype=np.int64) * block_size
