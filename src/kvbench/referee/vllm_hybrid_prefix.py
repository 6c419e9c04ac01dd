"""vLLM's own hybrid KV-cache manager driven without a model, for ``paged_hybrid_prefix``'s hits.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.core.request import Request
from kvbench.referee.token_ids import own_token_id, prompt_token_ids
from kvbench.referee.vllm_v1 import _import_vllm, group_spec

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
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [
        KVCacheGroupSpec([f"layers.{group}"], group_spec(vllm, window, block_size))
        for group, window in enumerate(windows)
    ]
    # Retention 0: vLLM 0.32's default (CacheConfig.prefix_cache_retention_interval), which
    # KVCacheConfig's own default (None: every block, dense) is not.
    config = KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[], kv_cache_groups=groups,
                           prefix_cache_retention_interval=0)  # fmt: skip
    max_model_len = max(r.prompt_tokens + r.output_tokens for r in requests) + block_size
    manager = KVCacheManager(
        config, max_model_len, scheduler_block_size=block_size, hash_block_size=block_size,
        enable_caching=True,
    )  # fmt: skip
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


def _allocate(manager: Any, vllm_request: Any, num_new_tokens: int, *computed: Any) -> None:
    if manager.allocate_slots(vllm_request, num_new_tokens, *computed) is None:
        raise RuntimeError(f"vLLM found no room for request {vllm_request.request_id}")
