"""``experiment=logit_equivalence`` end to end on a tiny random model; its config checks."""

from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.config import ConfigError
from kvbench.tables.parquet import read_metadata
from kvbench.tasks.equivalence.run import run_logit_equivalence
from kvbench.tasks.equivalence.table import EQUIVALENCE_COLUMNS

METRICS_DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
SMALL = (
    "experiment=logit_equivalence",
    "equivalence.model=tiny-llama-gqa",
    "equivalence.num_prompts=2",
    "equivalence.num_decode_steps=6",
)


def test_small_run_writes_the_table_the_plot_and_the_verdicts(tmp_path, capsys):
    cfg, deployment, raw = compose_config(*SMALL)
    run_logit_equivalence(cfg, deployment, raw, tmp_path)
    table = pd.read_parquet(tmp_path / "equivalence.parquet")
    assert list(table.columns) == list(EQUIVALENCE_COLUMNS)
    # 2 allocators x 3 backends x 2 prompts x 2 samples x 7 steps (the prompt's and 6 decodes).
    assert len(table) == 2 * 3 * 2 * 2 * 7
    assert set(table["allocator"]) == {"paged", "paged_prefix"}
    assert set(table["backend"]) == {"torch", "sdpa", "gather"}
    assert (table["max_rel_diff"] <= 1e-5).all() and table["tokens_equal"].all()
    assert (table.loc[table["backend"] == "gather", "max_abs_diff"] == 0).all()
    assert [path.name for path in (tmp_path / "plots").iterdir()] == ["equivalence.png"]
    assert "equivalence" in read_metadata(tmp_path / "equivalence.parquet")["config_yaml"]
    printed = capsys.readouterr().out
    assert printed.count("PASS") == 6 and "tolerance: rel <= 1e-05" in printed


def test_every_equivalence_column_is_documented():
    section = METRICS_DOC.split("## equivalence.parquet", 1)[1]
    assert all(f"`{column}`" in section for column in EQUIVALENCE_COLUMNS)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("equivalence.model=gpt2", "equivalence.model='gpt2'"),
        ("equivalence.allocators=[naive_max]", "equivalence.allocators contains 'naive_max'"),
        ("equivalence.backends=[cuda]", "equivalence.backends contains 'cuda'"),
        ("equivalence.dtype=bf16", "equivalence.dtype='bf16'"),
        ("equivalence.num_decode_steps=0", "equivalence.num_decode_steps=0: must be >= 1"),
        ("equivalence.block_size=12", "equivalence.block_size=12"),
    ],
)
def test_bad_equivalence_values_give_one_line(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[")) as error:
        compose_config("experiment=logit_equivalence", override)
    assert "\n" not in str(error.value)


def test_an_fp8_kv_run_reports_its_agreement_and_kl_per_step(tmp_path, capsys):
    cfg, deployment, raw = compose_config(*SMALL, "equivalence.kv_dtype=fp8",
                                          "equivalence.allocators=[paged]", "plots=false")
    table = run_logit_equivalence(cfg, deployment, raw, tmp_path)
    assert list(table.columns) == list(EQUIVALENCE_COLUMNS)
    assert set(table["kv_dtype"]) == {"fp8"} and set(table["dtype"]) == {"fp32"}
    # fp8 rounding (2^-4 relative) moves the logits far past the fp32 tolerance, but not to noise.
    assert table["max_rel_diff"].max() > 1e-4
    assert table["kl_div"].notna().all() and (table["kl_div"] >= -1e-12).all()
    assert table["kl_div"].max() > 0
    printed = capsys.readouterr().out
    assert "FP8 (unit scales) paged/torch: argmax agreement" in printed and "PASS" not in printed


def test_the_stock_kl_of_an_fp32_run_is_zero_where_the_logits_are_identical(tmp_path):
    cfg, deployment, raw = compose_config(*SMALL, "equivalence.allocators=[paged]",
                                          "equivalence.backends=[gather]", "plots=false")
    table = run_logit_equivalence(cfg, deployment, raw, tmp_path)
    assert (table["max_abs_diff"] == 0).all() and (table["kl_div"] == 0).all()
    assert set(table["kv_dtype"]) == {"fp32"}


def test_a_kv_dtype_the_pools_cannot_store_is_a_config_error():
    with pytest.raises(ConfigError, match=r"equivalence.kv_dtype='int8': allowed are fp8"):
        compose_config(*SMALL, "equivalence.kv_dtype=int8")
