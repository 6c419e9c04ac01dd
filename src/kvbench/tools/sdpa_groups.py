"""``python -m kvbench.tools.sdpa_groups``: the ``sdpa`` decode backend's groups, planned by
length against groups in batch order, timed per layer on SmolLM2's heads.

Not a test: it prints figures measured in one run on this machine (docs/kernels.md). Each case
is one decode step of one layer (9 query heads, 3 KV heads of 64, fp32, 16-token blocks
scattered over a pool), the median of ``--repeats`` calls; the two plans alternate, case by
case, so that the machine's drift hits both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from kvbench.kernels import decode_torch, paged_decode_attention
from kvbench.tools import count_at_least

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
# name -> each sequence's context (tokens), in batch order.
CASES = {
    "13 x 40 and 1 x 320": (40,) * 6 + (320,) + (40,) * 7,
    "32 of 10-246, shuffled": tuple(10 + 236 * ((7 * i) % 32) // 31 for i in range(32)),
    "32 of 10-246, ascending": tuple(10 + 236 * i // 31 for i in range(32)),
    "14 x 60": (60,) * 14,
    "14 of 5-115": tuple(5 + 110 * i // 13 for i in range(14)),
    "14 x 240": (240,) * 14,
    "14 of 20-460": tuple(20 + 440 * i // 13 for i in range(14)),
}


def batch_order_groups(
    context_lens: tuple[int, ...], token_bytes: int, group_bytes: int, call_bytes: int
) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The plan before ``length_groups``: runs of the batch in its order, as many sequences a
    group as fit ``group_bytes`` at the batch's longest context (``call_bytes`` unused)."""
    group_size = max(1, group_bytes // (token_bytes * max(context_lens)))
    starts = range(0, len(context_lens), group_size)
    return tuple((tuple(range(start, min(start + group_size, len(context_lens)))),
                  max(context_lens[start : start + group_size])) for start in starts)  # fmt: skip


@contextlib.contextmanager
def _planned_by(planner: Any) -> Iterator[None]:
    """``sdpa_decode`` planning its groups with ``planner`` inside the block."""
    planned_by_length = decode_torch.length_groups
    decode_torch.length_groups = planner
    try:
        yield
    finally:
        decode_torch.length_groups = planned_by_length


def time_case(context_lens: tuple[int, ...], repeats: int, seed: int = 0) -> float:
    """Median seconds of one layer's decode attention over ``context_lens``, on a pool of
    random K/V whose blocks are shuffled."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // BLOCK_SIZE) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 1
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(shape, generator=generator)  # [blocks, block_size, kv_heads, dim]
    value_cache = torch.randn(shape, generator=generator)
    pool = torch.randperm(num_blocks, generator=generator)
    tables = torch.zeros(len(context_lens), max(blocks_per_seq), dtype=torch.int32)  # [seqs, B]
    start = 0
    for row, count in enumerate(blocks_per_seq):
        tables[row, :count] = pool[start : start + count]
        start += count
    lens = torch.tensor(context_lens, dtype=torch.int32)  # [seqs]
    query = torch.randn(len(context_lens), NUM_Q_HEADS, HEAD_DIM, generator=generator)
    durations = []
    for index in range(repeats + 5):  # the first 5 warm up
        started_s = time.perf_counter()
        paged_decode_attention(query, key_cache, value_cache, tables, lens, backend="sdpa",
                               max_context_len=max(context_lens))  # fmt: skip
        if index >= 5:
            durations.append(time.perf_counter() - started_s)
    return statistics.median(durations)


def main(argv: list[str] | None = None) -> int:
    """Print each case's time per layer under both plans."""
    parser = argparse.ArgumentParser(prog="python -m kvbench.tools.sdpa_groups",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=count_at_least(1), default=300)
    parser.add_argument("--threads", type=count_at_least(1), default=2, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| sequences x context (sum, longest) | batch order ms | by length ms |")
    print("|---|---|---|")
    for name, lens in CASES.items():
        with _planned_by(batch_order_groups):
            batch_order_s = time_case(lens, args.repeats)
        by_length_s = time_case(lens, args.repeats)
        print(f"| {name} ({sum(lens):,}, {max(lens)}) | {batch_order_s * 1e3:.2f} | "
              f"{by_length_s * 1e3:.2f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
