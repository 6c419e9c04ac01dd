"""Nothing dropped in silence: every request of the input is in the output, served or rejected
with its reason; clipped outputs are marked and counted; the run says where each request went."""

import math

import pandas as pd
import pytest
from conftest import compose_config
from test_cli import run_kvbench

from kvbench.allocators import make_allocator
from kvbench.engine import Scheduler, simulate
from kvbench.engine.records import REJECT_REASONS
from kvbench.tasks.simulate.accounting import workload_accounting
from kvbench.tasks.simulate.experiment import cost_model, run_experiment, scheduler_limits
from kvbench.tasks.simulate.table import requests_frame, summarize
from kvbench.workloads import build_workload, save_trace, to_requests
from kvbench.workloads.config import UntimedTraceWarning

LLAMA_70B_TP4 = ("model=llama-2-70b", "hardware=a100-80gb", "hardware.num_gpus=4")
# (prompt, output) of a user's trace on a 4,096-token model: what each row must become.
USER_ROWS = [
    (5_000, 10),  # prompt beyond the context: rejected
    (10**18, 3),  # absurd prompt: rejected, not an overflow
    (0, 5),  # empty prompt: rejected, as vLLM does
    (100, 0),  # no output: served by its prefill alone
    (4_000, 500),  # output clipped to the 96 tokens of context left
    (200, 50),  # ordinary
]
EXPECTED_STATUS = ["rejected", "rejected", "rejected", "finished", "finished", "finished"]
EXPECTED_REASON = ["prompt_exceeds_max_model_len", "prompt_exceeds_max_model_len",
                   "empty_prompt", "", "", ""]  # fmt: skip


def _user_trace(tmp_path):
    trace = tmp_path / "my_trace.csv"
    rows = "".join(f"{p},{o},{i * 0.5}\n" for i, (p, o) in enumerate(USER_ROWS))
    trace.write_text("prompt_tokens,output_tokens,arrival_s\n" + rows)
    return trace


def test_a_users_trace_keeps_every_request_and_says_where_each_went(tmp_path):
    out = tmp_path / "run"
    done = run_kvbench(
        "workload=trace", f"workload.path={_user_trace(tmp_path)}", *LLAMA_70B_TP4,
        "allocators=[paged,naive_max]", "progress=false", "plots=false", f"hydra.run.dir={out}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    requests = pd.read_parquet(out / "requests.parquet")
    for _, run in requests.groupby("allocator"):
        run = run.sort_values("request_id")
        assert run["prompt_tokens"].tolist() == [p for p, _ in USER_ROWS]
        assert run["status"].tolist() == EXPECTED_STATUS
        assert run["reject_reason"].tolist() == EXPECTED_REASON
        assert run["output_clipped"].tolist() == [False, False, False, False, True, False]
        assert run["requested_output_tokens"].tolist() == [o for _, o in USER_ROWS]
        assert run["output_tokens"].tolist()[4] == 96
    summary = pd.read_parquet(out / "summary.parquet")
    assert summary["num_requests"].tolist() == [6, 6]
    assert summary["num_finished"].tolist() == [3, 3]
    assert summary["num_rejected_prompt_exceeds_max_model_len"].tolist() == [2, 2]
    assert summary["num_rejected_empty_prompt"].tolist() == [1, 1]
    assert summary["num_output_clipped"].tolist() == [1, 1]
    assert summary["num_zero_output"].tolist() == [1, 1]
    # The zero-output request has no normalized latency: the mean stays finite.
    assert summary["normalized_latency_s_per_token"].map(math.isfinite).all()
    assert requests["normalized_latency_s_per_token"].dropna().map(math.isfinite).all()
    lines = [line for line in done.stdout.splitlines() if line.startswith("kvbench: workload")]
    assert lines == [
        "kvbench: workload trace: 6 requests from 6 rows of my_trace.csv (0 removed by its "
        "filter); served 3, rejected 3 (empty_prompt 1, prompt_exceeds_max_model_len 2); "
        "outputs clipped to the model's context 1"
    ]


def test_the_accounting_line_shows_counts_that_differ_between_runs_as_a_range():
    row = {"workload": "w", "num_requests": 10, "num_finished": 9, "num_rejected": 1,
           "num_output_clipped": 0, **{f"num_rejected_{r}": 0 for r in REJECT_REASONS}}  # fmt: skip
    summary = pd.DataFrame([{**row, "num_rejected_exceeds_pool": 1},
                            {**row, "num_finished": 10, "num_rejected": 0}])  # fmt: skip
    assert workload_accounting("w", summary) == (
        "kvbench: workload w: 10 requests; served 9-10 (by run), rejected 0-1 (by run) "
        "(exceeds_pool 0-1 (by run)); outputs clipped to the model's context 0"
    )


def test_azure_conversation_trace_on_llama_2_70b_counts_every_request(shared_traces):
    """The issue's case: 19,366 requests in = served + rejected by reason; clipped counted."""
    trace = shared_traces / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    cfg, deployment, _ = compose_config(
        "workload=trace", f"workload.path={trace}", *LLAMA_70B_TP4, "allocator.block_size=16"
    )
    max_model_len = deployment.model.max_model_len
    requests = to_requests(build_workload(cfg.workload, max_model_len))
    allocator = make_allocator("paged", deployment.num_kv_slots, 16, max_model_len)
    result = simulate(requests, Scheduler(scheduler_limits(cfg, deployment)), allocator,
                      cost_model(cfg, deployment), fast=True)  # fmt: skip
    table = requests_frame(result)
    summary = summarize(table, result, deployment)
    assert summary["num_requests"] == 19_366
    assert summary["num_finished"] + summary["num_rejected"] == 19_366
    assert summary["num_rejected"] == sum(summary[f"num_rejected_{r}"] for r in REJECT_REASONS)
    # Counted from the trace file itself: 416 prompts reach 4,096 tokens, 1,196 more need
    # their output clipped to fit.
    assert summary["num_rejected_prompt_exceeds_max_model_len"] == 416
    assert summary["num_finished"] == 19_366 - 416
    assert summary["num_output_clipped"] == 1_196
    clipped = table[table["output_clipped"]]
    assert (clipped["prompt_tokens"] + clipped["output_tokens"] == max_model_len).all()


def test_a_workload_with_no_prompt_that_fits_is_one_clear_error():
    cfg, _, _ = compose_config("workload=fixed", "workload.prompt_tokens=5000")
    with pytest.raises(ValueError, match=r"none of its 1000 prompts fits the model .*longest 5000"):
        build_workload(cfg.workload, 4096)


def test_a_workload_whose_every_prompt_is_empty_says_so_not_that_none_fits(tmp_path):
    path = tmp_path / "empty_prompts.csv"
    path.write_text("prompt_tokens,output_tokens\n0,5\n0,7\n")
    cfg, _, _ = compose_config("workload=trace", f"workload.path={path}")
    with pytest.raises(ValueError) as caught:
        build_workload(cfg.workload, 4096)
    assert str(caught.value) == (
        "workload trace: all of its 2 prompts are empty (0 tokens), and an engine rejects an "
        "empty prompt; expected prompts of text or token counts >= 1 (is the trace's prompt "
        "column the right one?)")


def test_the_ideal_prefix_hit_rate_counts_only_the_requests_the_engine_can_serve(tmp_path):
    """An unbounded prefix cache reaches its ideal exactly, even with prompts beyond the context
    in the input: those are rejected on arrival, never cached and never hit, so the ideal leaves
    them out too."""
    prompts = [600, 5_000, 700, 600, 6_000, 650, 800, 600]  # two beyond Llama-2's 4,096
    trace = pd.DataFrame({
        "request_id": range(len(prompts)), "arrival_s": [0.5 * i for i in range(len(prompts))],
        "prompt_tokens": prompts, "output_tokens": [20] * len(prompts),
        "prefix_group": pd.array([0] * len(prompts), dtype="Int64"),
        "prefix_tokens": [512] * len(prompts),
    })  # fmt: skip
    path = save_trace(trace, tmp_path / "shared_prefix.parquet")
    cfg, deployment, raw = compose_config(
        "workload=trace", f"workload.path={path}", *LLAMA_70B_TP4, "allocators=[paged_prefix]",
        "progress=false", "plots=false", "summary_table=false",
    )  # fmt: skip
    summary = run_experiment(cfg, deployment, raw, tmp_path / "run").iloc[0]
    assert summary["num_rejected_prompt_exceeds_max_model_len"] == 2
    # 5 of the 6 served requests find the 512-token prefix (blocks of 16: all 32 blocks).
    served_prompt_tokens = 600 + 700 + 600 + 650 + 800 + 600
    assert summary["ideal_prefix_hit_rate"] == pytest.approx(5 * 512 / served_prompt_tokens)
    assert summary["prefix_hit_rate"] == pytest.approx(summary["ideal_prefix_hit_rate"])


def test_sharegpt_records_without_a_pair_are_counted_in_the_accounting_line(tmp_path):
    import json

    records = [{"id": str(i), "conversations": [{"from": "human", "value": "Name a colour."},
                                                {"from": "gpt", "value": "Blue, and green."}]}
               for i in range(2)]  # fmt: skip
    records += [{"id": "x", "conversations": [{"from": "gpt", "value": "I start."}]},
                {"id": "y", "conversations": []}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records))
    cfg, _, _ = compose_config("workload=trace", f"workload.path={path}",
                               "workload.tokenizer=null", "workload.request_rate=1")  # fmt: skip
    with pytest.warns(UntimedTraceWarning, match="has no arrival times"):
        workload = build_workload(cfg.workload, 4096)
    summary = pd.DataFrame([{"workload": "w", "num_requests": 2, "num_finished": 2,
                             "num_rejected": 0, "num_output_clipped": 0,
                             **{f"num_rejected_{reason}": 0 for reason in REJECT_REASONS}}])
    assert workload_accounting("w", summary, workload.attrs) == (
        "kvbench: workload w: 2 requests from 2 rows of sharegpt.json (0 removed by its filter; "
        "2 records without a prompt and its answer skipped before); served 2, rejected 0; "
        "outputs clipped to the model's context 0")
