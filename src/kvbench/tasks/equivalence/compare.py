"""Step-by-step differences between a paged trajectory and the stock one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.tasks.equivalence.cases import Trajectory


@dataclass(frozen=True)
class StepDiff:
    """How one decode step's logits differ.

    Attributes:
        step: 0 for the prompt's logits, k after the k-th generated token.
        max_abs_diff: ``max |paged - stock|`` over the vocabulary.
        max_rel_diff: ``max_abs_diff / max |stock|``: relative to the step's largest logit, not
            per element (a logit near 0 would make a per-element ratio meaningless).
        argmax_equal: both pick the same greedy token.
        kl_div: ``KL(stock || paged)`` of the two next-token distributions (softmax of the
            logits), in nats.
    """

    step: int
    max_abs_diff: float
    max_rel_diff: float
    argmax_equal: bool
    kl_div: float


def step_diffs(paged: Trajectory, stock: Trajectory) -> list[StepDiff]:
    """One ``StepDiff`` per logits row the two trajectories share."""
    num_steps = min(len(paged.logits), len(stock.logits))
    paged_logits = paged.logits[:num_steps].double()  # [num_steps, vocab]
    stock_logits = stock.logits[:num_steps].double()  # [num_steps, vocab]
    abs_diff = (paged_logits - stock_logits).abs().amax(dim=-1)  # [num_steps]
    scale = stock_logits.abs().amax(dim=-1)  # [num_steps]
    argmax_equal = paged_logits.argmax(dim=-1) == stock_logits.argmax(dim=-1)  # [num_steps]
    stock_log_probs = torch.log_softmax(stock_logits, dim=-1)  # [num_steps, vocab]
    paged_log_probs = torch.log_softmax(paged_logits, dim=-1)  # [num_steps, vocab]
    # [num_steps]: sum over the vocabulary of p_stock (log p_stock - log p_paged)
    kl_div = (stock_log_probs.exp() * (stock_log_probs - paged_log_probs)).sum(dim=-1)
    return [
        StepDiff(step, float(abs_diff[step]), float(abs_diff[step] / scale[step]),
                 bool(argmax_equal[step]), float(kl_div[step]))
        for step in range(num_steps)
    ]  # fmt: skip


def tokens_equal(paged: Trajectory, stock: Trajectory) -> bool:
    """Whether the two continuations are the same tokens."""
    return paged.tokens == stock.tokens


def has_nan(trajectory: Trajectory) -> bool:
    """Whether any logit is NaN (a difference of NaN would compare as no difference)."""
    return bool(torch.isnan(trajectory.logits).any())
