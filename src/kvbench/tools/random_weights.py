"""``python -m kvbench.tools.random_weights``: does a random-weight model time like the real one?

Not a test: it prints figures measured in one run on this machine (docs/sim_to_real.md). The
same iterations of ``task=profile`` (``measure.time_iteration``: decode batches, a prefill, the
contiguous arena) are timed on SmolLM2-135M's pretrained weights and on random weights of its
catalog shape (``executor.weights=random``), the two alternating point by point and round by
round, so that the machine's drift hits both alike; per point, the median over rounds of each
round's random / pretrained ratio.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from kvbench.core.packaged_conf import read_option
from kvbench.tasks.equivalence.models import catalog_llama_config, load_model, random_model
from kvbench.tasks.equivalence.names import SMOLLM2
from kvbench.tasks.profile.grid import IterationPoint
from kvbench.tasks.profile.measure import time_iteration
from kvbench.tools import count_at_least

POINTS = {
    "decode 1 x 256": IterationPoint(16, (256,)),
    "decode 8 x 256": IterationPoint(16, (256,) * 8),
    "decode 32 x 256": IterationPoint(16, (256,) * 32),
    "prefill 1 x 256": IterationPoint(16, (), (256,)),
    "decode 8 x 256, block 1": IterationPoint(1, (256,) * 8),
}


def ratios(pretrained: Any, random: Any, num_rounds: int, repeats: int) -> dict[str, list[float]]:
    """Per point, each round's random / pretrained median time (the first model timed first
    alternates between rounds)."""
    measured: dict[str, list[float]] = {name: [] for name in POINTS}
    for round_index in range(num_rounds):
        for name, point in POINTS.items():
            order = (pretrained, random) if round_index % 2 == 0 else (random, pretrained)
            times_s = {id(model): time_iteration(model, point, repeats, "sdpa")[1].median_s
                       for model in order}  # fmt: skip
            measured[name].append(times_s[id(random)] / times_s[id(pretrained)])
    return measured


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=count_at_least(1), default=9)
    parser.add_argument("--repeats", type=count_at_least(1), default=3,
                        help="timed runs per point and model")
    parser.add_argument("--threads", type=count_at_least(1), default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pretrained = load_model(SMOLLM2)
    random = random_model(catalog_llama_config(read_option("model", SMOLLM2)), torch.float32,
                          "cpu")  # fmt: skip
    for name, values in ratios(pretrained, random, args.rounds, args.repeats).items():
        spread = f"rounds {min(values):.2f}-{max(values):.2f}"
        print(f"{name}: random / pretrained, median of {len(values)} rounds "
              f"{statistics.median(values):.3f} ({spread})")  # fmt: skip


if __name__ == "__main__":
    main()
