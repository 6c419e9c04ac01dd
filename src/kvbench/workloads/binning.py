"""The fine bins of the shipped length profiles: exact below 128 tokens, ~1 % wide above.

Exact bins keep small lengths (Alpaca's median prompt is 14 tokens) exact; 1 % bins bound the
error of any percentile to about 1 % while a 126k-token range still needs only ~700 bins.
"""

from __future__ import annotations

import numpy as np

EXACT_BELOW_TOKENS = 128
LOG_BIN_RATIO = 1.01


def fine_bin_edges(max_tokens: int) -> np.ndarray:
    """Lower edges of the fine bins covering 0..max_tokens; bin i is [edges[i], edges[i+1] - 1].

    The last edge is one past the last bin, so ``len(edges) - 1`` bins cover the range.
    """
    edges = list(range(min(EXACT_BELOW_TOKENS, max_tokens + 1) + 1))
    while edges[-1] <= max_tokens:
        edges.append(max(edges[-1] + 1, round(edges[-1] * LOG_BIN_RATIO)))
    return np.asarray(edges, dtype="int64")


def fine_bin_index(tokens: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Index of the fine bin holding each token count."""
    return np.searchsorted(edges, tokens, side="right") - 1
