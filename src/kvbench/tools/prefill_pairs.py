"""``python -m kvbench.tools.prefill_pairs``: what one attention pair of a prefill costs, apart
from the dense layers.

A prefill of one prompt of N tokens and one of ``--split`` prompts of N / split tokens compute
the same tokens, so the same rows pass through every dense layer, but the first computes about
``split`` times the attention pairs (N (N + 1) / 2 against split x n (n + 1) / 2, n = N / split).
Timed in rounds, the two in a shuffled order each round so that the machine's drift over minutes
falls on both alike, the difference per round over the difference in pairs is the price of a
pair, measured on shapes no profile grid holds. ``--profile FILE`` (repeatable) checks a
profile's ``per_prefill_pair_s`` against it, with what the profile prices each prefill at: on a
noisy machine a grid's fit can put a prefill's convexity on the pairs or on the per-token hinges
alike (docs/sim_to_real.md, "What each cost term means"). The matmuls are aten's, as
``task=profile``'s by default.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import ProfiledCostModel
from kvbench.executors.names import DECODE_BACKENDS
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import MODEL_NAMES, SMOLLM2
from kvbench.tasks.profile.grid import IterationPoint
from kvbench.tasks.profile.measure import time_iteration
from kvbench.tasks.profile.profile_file import device_name, read_profile
from kvbench.tools import count_at_least
from kvbench.workloads.schema import TokenizerUnavailableError

BLOCK_SIZE = 16  # the paged allocators' (a prefill's attention runs on its prompt alone)


@dataclass(frozen=True)
class PairPrice:
    """The two prefills' times over the rounds and the price of a pair they give.

    Attributes:
        single_ms, split_ms: the median over rounds of each prefill's time.
        difference_ms: the median over rounds of single - split.
        difference_iqr_ms: its first and third quartiles.
        num_single_slower: rounds in which the single prompt took longer.
        extra_pairs: the attention pairs the single prompt computes beyond the split ones.
    """

    single_ms: float
    split_ms: float
    difference_ms: float
    difference_iqr_ms: tuple[float, float]
    num_single_slower: int
    extra_pairs: int

    @property
    def pair_s(self) -> float:
        """Seconds a pair costs: the median difference over the extra pairs."""
        return self.difference_ms / 1e3 / self.extra_pairs

    @property
    def pair_iqr_s(self) -> tuple[float, float]:
        """The difference's quartiles over the extra pairs, in seconds."""
        low, high = self.difference_iqr_ms
        return low / 1e3 / self.extra_pairs, high / 1e3 / self.extra_pairs


def prompts(num_tokens: int, split: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The single prompt and the ``split`` prompts of the same ``num_tokens``."""
    if split < 2 or num_tokens % split:
        raise ValueError(f"--tokens={num_tokens} --split={split}: the tokens must split into "
                         f"{split} equal prompts (split >= 2)")  # fmt: skip
    return (num_tokens,), (num_tokens // split,) * split


def attention_pairs(prompt_tokens: tuple[int, ...]) -> int:
    """Causal attention pairs of prefilling each of ``prompt_tokens`` from scratch."""
    return sum(n * (n + 1) // 2 for n in prompt_tokens)


def pair_price(single_ms: list[float], split_ms: list[float], extra_pairs: int) -> PairPrice:
    """The figures of rounds timing the single prompt (``single_ms``) and the split ones
    (``split_ms``, the same rounds in the same order), ``extra_pairs`` apart (at least 2
    rounds)."""
    if len(single_ms) != len(split_ms) or len(single_ms) < 2:
        raise ValueError(f"{len(single_ms)} and {len(split_ms)} rounds: needs two or more of each")
    differences = [a - b for a, b in zip(single_ms, split_ms, strict=True)]
    first, _, third = statistics.quantiles(differences, n=4, method="inclusive")
    difference_ms = statistics.median(differences)
    return PairPrice(
        single_ms=statistics.median(single_ms), split_ms=statistics.median(split_ms),
        difference_ms=difference_ms, difference_iqr_ms=(first, third),
        num_single_slower=sum(d > 0 for d in differences), extra_pairs=extra_pairs,
    )  # fmt: skip


def time_rounds(model: object, shapes: tuple[tuple[int, ...], ...], rounds: int, repeats: int,
                backend: str, seed: int = 0) -> list[list[float]]:  # fmt: skip
    """Per shape (prompt tokens of one prefill), its milliseconds in each of ``rounds`` rounds
    (the median of ``repeats`` timed runs, ``measure.time_iteration``), the shapes in a shuffled
    order each round."""
    order = random.Random(seed)
    times_ms: list[list[float]] = [[] for _ in shapes]
    for _ in range(rounds):
        for index in order.sample(range(len(shapes)), len(shapes)):
            point = IterationPoint(BLOCK_SIZE, prefill_prompts=shapes[index])
            _, timing = time_iteration(model, point, repeats, backend)
            times_ms[index].append(timing.median_s * 1e3)
    return times_ms


def profile_line(path: str, document: dict[str, Any], price: PairPrice,
                 shapes: tuple[tuple[int, ...], ...]) -> str:  # fmt: skip
    """What the profile ``document`` (read from ``path``) prices a pair and each prefill at,
    beside the measured."""
    coefficients = {name: float(value) for name, value in document["coefficients"].items()}
    model = ProfiledCostModel(coefficients, BLOCK_SIZE)
    pair_s = coefficients["per_prefill_pair_s"]
    ratios = []
    for prompt_tokens, measured_ms in zip(shapes, (price.single_ms, price.split_ms), strict=True):
        shape = IterationShape(sum(prompt_tokens), attention_pairs(prompt_tokens), 0, 0,
                               num_prefill_seqs=len(prompt_tokens))  # fmt: skip
        priced_ms = model.iteration_time_s(shape) * 1e3
        ratios.append(f"{_name(prompt_tokens)} at {priced_ms / measured_ms:.2f}x")
    measured = f"{pair_s / price.pair_s:.2f}x the measured" if price.pair_s > 0 else "measured <= 0"
    return (f"profile {path}: per_prefill_pair_s {pair_s * 1e6:.3f} us ({measured}); it prices "
            + " and ".join(ratios) + " the measured time")  # fmt: skip


def _name(prompt_tokens: tuple[int, ...]) -> str:
    return f"{len(prompt_tokens)} x {prompt_tokens[0]}"


def main(argv: list[str] | None = None) -> int:
    """Time both prefills in rounds; print the price of a pair and each profile's beside it."""
    parser = argparse.ArgumentParser(prog="python -m kvbench.tools.prefill_pairs",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--model", choices=MODEL_NAMES, default=SMOLLM2)
    parser.add_argument("--tokens", type=count_at_least(1), default=1024,
                        help="tokens of each prefill")
    parser.add_argument("--split", type=int, default=4, help="prompts the second prefill has")
    parser.add_argument("--rounds", type=int, default=8, help="rounds timing both (>= 2)")
    parser.add_argument("--repeats", type=count_at_least(1), default=3,
                        help="timed runs per prefill a round")
    parser.add_argument("--threads", type=count_at_least(1), default=2, help="torch threads")
    parser.add_argument("--backend", choices=DECODE_BACKENDS, default="sdpa",
                        help="the executor's decode backend")
    parser.add_argument("--profile", action="append", default=[],
                        help="a task=profile file whose pair price to check (repeatable)")
    args = parser.parse_args(argv)
    try:
        shapes = prompts(args.tokens, args.split)
        if args.rounds < 2:  # (--repeats >= 1: its argparse type)
            raise ValueError(f"--rounds={args.rounds} --repeats={args.repeats}: needs at least 2 "
                             "rounds of at least 1 timed run")  # fmt: skip
        # Read first: a bad file is refused before minutes of timing.
        profiles = [(path, read_profile(path)) for path in args.profile]
    except (ValueError, OSError) as error:
        parser.error(str(error))
    try:
        model = load_model(args.model)
    except TokenizerUnavailableError as error:  # SmolLM2's offline weights are not installed
        print(f"kvbench.tools.prefill_pairs: {error}", file=sys.stderr)
        return 3
    torch.set_num_threads(args.threads)
    extra_pairs = attention_pairs(shapes[0]) - attention_pairs(shapes[1])
    print(f"{device_name()}, {args.threads} threads, {args.model}, {args.backend}: "
          f"{args.rounds} rounds of prefills of {_name(shapes[0])} and {_name(shapes[1])} tokens "
          f"({extra_pairs:,} more pairs in the first)", flush=True)  # fmt: skip
    single_ms, split_ms = time_rounds(model, shapes, args.rounds, args.repeats, args.backend)
    price = pair_price(single_ms, split_ms, extra_pairs)
    low, high = price.difference_iqr_ms
    print(f"{_name(shapes[0])}: median {price.single_ms:.1f} ms; {_name(shapes[1])}: median "
          f"{price.split_ms:.1f} ms")  # fmt: skip
    print(f"difference per round: median {price.difference_ms:.1f} ms (quartiles {low:.1f} to "
          f"{high:.1f}), the single prompt slower in {price.num_single_slower} of {args.rounds}")
    low_us, high_us = (value * 1e6 for value in price.pair_iqr_s)
    print(f"price of a pair: {price.pair_s * 1e6:.3f} us (quartiles {low_us:.3f} to "
          f"{high_us:.3f})")  # fmt: skip
    for path, document in profiles:
        print(profile_line(path, document, price, shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
