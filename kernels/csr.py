"""FlashInfer-style CSR page table: the same block tables, ragged instead of padded.

FlashInfer's paged kernels take ``kv_indptr`` [num_seqs + 1], ``kv_indices`` [total pages] and
``kv_last_page_len`` [num_seqs]: sequence ``i``'s pages are
``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`` and its last page holds ``kv_last_page_len[i]``
tokens (1..page_size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .layout import to_paged_layout


@dataclass(frozen=True)
class CsrPageTable:
    """A batch's pages in compressed-sparse-row form (all int32).

    Attributes:
        kv_indptr: [num_seqs + 1], offsets into ``kv_indices``; starts at 0.
        kv_indices: [total pages], physical page ids, sequence after sequence.
        kv_last_page_len: [num_seqs], tokens in each sequence's last page.
        page_size: tokens per page (the block size).
    """

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    page_size: int

    def context_lens(self) -> torch.Tensor:
        """Tokens per sequence, int32 [num_seqs]: ``(pages - 1) * page_size + last_page_len``."""
        num_pages = self.kv_indptr[1:] - self.kv_indptr[:-1]  # [num_seqs]
        return ((num_pages - 1) * self.page_size + self.kv_last_page_len).to(torch.int32)


def to_csr_page_table(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> CsrPageTable:
    """The CSR page table of per-sequence block tables (only the pages each context uses)."""
    layout = to_paged_layout(block_tables, context_lens, block_size)  # validates
    lengths = layout.context_lens.long()  # [num_seqs]
    num_pages = (lengths + block_size - 1) // block_size  # [num_seqs]
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.long)  # [num_seqs + 1]
    indptr[1:] = torch.cumsum(num_pages, 0)
    columns = torch.arange(layout.block_tables.shape[1])  # [max_blocks_per_seq]
    used = columns[None, :] < num_pages[:, None]  # [num_seqs, max_blocks_per_seq]
    return CsrPageTable(
        kv_indptr=indptr.to(torch.int32).to(device),
        kv_indices=layout.block_tables[used].to(device),  # row-major: sequence by sequence
        kv_last_page_len=((lengths - 1) % block_size + 1).to(torch.int32).to(device),
        page_size=block_size,
    )
