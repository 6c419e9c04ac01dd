"""The recorded beam ancestry kvbench ships: which beam each beam of a real beam search extends.

``workloads/derive_beam_ancestry.py`` runs beam search with SmolLM2-135M-Instruct on Alpaca
prompts (widths 2, 4, 6) and writes ``beams/smollm2_beam_ancestry.parquet`` (shipped as
``kvbench.workload_data``), one row per (source, prompt, beam_width, step, beam):

* ``source``: prompt set (``alpaca``); ``prompt``: prompt index; ``prompt_tokens``: its length;
* ``beam_width``: k; ``step``: 0 .. T - 1 (step s produces output token s + 1);
* ``beam``: 0 .. k - 1, the beam after the step; ``parent``: the beam of step s - 1 it extends
  (0 at step 0, where all k beams extend the prompt).

``load_beam_ancestry()`` turns it into the plain nested tuples the engine replays
(``kvbench.engine.beams``): beam width -> recorded searches -> steps -> parent per beam.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np
import pandas as pd

ANCESTRY_FILE = "beams/smollm2_beam_ancestry.parquet"
ANCESTRY_COLUMNS = ("source", "prompt", "prompt_tokens", "beam_width", "step", "beam", "parent")
_KEYS = ["source", "prompt", "beam_width"]


def read_ancestry_table() -> pd.DataFrame:
    """The shipped ancestry table (columns ``ANCESTRY_COLUMNS``)."""
    path = resources.files("kvbench.workload_data").joinpath(ANCESTRY_FILE)
    with resources.as_file(path) as file:
        return pd.read_parquet(file)


def validate_ancestry(table: pd.DataFrame) -> None:
    """Check the table's shape: every (source, prompt, k, step) has beams 0..k-1 with parents in
    0..k-1, every search has the same steps 0..T-1, and step 0's parents are 0.

    Raises:
        ValueError: the first violation.
    """
    missing = [c for c in ANCESTRY_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"beam ancestry lacks columns {missing}")
    if table.empty:
        raise ValueError("beam ancestry is empty")
    steps = table.groupby(_KEYS, observed=True)["step"].agg(["min", "max", "nunique"])
    if (steps["min"] != 0).any() or (steps["max"] + 1 != steps["nunique"]).any():
        raise ValueError("every recorded search must have steps 0 .. T - 1")
    per_step = table.groupby([*_KEYS, "step"], observed=True)
    beams = per_step["beam"].agg(["min", "max", "nunique", "size"])
    width = per_step["beam_width"].first()
    if ((beams["min"] != 0) | (beams["max"] + 1 != width) | (beams["nunique"] != width)
            | (beams["size"] != width)).any():  # fmt: skip
        raise ValueError("every recorded step must have beams 0 .. k - 1 once each")
    if ((table["parent"] < 0) | (table["parent"] >= table["beam_width"])).any():
        raise ValueError("parents must lie in 0 .. k - 1")
    if (table.loc[table["step"] == 0, "parent"] != 0).any():
        raise ValueError("step 0's parents must be 0 (all beams extend the prompt)")


@functools.cache
def load_beam_ancestry() -> dict[int, tuple[tuple[tuple[int, ...], ...], ...]]:
    """beam width -> recorded searches (by source, then prompt) -> steps -> parent of each beam."""
    table = read_ancestry_table().sort_values([*_KEYS, "step", "beam"])
    ancestry: dict[int, list[tuple[tuple[int, ...], ...]]] = {}
    for (_, _, width), search in table.groupby(_KEYS, observed=True, sort=False):
        parents = search["parent"].to_numpy().reshape(-1, int(width))
        ancestry.setdefault(int(width), []).append(tuple(tuple(map(int, row)) for row in parents))
    return {width: tuple(searches) for width, searches in sorted(ancestry.items())}


def recorded_beam_widths() -> tuple[int, ...]:
    """The beam widths the shipped table has ancestry for."""
    return tuple(load_beam_ancestry())


def _lineages(parents: np.ndarray) -> np.ndarray:
    """ancestors[s, j, u]: the beam at step u on the lineage of beam j at step s (u <= s)."""
    steps, width = parents.shape
    ancestors = np.zeros((steps, width, steps), dtype=np.int16)
    ancestors[0, :, 0] = np.arange(width)
    for step in range(1, steps):
        ancestors[step, :, :step] = ancestors[step - 1, parents[step], :step]
        ancestors[step, :, step] = np.arange(width)
    return ancestors


def search_statistics(parents: np.ndarray) -> dict[str, np.ndarray]:
    """Per step s >= 1 of one search (parents [T, k]): the k lineages' common prefix (generated
    tokens before they diverge), the unshared tail (s + 1 - common prefix), the distinct parents
    and the shared fraction (1 - distinct lineage nodes / (k (s + 1)))."""
    steps, width = parents.shape
    ancestors = _lineages(parents)
    common, distinct_nodes = [], []
    for step in range(1, steps):
        lineage = ancestors[step, :, : step + 1]  # [k, s + 1]
        same = (lineage == lineage[:1]).all(axis=0)
        common.append(int(np.argmin(same)) if not same.all() else step + 1)
        distinct_nodes.append(sum(len(np.unique(lineage[:, u])) for u in range(step + 1)))
    generated = np.arange(2, steps + 1)
    common_arr = np.array(common)
    return {
        "common_prefix": common_arr,
        "common_prefix_frac": common_arr / generated,
        "unshared_tail": generated - common_arr,
        "distinct_parents": np.array([len(set(row)) for row in parents[1:].tolist()]),
        "shared_frac": 1 - np.array(distinct_nodes) / (width * generated),
    }


def ancestry_statistics(table: pd.DataFrame) -> pd.DataFrame:
    """One row per beam width: how quickly its beams share ancestry (see the card)."""
    rows = []
    for width, searches in table.sort_values([*_KEYS, "step", "beam"]).groupby("beam_width"):
        stats = [
            search_statistics(search["parent"].to_numpy().reshape(-1, int(width)))
            for _, search in searches.groupby(_KEYS, observed=True, sort=False)
        ]
        joined = {key: np.concatenate([s[key] for s in stats]) for key in stats[0]}
        rows.append({
            "beam_width": int(width),
            "num_prompts": len(stats),
            "mean_common_prefix_frac": joined["common_prefix_frac"].mean(),
            "mean_unshared_tail": joined["unshared_tail"].mean(),
            "p90_unshared_tail": np.percentile(joined["unshared_tail"], 90),
            "mean_distinct_parents": joined["distinct_parents"].mean(),
            "mean_shared_frac": joined["shared_frac"].mean(),
        })  # fmt: skip
    return pd.DataFrame(rows)
