"""``experiment=kv_designs`` (and ``_70b``): the KV designs of today on one setting each, small
enough to run here, with the orders docs/kv_designs.md explains from the mechanism."""

from __future__ import annotations

import pytest
from conftest import compose_config

from kvbench.tasks.simulate.experiment import run_experiment

SMALL = ("workloads.sharegpt.num_requests=60", "~workloads.azure_conv", "request_rates=[8]",
         "progress=false", "plots=false", "summary_table=false")  # fmt: skip


def _summary(tmp_path, *overrides):
    cfg, deployment, raw = compose_config(*overrides, *SMALL)
    return run_experiment(cfg, deployment, raw, tmp_path).set_index("allocator")


@pytest.mark.parametrize("experiment", ["kv_designs", "kv_designs_70b"])
@pytest.mark.parametrize("kv_dtype", ["null", "fp8"])
def test_each_job_of_the_multirun_composes(experiment: str, kv_dtype: str) -> None:
    cfg, deployment, _ = compose_config(f"experiment={experiment}", f"model.kv_dtype={kv_dtype}")
    assert cfg.allocators == ["naive_max", "naive_oracle", "paged", "paged_prefix",
                              "vattention_64k", "vattention_2m"]  # fmt: skip
    assert set(cfg.workloads) == {"sharegpt", "azure_conv"}
    assert deployment.hardware.name == "h100-80gb"


def test_waste_follows_the_unit_each_design_allocates_in(tmp_path) -> None:
    summary = _summary(tmp_path, "experiment=kv_designs")
    frag = summary["internal_frag_pct"]
    # A 16-token block, a 32-token page, a 1,024-token page, a whole 8,192-token reservation.
    assert frag["paged"] <= frag["vattention_64k"] < frag["vattention_2m"] < frag["naive_max"]
    assert summary.loc["paged", "token_states_pct_of_held"] > 95
    assert summary.loc["vattention_2m", "tokens_per_page"] == 1024
    # Virtual spans reserve address space, not memory: more than the whole pool here.
    assert summary.loc["vattention_64k", "virtual_reserved_gb"] > summary.loc[
        "paged", "virtual_reserved_gb"
    ]


def test_a_2_mib_fp8_page_on_70b_over_4_gpus_is_a_max_length_reservation(tmp_path) -> None:
    summary = _summary(tmp_path, "experiment=kv_designs_70b", "model.kv_dtype=fp8")
    # 2 MiB / (2 KV heads per GPU x 128 x 1 byte) = 8,192 tokens = max_model_len: vAttention holds
    # what Orca (Max) holds, category for category.
    assert summary.loc["vattention_2m", "tokens_per_page"] == 8192
    columns = ["token_states_pct", "internal_frag_pct", "mean_batch_size"]
    for column in columns:
        assert summary.loc["vattention_2m", column] == pytest.approx(
            summary.loc["naive_max", column], abs=0.01
        ), column
    assert (summary["kv_dtype"] == "fp8").all()
