"""Decode every case's samples through the stock cache and through a paged pool."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from kvbench.allocators.base import Allocator
from kvbench.core.request import Request
from kvbench.tasks.equivalence.cases import PromptCase, Trajectory, choose_token
from kvbench.tasks.equivalence.paged_runner import PagedRunner
from kvbench.tasks.equivalence.stock_runner import StockRunner

SampleKey = tuple[int, int]  # (prompt_id, sample)


def stock_trajectories(
    runner: StockRunner, cases: Sequence[PromptCase], num_decode_steps: int
) -> dict[SampleKey, Trajectory]:
    """Each sample on its own through transformers' cache (the prompt runs once per sample)."""
    result = {}
    for case in cases:
        for sample in range(case.num_samples):
            logits = [runner.prefill(0, list(case.token_ids))]  # each [vocab]
            tokens = [choose_token(logits[0], sample)]
            for _ in range(num_decode_steps):
                logits.append(runner.decode(0, tokens[-1]))
                tokens.append(choose_token(logits[-1], 0))
            runner.free(0)
            result[(case.prompt_id, sample)] = Trajectory(torch.stack(logits), tokens)
    return result


def paged_trajectories(
    runner: PagedRunner,
    cases: Sequence[PromptCase],
    num_decode_steps: int,
    reference: dict[SampleKey, Trajectory] | None = None,
) -> dict[SampleKey, Trajectory]:
    """Cases one after another through the pool; a case's samples are forks of its first
    sequence and decode in lockstep (their blocks interleave); a case is freed when done.

    With ``reference`` (the stock trajectories) every sample is teacher-forced: it is fed the
    reference's tokens, so each step's logits are compared on the same context, and its own
    choices are only recorded (``Trajectory.tokens``). Without, it feeds its own choices."""
    result: dict[SampleKey, Trajectory] = {}
    for case in cases:
        result.update(_paged_case(runner, case, num_decode_steps, reference))
    return result


def fed_token(
    reference: dict[SampleKey, Trajectory] | None, key: SampleKey, step: int, own: list[int]
) -> int:
    """The token a sample is fed at decode ``step`` (0: the first after the prompt): the
    reference's (teacher forcing), or without a reference its own last choice."""
    return own[-1] if reference is None else reference[key].tokens[step]


def _paged_case(
    runner: PagedRunner,
    case: PromptCase,
    num_decode_steps: int,
    reference: dict[SampleKey, Trajectory] | None,
) -> dict[SampleKey, Trajectory]:
    seq_ids = [case.seq_id(sample) for sample in range(case.num_samples)]
    prompt_logits = runner.prefill(
        seq_ids[0], case.request(num_decode_steps), list(case.token_ids)
    )  # [vocab]
    for seq_id in seq_ids[1:]:
        runner.fork(seq_ids[0], seq_id)
    logits = [[prompt_logits] for _ in seq_ids]  # per sample, each [vocab]
    tokens = [[choose_token(prompt_logits, sample)] for sample in range(case.num_samples)]
    for step in range(num_decode_steps):
        for sample, seq_id in enumerate(seq_ids):
            token = fed_token(reference, (case.prompt_id, sample), step, tokens[sample])
            logits[sample].append(runner.decode(seq_id, token))
            tokens[sample].append(choose_token(logits[sample][-1], 0))
    for seq_id in seq_ids:
        runner.free(seq_id)
    return {
        (case.prompt_id, sample): Trajectory(torch.stack(logits[sample]), tokens[sample])
        for sample in range(case.num_samples)
    }


def record_step(
    step_logits: torch.Tensor, logits: list[list[torch.Tensor]], chosen: list[list[int]]
) -> None:
    """Append a batched step's logits ([rows, vocab], one row per sequence) to each sequence's
    ``logits``, and its greedy token to its ``chosen``."""
    for row, row_logits in enumerate(step_logits):
        logits[row].append(row_logits)
        chosen[row].append(choose_token(row_logits, 0))


def as_trajectories(
    keys: Sequence[SampleKey], logits: list[list[torch.Tensor]], chosen: list[list[int]]
) -> dict[SampleKey, Trajectory]:
    """The sequences' logits and choices, one ``Trajectory`` per key (all in the same order)."""
    return {
        key: Trajectory(torch.stack(rows), own)
        for key, rows, own in zip(keys, logits, chosen, strict=True)
    }


def scramble_free_blocks(allocator: Allocator, seed: int) -> None:
    """Leave the allocator's free queue in a random order, so block tables are scattered.

    Every block goes to a one-block dummy sequence; freeing them in a seeded random order
    queues the blocks in that order (the pool hands out the least recently freed first).
    """
    dummy = Request(request_id=-1, arrival_s=0.0, prompt_tokens=1, output_tokens=0)
    num_blocks = allocator.num_slots // allocator.block_size
    dummy_ids = [-1 - index for index in range(num_blocks)]  # negative: never a case's id
    for seq_id in dummy_ids:
        allocator.admit(seq_id, dummy, 1)
    random.Random(seed).shuffle(dummy_ids)
    for seq_id in dummy_ids:
        allocator.free(seq_id)


def blocks_needed(cases: Sequence[PromptCase], num_decode_steps: int, block_size: int,
                  all_at_once: bool = False) -> int:  # fmt: skip
    """A pool size that holds the largest case with all its samples (cases run one by one), or
    with ``all_at_once`` every case (a batched run), plus a copy-on-write block per sample."""
    def case_blocks(case: PromptCase) -> int:
        tokens = len(case.token_ids) + num_decode_steps
        return case.num_samples * (-(-tokens // block_size) + 1)

    per_case = [case_blocks(case) for case in cases]
    return (sum(per_case) if all_at_once else max(per_case)) + 4
