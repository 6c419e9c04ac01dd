"""Chained identities of prompt blocks, for prefix sharing (vLLM-style block hashes).

kvbench never sees token ids, only what a request says about them: either its trace's
``prefix_block_hashes`` (each names ``hash_block_tokens`` prompt tokens, like Mooncake's
``hash_ids``) or an explicit ``prefix_group`` whose first ``prefix_tokens`` tokens are identical
across the group. A request with hashes uses only its hashes.

A full kvbench block of ``block_size`` tokens gets an identity from the tokens it covers, and a
chained hash ``hash((parent_hash, identity))`` as in vLLM, so equal hashes mean equal prefixes up to
and including that block. The hash is Python's built-in ``hash`` of tuples of ints, which (unlike
``hash`` of str/bytes) does not depend on PYTHONHASHSEED: runs are deterministic. Its 64 bits make
a collision negligible at trace sizes (~1e-8 for a million distinct blocks).
"""

from __future__ import annotations

from collections import OrderedDict

from kvbench.core.request import Request

_ROOT_HASH = 0  # parent hash of a prompt's first block
# Tags keep the two kinds of identity apart even when their numbers happen to coincide.
_TRACE_HASHES_TAG = 1
_PREFIX_GROUP_TAG = 2


def prompt_block_hashes(request: Request, block_size: int) -> tuple[int, ...]:
    """Chained hashes of the request's leading full blocks whose tokens are known.

    Block ``i`` covers tokens ``[i * block_size, (i + 1) * block_size)``; only blocks that lie
    wholly inside the known prefix (and inside the prompt) get a hash.
    """
    hashes = []
    parent_hash = _ROOT_HASH
    for identity in _block_identities(request, block_size):
        parent_hash = hash((parent_hash, identity))
        hashes.append(parent_hash)
    return tuple(hashes)


def _block_identities(request: Request, block_size: int) -> list[tuple[int, ...]]:
    if request.prefix_block_hashes:
        return _trace_hash_identities(request, block_size)
    if request.prefix_group is not None:
        known_tokens = min(request.prefix_tokens, request.prompt_tokens)
        return [
            (_PREFIX_GROUP_TAG, request.prefix_group, block_index)
            for block_index in range(known_tokens // block_size)
        ]
    return []


def _trace_hash_identities(request: Request, block_size: int) -> list[tuple[int, ...]]:
    """Identity of each full block covered by the trace's hash blocks.

    A block's identity lists, for every hash block it overlaps, (hash, first offset in the hash
    block, number of tokens): this handles blocks smaller or larger than the hash blocks and
    blocks that straddle two of them.
    """
    hash_block_tokens = request.hash_block_tokens
    if hash_block_tokens < 1:
        raise ValueError(
            f"request {request.request_id} has prefix_block_hashes but "
            f"hash_block_tokens={hash_block_tokens}"
        )
    trace_hashes = request.prefix_block_hashes
    known_tokens = min(request.prompt_tokens, len(trace_hashes) * hash_block_tokens)
    identities = []
    for block_index in range(known_tokens // block_size):
        first_token = block_index * block_size
        end_token = first_token + block_size
        identity = [_TRACE_HASHES_TAG]
        last_hash_index = (end_token - 1) // hash_block_tokens
        for hash_index in range(first_token // hash_block_tokens, last_hash_index + 1):
            hash_first_token = hash_index * hash_block_tokens
            segment_first = max(first_token, hash_first_token)
            segment_end = min(end_token, hash_first_token + hash_block_tokens)
            identity += [
                trace_hashes[hash_index],
                segment_first - hash_first_token,
                segment_end - segment_first,
            ]
        identities.append(tuple(identity))
    return identities


class RecentPromptHashes:
    """``prompt_block_hashes`` of the most recently asked requests (the lpm policy asks about
    every waiting request every iteration, and can_admit then admit ask about the same one):
    equal requests have equal hashes, so the ``max_requests`` last asked are kept, least recently
    asked dropped first."""

    def __init__(self, block_size: int, max_requests: int = 1024) -> None:
        self.block_size = block_size
        self.max_requests = max_requests
        self._hashes: OrderedDict[Request, tuple[int, ...]] = OrderedDict()

    def of(self, request: Request) -> tuple[int, ...]:
        """The block hashes of ``request``'s prompt."""
        hashes = self._hashes.get(request)
        if hashes is None:
            hashes = prompt_block_hashes(request, self.block_size)
            self._hashes[request] = hashes
            if len(self._hashes) > self.max_requests:
                self._hashes.popitem(last=False)
        else:
            self._hashes.move_to_end(request)
        return hashes
