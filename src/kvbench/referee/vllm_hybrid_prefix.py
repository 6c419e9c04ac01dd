"""vLLM's own hybrid KV-cache manager driven without a model: ``paged_hybrid_prefix``'s hits, and
``paged_hybrid``'s freeing when a sequence is grown one slot ahead.

``vllm_hybrid_hit_tokens`` builds vLLM's ``KVCacheManager`` over KV-cache groups of the given
windows (a ``SlidingWindowSpec`` per sliding group, a ``FullAttentionSpec`` per full one, as
``kv_cache_utils`` builds them for a hybrid model), so it runs vLLM's
``HybridKVCacheCoordinator``, with its serving default of sparse retention, and replays
operations on it: an admission looks the prompt up (``get_computed_blocks``, its shared-prefix
junction pinned on the request as the scheduler does) and allocates the rest of it, a decode
appends tokens one at a time (the sliding groups free the blocks behind their windows), a free
ends the request. It returns
the tokens each admission found cached, which a test compares with kvbench's on the same
operations. Prompt token ids come from ``token_ids``, so vLLM's block hashes mean what kvbench's
prefix identities mean.

``vllm_slot_ahead_tables`` drives the same manager the way kvbench's vLLM-v0 engine grows a
sequence, one slot ahead of what is computed (the slot of the token a step samples, as vLLM
allocates a lookahead slot): it returns which block-table entries of each group are live after
each step, for ``paged_hybrid`` with ``generated_slot_ahead`` to be compared with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.core.request import Request
from kvbench.referee.token_ids import own_token_id, prompt_token_ids
from kvbench.referee.vllm_v1 import _import_vllm, build_kv_cache_config

# One operation: ("admit", request index), ("decode", request index, tokens), ("free", index).
Operation = tuple[Any, ...]


def vllm_hybrid_hit_tokens(
    windows: Sequence[int | None],
    block_size: int,
    num_blocks: int,
    requests: Sequence[Request],
    operations: Sequence[Operation],
) -> list[int]:
    """Tokens each ``admit`` of ``operations`` found cached in vLLM's hybrid manager, in order.

    ``windows``: each group's sliding window (None: full attention); ``num_blocks``: the pool
    kvbench sees (vLLM's adds its null block). An admission allocates its whole prompt, a decode
    one token per step (``allocate_slots`` as vLLM's scheduler calls it); RuntimeError if vLLM
    finds no room (the operations are meant to fit).
    """
    vllm = _import_vllm()
    max_model_len = max(r.prompt_tokens + r.output_tokens for r in requests) + block_size
    manager = _manager(vllm, windows, block_size, num_blocks, max_model_len, enable_caching=True)
    hasher = vllm.get_request_block_hasher(block_size, vllm.sha256)
    live: dict[int, Any] = {}
    hits = []
    for operation in operations:
        kind, index = operation[0], operation[1]
        if kind == "admit":
            request = requests[index]
            vllm_request = vllm.Request(
                request_id=str(index),
                prompt_token_ids=prompt_token_ids(request, index),
                sampling_params=vllm.SamplingParams(ignore_eos=True, max_tokens=1 << 20),
                pooling_params=None,
                arrival_time=float(index),
                block_hasher=hasher,
            )
            # The scheduler pins the junction on the request, as vLLM's does at admission.
            blocks, num_hit_tokens, vllm_request.shared_prefix_boundary = (
                manager.get_computed_blocks(vllm_request)
            )
            num_new_tokens = request.prompt_tokens - num_hit_tokens
            _allocate(manager, vllm_request, num_new_tokens, num_hit_tokens, blocks)
            vllm_request.num_computed_tokens = request.prompt_tokens
            live[index] = vllm_request
            hits.append(num_hit_tokens)
        elif kind == "decode":
            vllm_request = live[index]
            for _ in range(operation[2]):
                vllm_request.append_output_token_ids(own_token_id(index))
                _allocate(manager, vllm_request, 1)
                vllm_request.num_computed_tokens += 1
        elif kind == "free":
            manager.free(live.pop(index))
        else:
            raise ValueError(f"unknown operation {operation!r}")
    return hits


def vllm_slot_ahead_tables(
    windows: Sequence[int | None], block_size: int, prompt_tokens: int, num_steps: int
) -> list[tuple[tuple[bool, ...], ...]]:
    """Per step of one request in vLLM's hybrid manager grown one slot ahead, each group's
    block-table entries, True where live (False: freed behind the window, vLLM's null block).

    The admission allocates the prompt and a lookahead slot for the token its prefill samples;
    each decode step computes that token and allocates a lookahead slot for the next
    (``allocate_slots(..., num_lookahead_tokens=1)``): vLLM frees behind the windows after the
    tokens computed before the step. The first entry is after the admission.
    """
    vllm = _import_vllm()
    max_model_len = prompt_tokens + num_steps + 2 * block_size
    num_blocks = len(windows) * (-(-max_model_len // block_size))  # room for every block
    manager = _manager(vllm, windows, block_size, num_blocks, max_model_len, enable_caching=False)
    vllm_request = vllm.Request(
        request_id="0", prompt_token_ids=prompt_token_ids(Request(0, 0.0, prompt_tokens, 1), 0),
        sampling_params=vllm.SamplingParams(ignore_eos=True, max_tokens=1 << 20),
        pooling_params=None, arrival_time=0.0,
    )  # fmt: skip
    null_block_id = manager.block_pool.null_block.block_id
    tables = []
    for step in range(num_steps + 1):
        if step:
            vllm_request.append_output_token_ids(own_token_id(0))
        num_new_tokens = 1 if step else prompt_tokens
        if manager.allocate_slots(vllm_request, num_new_tokens, num_lookahead_tokens=1) is None:
            raise RuntimeError("vLLM found no room: the pool is sized for every block")
        vllm_request.num_computed_tokens += num_new_tokens
        tables.append(tuple(tuple(block_id != null_block_id for block_id in group_ids)
                            for group_ids in manager.get_block_ids("0")))  # fmt: skip
    return tables


def _manager(
    vllm: Any, windows: Sequence[int | None], block_size: int, num_blocks: int,
    max_model_len: int, *, enable_caching: bool,
) -> Any:  # fmt: skip
    """vLLM's ``KVCacheManager`` over one KV-cache group per window (None: full attention),
    with ``num_blocks`` blocks besides its null block."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    config = build_kv_cache_config(vllm, windows, block_size, num_blocks + 1)
    return KVCacheManager(
        config, max_model_len, scheduler_block_size=block_size, hash_block_size=block_size,
        enable_caching=enable_caching,
    )  # fmt: skip


def _allocate(manager: Any, vllm_request: Any, num_new_tokens: int, *computed: Any) -> None:
    if manager.allocate_slots(vllm_request, num_new_tokens, *computed) is None:
        raise RuntimeError(f"vLLM found no room for request {vllm_request.request_id}")
