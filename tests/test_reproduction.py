"""The vLLM paper's Fig. 2 breakdown and Fig. 13 batch sizes, on ShareGPT at 2 req/s (OPT-13B).

A reduced `vllm_fig2` (1,000 ShareGPT requests instead of 3,600; no Alpaca): the figures
docs/reproduction.md reports for the full run, held to the issue's bounds.
"""

import pytest
from conftest import compose_config

from kvbench.analysis.paper import FIG2_BREAKDOWN_PCT, FIG13_MEAN_BATCH_SIZE
from kvbench.tasks.simulate.experiment import run_experiment

NAIVE = ("naive_max", "naive_pow2", "naive_oracle")


@pytest.fixture(scope="module")
def sharegpt_summary(tmp_path_factory):
    cfg, deployment, raw = compose_config(
        "experiment=vllm_fig2", "~workloads.alpaca", "workloads.sharegpt.num_requests=1000",
        "allocators=[naive_max,naive_pow2,naive_oracle,paged]", "progress=false",
    )  # fmt: skip
    assert deployment.num_kv_slots == 15_728  # Table 1: 12 GB of KV, 15.7K slots
    summary = run_experiment(cfg, deployment, raw, tmp_path_factory.mktemp("fig2"))
    return summary.set_index("allocator")


@pytest.mark.parametrize("allocator", NAIVE)
def test_naive_token_states_within_five_points_of_the_paper(sharegpt_summary, allocator):
    measured = sharegpt_summary.loc[allocator, "token_states_pct"]
    assert measured == pytest.approx(FIG2_BREAKDOWN_PCT[allocator]["token_states"], abs=5)


def test_paged_keeps_at_least_94_percent_of_held_memory_in_token_states(sharegpt_summary):
    assert sharegpt_summary.loc["paged", "token_states_pct_of_held"] >= 94


def test_order_max_pow2_oracle_paged(sharegpt_summary):
    share = sharegpt_summary["token_states_pct_of_held"]
    assert share["naive_max"] < share["naive_pow2"] < share["naive_oracle"] < share["paged"]


@pytest.mark.parametrize("allocator", NAIVE)
def test_naive_batch_sizes_within_25_percent_of_fig13(sharegpt_summary, allocator):
    measured = sharegpt_summary.loc[allocator, "mean_batch_size"]
    assert measured == pytest.approx(FIG13_MEAN_BATCH_SIZE["sharegpt"][allocator], rel=0.25)


def test_naive_max_external_fragmentation_is_the_arena_remainder(sharegpt_summary):
    # 15,728 slots hold 7 extents of 2,048: the 1,392 left (8.85 %) are the paper's 8.9 % "others".
    assert sharegpt_summary.loc["naive_max", "external_frag_pct"] == pytest.approx(8.85, abs=0.05)
