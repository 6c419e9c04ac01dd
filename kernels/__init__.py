"""Attention kernels (Triton, with torch references), imported as ``kvbench.kernels``.

The folder sits at the repository top level but is installed as a sub-package of kvbench: a
top-level module named ``kernels`` would shadow the Hugging Face package of that name, which
transformers probes for.

Importing this package never imports triton: the Triton kernels load on first use of a
``backend="triton"`` call, so a test can still set ``TRITON_INTERPRET=1`` after ``import
kvbench.kernels``. Modules here import each other relatively and nothing from the rest of kvbench,
so ``kernels/gpu_check.py`` can load the folder standalone on a machine without hydra.
"""

from .bench_batch import (
    DecodeBatch,
    compact_block_ids,
    materialize_batch,
    scattered_block_tables,
    virtual_spans,
)
from .block_copy import copy_blocks
from .csr import CsrPageTable, to_csr_page_table
from .deal import block_stream, deal_block_tables
from .decode_attention import (
    BACKENDS,
    DECODE_BACKENDS,
    FP8_KV_DTYPE,
    contiguous_decode_attention,
    fp8_as_bytes,
    paged_decode_attention,
    triton_fp8_problem,
)
from .decode_torch import fp8_dequantized
from .kv_write import write_kv
from .layout import PagedLayout, layout_from_allocator, slot_mapping, to_paged_layout
from .reference import reference_contiguous_decode, reference_paged_decode
from .tiling import TILE_TOKENS, SplitPlan, plan_splits
from .timing import PairTiming, batch_calls, device_copy_gb_per_s, time_pair

__all__ = [
    "BACKENDS",
    "DECODE_BACKENDS",
    "FP8_KV_DTYPE",
    "TILE_TOKENS",
    "CsrPageTable",
    "DecodeBatch",
    "PagedLayout",
    "PairTiming",
    "SplitPlan",
    "batch_calls",
    "block_stream",
    "compact_block_ids",
    "contiguous_decode_attention",
    "copy_blocks",
    "deal_block_tables",
    "device_copy_gb_per_s",
    "fp8_as_bytes",
    "fp8_dequantized",
    "layout_from_allocator",
    "materialize_batch",
    "paged_decode_attention",
    "plan_splits",
    "reference_contiguous_decode",
    "reference_paged_decode",
    "scattered_block_tables",
    "slot_mapping",
    "time_pair",
    "to_csr_page_table",
    "to_paged_layout",
    "triton_fp8_problem",
    "virtual_spans",
    "write_kv",
]
