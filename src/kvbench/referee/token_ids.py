"""Token ids for a kvbench request, so that vLLM's block hashes see kvbench's prefix identity.

kvbench knows a prompt's tokens only through its prefix identity (``prefix_group`` and
``prefix_tokens``, or a trace's ``prefix_block_hashes`` of ``hash_block_tokens`` tokens each). The
referee needs concrete ids: a known token gets an id derived from what names it (the group and
its position, or the trace hash and the offset in its hash block), so two requests agree on a
token exactly when kvbench's identities say they do; every other token, and every token the
request generates, is the request's own id, which no other request uses. Equal vLLM block hashes
then mean what kvbench's ``allocators.prefix_hashes`` means by equal block identities.
"""

from __future__ import annotations

from kvbench.core.request import Request

# Known-prefix ids live below SHARED_ID_LIMIT; a request's own id is OWN_ID_BASE + its index, so
# the two ranges never meet. All ids stay below 2**31 (vLLM keeps token ids in int32 arrays).
SHARED_ID_LIMIT = 2**30
OWN_ID_BASE = 2**30
_TRACE_HASH_TAG = 1
_PREFIX_GROUP_TAG = 2


def own_token_id(request_index: int) -> int:
    """The id of every token that belongs to request ``request_index`` alone (prompt or output)."""
    if not 0 <= request_index < SHARED_ID_LIMIT:
        raise ValueError(f"request index {request_index} is outside [0, {SHARED_ID_LIMIT})")
    return OWN_ID_BASE + request_index


def prompt_token_ids(request: Request, request_index: int) -> list[int]:
    """The ``request.prompt_tokens`` ids of the prompt of the ``request_index``-th request."""
    shared = _known_prefix_ids(request)
    own = own_token_id(request_index)
    return shared + [own] * (request.prompt_tokens - len(shared))


def _known_prefix_ids(request: Request) -> list[int]:
    """Ids of the leading prompt tokens the request's prefix identity names (a hash per token)."""
    if request.prefix_block_hashes:
        if request.hash_block_tokens < 1:
            raise ValueError(
                f"request {request.request_id} has prefix_block_hashes but "
                f"hash_block_tokens={request.hash_block_tokens}"
            )
        known_tokens = min(
            request.prompt_tokens, len(request.prefix_block_hashes) * request.hash_block_tokens
        )
        return [
            _shared_id(
                _TRACE_HASH_TAG,
                request.prefix_block_hashes[position // request.hash_block_tokens],
                position % request.hash_block_tokens,
            )
            for position in range(known_tokens)
        ]
    if request.prefix_group is not None:
        known_tokens = min(request.prefix_tokens, request.prompt_tokens)
        return [
            _shared_id(_PREFIX_GROUP_TAG, request.prefix_group, position)
            for position in range(known_tokens)
        ]
    return []


def _shared_id(tag: int, key: int, offset: int) -> int:
    # Python's hash of a tuple of ints does not depend on PYTHONHASHSEED: ids are deterministic.
    return hash((tag, key, offset)) % SHARED_ID_LIMIT
