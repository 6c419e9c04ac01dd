"""Figures printed in the vLLM paper (Kwon et al., SOSP'23, arXiv 2309.06180), for comparison plots.

Only labels printed in the paper are kept here (Fig. 2 bars, Fig. 13 bars), keyed by kvbench's
allocator names: Orca (Max/Pow2/Oracle) = naive_max/naive_pow2/naive_oracle, vLLM = paged.
"""

from __future__ import annotations

# Fig. 2: % of the KV cache; vLLM's bar prints only token states (96.3) and an unlabeled 3.7 rest.
FIG2_BREAKDOWN_PCT: dict[str, dict[str, float]] = {
    "naive_max": {"token_states": 20.4, "reservation": 13.3, "internal_frag": 57.3,
                  "external_frag": 8.9},
    "naive_pow2": {"token_states": 26.8, "reservation": 17.9, "internal_frag": 13.6,
                   "external_frag": 41.6},
    "naive_oracle": {"token_states": 38.2, "reservation": 25.2, "internal_frag": 0.0,
                     "external_frag": 36.6},
    "paged": {"token_states": 96.3, "external_frag": 3.7},
}  # fmt: skip

# Fig. 13: mean number of batched requests, OPT-13B.
FIG13_MEAN_BATCH_SIZE: dict[str, dict[str, float]] = {
    "sharegpt": {"naive_max": 7.00, "naive_pow2": 9.81, "naive_oracle": 13.62, "paged": 30.42},
    "alpaca": {"naive_max": 7.00, "naive_pow2": 43.24, "naive_oracle": 72.75, "paged": 132.44},
}

# Fig. 13's request rates (req/s) per workload (the Fig. 2 / Fig. 13 setup, ANCHORS.md).
FIG13_REQUEST_RATES: dict[str, float] = {"sharegpt": 2.0, "alpaca": 30.0}

# Fig. 12 knees, OPT-13B (approx: read off the figure's axes, req/s): the highest rate before
# normalized latency explodes. Shape only.
FIG12_KNEES_APPROX: dict[str, dict[str, float]] = {
    "sharegpt": {"naive_max": 0.5, "naive_pow2": 0.75, "naive_oracle": 1.1, "paged": 1.9},
    "alpaca": {"naive_max": 7.0, "naive_pow2": 13.0, "naive_oracle": 20.0, "paged": 28.0},
}

# §6.2 (exact): on ShareGPT vLLM sustains these multiples of the baselines' request rate at
# similar latency (over OPT-13B, 66B and 175B).
FIG12_SHAREGPT_KNEE_RATIO_RANGE: dict[str, tuple[float, float]] = {
    "naive_oracle": (1.7, 2.7),
    "naive_max": (2.7, 8.0),
}

# §7.2 / Fig. 18b (exact): the block sizes with the lowest latency; vLLM's default is 16.
FIG18B_BEST_BLOCK_SIZES: dict[str, tuple[int, int]] = {"sharegpt": (16, 128), "alpaca": (16, 32)}

# §7.3 / Fig. 19 (exact): recomputation's overhead is never more than 20 % above swapping's latency;
# the two are comparable at block sizes 16-64 (swapping suffers from small PCIe copies below).
FIG19_RECOMPUTE_OVER_SWAP_MAX = 1.20

# Fig. 15 (exact): memory saving (%) = blocks saved by sharing / blocks without sharing, OPT-13B on
# Alpaca, by the number of parallel samples n or the beam width k; ShareGPT only as ranges (§6.3).
FIG15_ALPACA_SAVING_PCT: dict[str, dict[int, float]] = {
    "parallel_sampling": {2: 6.09, 4: 8.53, 6: 9.79},
    "beam_search": {2: 37.56, 4: 53.13, 6: 55.16},
}
FIG15_SHAREGPT_SAVING_RANGE_PCT: dict[str, tuple[float, float]] = {
    "parallel_sampling": (16.2, 30.5),
    "beam_search": (44.3, 66.3),
}
# §6.3 (exact): vLLM's throughput over Orca (Oracle), OPT-13B on Alpaca, beam width 6.
BEAM_K6_ALPACA_GAIN_OVER_ORACLE = 2.3
