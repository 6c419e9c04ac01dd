"""An independent peer: transformers' own continuous batching (``generate_batch``, whose K/V
live in its ``PagedAttentionCache``), for greedy tokens to hold kvbench's paged path against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import GenerationConfig

# Spare blocks beyond what the prompts and their new tokens fill, so the peer never preempts.
SPARE_BLOCKS = 8


def continuous_batching_tokens(
    model: Any, prompts: Sequence[Sequence[int]], num_new_tokens: int, block_size: int
) -> list[list[int]]:
    """Greedy tokens ``generate_batch`` produces for each prompt, in prompt order.

    End-of-sequence is ignored (``eos_token_id=-1``) so every prompt gets ``num_new_tokens``, as
    in kvbench's trajectories.
    """
    num_blocks = SPARE_BLOCKS + sum(
        -(-(len(prompt) + num_new_tokens) // block_size) for prompt in prompts
    )
    max_batch_tokens = max(len(prompt) for prompt in prompts) + len(prompts)
    config = GenerationConfig(max_new_tokens=num_new_tokens, do_sample=False, eos_token_id=-1,
                              pad_token_id=0)  # fmt: skip
    try:  # transformers >= 5 sizes the cache from a ContinuousBatchingConfig...
        from transformers import ContinuousBatchingConfig
    except ImportError:  # ...earlier ones from the generation config
        config.update(block_size=block_size, num_blocks=num_blocks,
                      max_batch_tokens=max_batch_tokens)  # fmt: skip
        outputs = model.generate_batch(inputs=[list(prompt) for prompt in prompts],
                                       generation_config=config)  # fmt: skip
    else:
        # Unsized, it takes 90 % of the free memory: on a CPU, of the machine's RAM (12 GB here,
        # which two test workers at once ran out of).
        batching = ContinuousBatchingConfig(page_size=block_size, num_blocks=num_blocks,
                                            max_batch_tokens=max_batch_tokens)  # fmt: skip
        outputs = model.generate_batch(inputs=[list(prompt) for prompt in prompts],
                                       generation_config=config,
                                       continuous_batching_config=batching)  # fmt: skip
    # Requests are named req_0, req_1, ... in the order of ``inputs``.
    return [list(outputs[f"req_{index}"].generated_tokens) for index in range(len(prompts))]
