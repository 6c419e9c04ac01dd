"""vAttention's kernel side: the contiguous kernel over per-request spans of ``max_model_len``
tokens (virtual-contiguous) reads the same K/V as over dense extents, bit for bit."""

from __future__ import annotations

import pytest
import torch
from kvbench.kernels import (
    contiguous_decode_attention,
    materialize_batch,
    scattered_block_tables,
    virtual_spans,
)


@pytest.mark.parametrize("backend", ["torch", "sdpa", "triton"])
def test_the_contiguous_kernel_over_spans_gives_the_dense_extents_output(backend: str) -> None:
    context_lens = [5, 17, 9]
    generator = torch.Generator().manual_seed(0)
    tables = scattered_block_tables(context_lens, 4, generator)
    batch = materialize_batch(tables, context_lens, 4, num_q_heads=4, num_kv_heads=2, head_dim=16,
                              dtype=torch.float16)  # fmt: skip
    key, value = virtual_spans(batch, span_tokens=64)
    # [3, 17, 2, 16], each sequence 64 tokens after the previous: a span, not a dense extent.
    assert key.shape == batch.key.shape and key.stride(0) == 64 * 2 * 16
    assert torch.equal(key, batch.key) and torch.equal(value, batch.value)
    lens = batch.layout.context_lens
    dense = contiguous_decode_attention(batch.query, batch.key, batch.value, lens, backend=backend)
    spans = contiguous_decode_attention(batch.query, key, value, lens, backend=backend)
    assert torch.equal(dense, spans)


def test_a_span_shorter_than_the_batch_is_refused() -> None:
    batch = materialize_batch([[0, 1]], [8], 4, 2, 1, 8, torch.float32)
    with pytest.raises(ValueError, match="span_tokens=4: shorter than the batch's 8 tokens"):
        virtual_spans(batch, 4)
