"""Every case's samples decoded together through the real executor's batched forward.

The cases' prompts are prefilled in one forward over one allocator's pools (``paged_prefix``
finds the shared system prompt cached from the first prompt's blocks, written in the same layer
pass before any attention reads them); each case's samples then fork from its sequence and all
sequences decode one token per forward, in lockstep, through ``executors.forward.BatchRunner``
(the paged kernel, or SDPA on gathered K/V: the real executor's ``gather`` mode; the
experiment's ``gather`` backend runs in ``padded.py`` instead, where its check can be
bit-identity). Copy-on-writes the allocator records are copied before the forward that writes
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvbench.allocators import make_allocator
from kvbench.allocators.base import Allocator
from kvbench.executors.forward import BatchRunner, SeqInput, model_kv_shape
from kvbench.executors.kv_memory import KVMemory
from kvbench.tasks.equivalence.cases import PromptCase, Trajectory, choose_token
from kvbench.tasks.equivalence.trajectories import (
    SampleKey,
    as_trajectories,
    blocks_needed,
    fed_token,
    record_step,
    scramble_free_blocks,
)


def batched_trajectories(
    model: Any,
    allocator_name: str,
    backend: str,
    cases: Sequence[PromptCase],
    num_decode_steps: int,
    block_size: int,
    seed: int,
    reference: dict[SampleKey, Trajectory] | None = None,
    kv_dtype: torch.dtype | None = None,
    calibrate_scales: bool = False,
) -> dict[SampleKey, Trajectory]:
    """Each case's samples, all decoded in batched forwards; ``backend`` is ``torch`` or
    ``sdpa`` (the paged kernel's backends) or ``gather``. Free blocks are scrambled first
    (``seed``) so tables scatter.
    ``reference``: teacher forcing, as ``trajectories.paged_trajectories``. ``kv_dtype``,
    ``calibrate_scales``: the pools' storage (``KVMemory``)."""
    num_blocks = blocks_needed(cases, num_decode_steps, block_size, all_at_once=True)
    allocator = make_allocator(allocator_name, num_blocks * block_size, block_size,
                               model.config.max_position_embeddings)  # fmt: skip
    scramble_free_blocks(allocator, seed)
    num_layers, num_kv_heads, head_dim = model_kv_shape(model)
    memory = KVMemory(num_layers, num_kv_heads, head_dim, allocator.num_slots, block_size,
                      model.dtype, kv_dtype=kv_dtype,
                      calibrate_scales=calibrate_scales)  # fmt: skip
    if backend == "gather":
        runner = BatchRunner(model, memory, "gather")
    else:
        runner = BatchRunner(model, memory, "paged", backend)
    prompt_logits = runner.forward([
        _prefill_input(allocator, case, num_decode_steps) for case in cases
    ])  # [num_cases, vocab]  # fmt: skip
    # tokens: each sequence's context (prompt, then what it was fed); chosen: its own choices.
    keys, seq_ids, logits, tokens, chosen = [], [], [], [], []
    for case, case_logits in zip(cases, prompt_logits, strict=True):
        for sample in range(case.num_samples):
            if sample:
                allocator.fork(case.seq_id(0), case.seq_id(sample))
            keys.append((case.prompt_id, sample))
            seq_ids.append(case.seq_id(sample))
            logits.append([case_logits])  # per sequence, each [vocab]
            chosen.append([choose_token(case_logits, sample)])
            tokens.append(list(case.token_ids))
    for step in range(num_decode_steps):
        for key, sequence, own in zip(keys, tokens, chosen, strict=True):
            sequence.append(fed_token(reference, key, step, own))
        for seq_id in seq_ids:
            if not allocator.append(seq_id, 1):
                raise RuntimeError(f"pool too small: cannot grow sequence {seq_id}")
        memory.copy(allocator.take_copy_on_writes())
        step_logits = runner.forward([
            SeqInput([sequence[-1]], len(sequence) - 1, allocator.block_table(seq_id))
            for seq_id, sequence in zip(seq_ids, tokens, strict=True)
        ])  # [num_seqs, vocab]  # fmt: skip
        record_step(step_logits, logits, chosen)
    return as_trajectories(keys, logits, chosen)


def _prefill_input(allocator: Allocator, case: PromptCase, num_decode_steps: int) -> SeqInput:
    """Admit the case's first sequence; its uncached prompt tokens (at least the last one)."""
    seq_id = case.seq_id(0)
    num_tokens = len(case.token_ids)
    if not allocator.admit(seq_id, case.request(num_decode_steps), num_tokens):
        raise RuntimeError(f"pool too small: cannot admit prompt {case.prompt_id}")
    prefix_cache = allocator.prefix_cache
    num_cached = prefix_cache.cached_prefix_tokens(seq_id) if prefix_cache is not None else 0
    first = min(num_cached, num_tokens - 1)
    return SeqInput(case.token_ids[first:], first, allocator.block_table(seq_id),
                    num_unwritten=num_cached - first)  # fmt: skip
