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
