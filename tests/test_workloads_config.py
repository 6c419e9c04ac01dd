"""WorkloadConfig, the conf/workload YAML files, validation and build_workload."""

from __future__ import annotations

import dataclasses
import json
from importlib.resources import files

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from kvbench.workloads import (
    WorkloadConfig,
    build_workload,
    to_requests,
    validate_workload_config,
    with_arrivals,
    workload_rows,
)
from kvbench.workloads.config import UntimedTraceWarning, as_workload_config

REQUIRED_YAMLS = ("sharegpt", "alpaca", "azure_conv", "trace", "fixed", "system_prompt")


def _yaml_names() -> list[str]:
    folder = files("kvbench.conf") / "workload"
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def _load_yaml(name: str) -> WorkloadConfig:
    text = (files("kvbench.conf") / "workload" / f"{name}.yaml").read_text()
    merged = OmegaConf.merge(OmegaConf.structured(WorkloadConfig), OmegaConf.create(text))
    return OmegaConf.to_object(merged)


def test_required_yamls_exist():
    assert set(REQUIRED_YAMLS) <= set(_yaml_names())


@pytest.mark.parametrize("name", _yaml_names())
def test_yaml_is_a_flat_mapping_of_config_fields(name):
    text = (files("kvbench.conf") / "workload" / f"{name}.yaml").read_text()
    raw = OmegaConf.to_container(OmegaConf.create(text))
    assert "defaults" not in raw and "_target_" not in raw
    assert all(not isinstance(value, dict | list) for value in raw.values())
    assert _load_yaml(name).name == name


@pytest.mark.parametrize("name", [n for n in _yaml_names() if n != "trace"])
def test_every_offline_yaml_builds(name):
    cfg = dataclasses.replace(_load_yaml(name), num_requests=None if name == "system_prompt"
                              else 200)
    workload = build_workload(cfg, max_model_len=2048)
    assert len(workload) == (64 if name == "system_prompt" else 200)
    assert workload["request_id"].tolist() == list(range(len(workload)))
    assert workload["arrival_s"].is_monotonic_increasing
    # Outputs are clipped to the context; a prompt that fills it stays, for the engine to reject.
    fits = workload["prompt_tokens"] < 2048
    assert ((workload["prompt_tokens"] + workload["output_tokens"])[fits] <= 2048).all()
    assert (workload["output_tokens"] <= workload["requested_output_tokens"]).all()
    assert len(to_requests(workload)) == len(workload)


def test_yaml_defaults_match_the_paper_setups():
    sharegpt, alpaca, azure = _load_yaml("sharegpt"), _load_yaml("alpaca"), _load_yaml("azure_conv")
    assert (sharegpt.source, sharegpt.filter, sharegpt.arrival, sharegpt.request_rate,
            sharegpt.num_requests) == ("profile", "vllm", "poisson", 2.0, 1000)
    assert (alpaca.request_rate, alpaca.num_requests, alpaca.filter) == (30.0, 2000, "vllm")
    assert (azure.arrival, azure.request_rate, azure.cv) == ("gamma", 5.53, 1.09)
    trace = _load_yaml("trace")
    assert (trace.path, trace.source, trace.arrival) == (None, "trace", "trace")


def test_trace_yaml_needs_a_path():
    with pytest.raises(ValueError, match=r"^workload.path=None is invalid; expected a trace file"):
        validate_workload_config(_load_yaml("trace"))


def test_sharegpt_build_is_filtered_seeded_and_at_the_rate():
    cfg = WorkloadConfig(name="sharegpt", num_requests=3000, request_rate=2.0, seed=5)
    workload = build_workload(cfg, max_model_len=4096)
    assert workload.equals(build_workload(cfg, max_model_len=4096))
    assert not workload.equals(build_workload(dataclasses.replace(cfg, seed=6), 4096))
    assert (workload["prompt_tokens"] <= 1024).all() and (workload["output_tokens"] >= 4).all()
    assert ((workload["prompt_tokens"] + workload["output_tokens"]) <= 2048).all()
    assert len(workload) / workload["arrival_s"].iloc[-1] == pytest.approx(2.0, rel=0.06)
    assert workload["prompt_tokens"].mean() == pytest.approx(107.9, rel=0.06)


def test_changing_the_rate_keeps_the_requests():
    slow = build_workload(WorkloadConfig(num_requests=100, request_rate=1.0), 2048)
    fast = build_workload(WorkloadConfig(num_requests=100, request_rate=4.0), 2048)
    assert slow["prompt_tokens"].tolist() == fast["prompt_tokens"].tolist()
    assert fast["arrival_s"].tolist() == pytest.approx((slow["arrival_s"] / 4).tolist())


def test_small_context_keeps_long_prompts_and_clips_outputs():
    workload = build_workload(WorkloadConfig(name="azure_conv", filter="none", arrival="gamma",
                                             request_rate=5.53, cv=1.09, num_requests=500), 1024)
    assert len(workload) == 500  # the draws, none dropped
    too_long = workload["prompt_tokens"] >= 1024
    assert too_long.any()  # Azure prompts often exceed 1,024 tokens: kept for the engine to reject
    fitting = workload[~too_long]
    assert ((fitting["prompt_tokens"] + fitting["output_tokens"]) <= 1024).all()
    clipped = fitting["output_tokens"] < fitting["requested_output_tokens"]
    assert (fitting.loc[clipped, "prompt_tokens"] + fitting.loc[clipped, "output_tokens"]
            == 1024).all()


@pytest.fixture()
def timed_trace(tmp_path):
    path = tmp_path / "timed.csv"
    rows = ["prompt_tokens,output_tokens,arrival_s"]
    rows += [f"{100 + i},{10 + i},{5.0 + 2 * i}" for i in range(10)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_trace_replay_keeps_the_timestamps(timed_trace):
    cfg = WorkloadConfig(name="trace", source="trace", path=timed_trace, num_requests=None,
                         request_rate=0.0, arrival="trace", filter="none")
    workload = build_workload(cfg, max_model_len=2048)
    assert workload["arrival_s"].tolist() == [2.0 * i for i in range(10)]
    assert workload["prompt_tokens"].tolist() == [100 + i for i in range(10)]
    first = build_workload(dataclasses.replace(cfg, num_requests=4, time_scale=0.5), 2048)
    assert first["arrival_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    rescaled = build_workload(dataclasses.replace(cfg, request_rate=1.0), 2048)
    assert rescaled["arrival_s"].iloc[-1] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="num_requests=11 exceeds the 10 usable rows"):
        build_workload(dataclasses.replace(cfg, num_requests=11), 2048)


def test_trace_without_timestamps_is_sampled_with_poisson(tmp_path):
    path = tmp_path / "vidur.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,20\n30,40\n")
    cfg = WorkloadConfig(name="mine", source="trace", path=str(path), num_requests=50,
                         arrival="poisson", request_rate=10.0, filter="none")
    workload = build_workload(cfg, max_model_len=2048)
    assert len(workload) == 50
    assert set(workload["prompt_tokens"]) == {10, 30}



def test_trace_without_timestamps_replayed_as_trace_gets_announced_poisson_arrivals(tmp_path):
    """arrival=trace (conf/workload/trace.yaml's default) on a trace without timestamps: every
    row, in file order, with Poisson arrivals at the run's rate, else untimed_request_rate."""
    path = tmp_path / "vidur.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" + "10,20\n30,40\n" * 200)
    cfg = WorkloadConfig(name="mine", source="trace", path=str(path), num_requests=None,
                         arrival="trace", request_rate=0.0, filter="none",
                         untimed_request_rate=5.0)
    with pytest.warns(UntimedTraceWarning, match=r"vidur\.csv has no arrival times; replaying it "
                      r"with Poisson arrivals at 5 req/s \(workload\.untimed_request_rate"):
        default_rate = build_workload(cfg, 2048)
    assert len(default_rate) == 400
    assert default_rate["arrival_s"].iloc[0] == 0.0
    assert (default_rate["arrival_s"].diff().iloc[1:] >= 0).all()
    assert len(default_rate) / default_rate["arrival_s"].iloc[-1] == pytest.approx(5.0, rel=0.2)
    with pytest.warns(UntimedTraceWarning, match="at each run's request rate"):
        run_rate = build_workload(dataclasses.replace(cfg, request_rate=50.0), 2048)
    assert len(run_rate) / run_rate["arrival_s"].iloc[-1] == pytest.approx(50.0, rel=0.2)


def test_mooncake_style_trace_keeps_prefix_hashes(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    records = [{"timestamp": 3000 * i, "input_length": 600 + i, "output_length": 5,
                "hash_ids": [0, 1 + i]} for i in range(4)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    cfg = WorkloadConfig(name="mooncake", source="trace", path=str(path), num_requests=None,
                         request_rate=None, arrival="trace", filter="none")
    requests = to_requests(build_workload(cfg, max_model_len=4096))
    assert [r.arrival_s for r in requests] == [0.0, 3.0, 6.0, 9.0]
    assert requests[2].prefix_block_hashes == (0, 3)
    assert {r.hash_block_tokens for r in requests} == {512}


def test_system_prompt_requests_share_a_prefix_group():
    requests = to_requests(build_workload(WorkloadConfig(
        name="system_prompt", source="synthetic", num_requests=None, num_users=5,
        system_prompt_tokens=256, prompt_tokens=32, output_tokens=8, arrival="burst",
        request_rate=None, filter="none"), max_model_len=2048))
    assert len(requests) == 5
    assert {(r.prefix_group, r.prefix_tokens, r.prompt_tokens, r.arrival_s)
            for r in requests} == {(0, 256, 288, 0.0)}


def test_dictconfig_and_dict_are_accepted():
    as_dict = {"name": "fixed", "source": "synthetic", "num_requests": 7, "filter": "none"}
    from_dict = build_workload(as_dict, 2048)
    from_omegaconf = build_workload(OmegaConf.create(as_dict), 2048)
    assert from_dict.equals(from_omegaconf) and len(from_dict) == 7
    with pytest.raises(ValueError, match=r"workload\.bogus is not a workload setting"):
        as_workload_config({"bogus": 1})


BAD_SETTINGS = [
    ({"request_rate": -1.0}, "workload.request_rate=-1.0 is invalid; expected a number > 0 "
                             "(inf allowed)"),
    ({"request_rate": 0.0}, "workload.request_rate=0.0 is invalid"),
    ({"request_rate": None}, "workload.request_rate=None is invalid; expected a number > 0 (inf "
                             "allowed) for arrival=poisson: set workload.request_rate=R or "
                             "request_rates=[R,...]"),
    ({"tokenizer": ""}, "workload.tokenizer='' is invalid; expected a local tokenizer folder or "
                        "a hub id, or null for the offline SmolLM2 tokenizer"),
    ({"untimed_request_rate": 0.0}, "workload.untimed_request_rate=0.0 is invalid; expected a "
                                    "number > 0"),
    ({"name": "sharegtp"}, "workload.name='sharegtp' is invalid; expected one of sharegpt"),
    ({"source": "file"}, "workload.source='file' is invalid; expected one of profile, trace, "
                         "synthetic"),
    ({"arrival": "uniform"}, "workload.arrival='uniform' is invalid; expected one of poisson, "
                             "gamma, trace, burst"),
    ({"filter": "sharegpt"}, "workload.filter='sharegpt' is invalid; expected one of vllm, none"),
    ({"cv": 0.0}, "workload.cv=0.0 is invalid; expected a number > 0"),
    ({"cv": -2.0}, "workload.cv=-2.0 is invalid"),
    ({"num_requests": 0}, "workload.num_requests=0 is invalid; expected an integer >= 1"),
    ({"num_requests": None}, "workload.num_requests=None is invalid; expected an integer >= 1 "
                             "for source=profile"),
    ({"source": "trace", "name": "x"}, "workload.path=None is invalid; expected a trace file or "
                                       "hub dataset id when source=trace"),
    ({"arrival": "trace"}, "workload.arrival='trace' is invalid; expected poisson, gamma or "
                           "burst unless source=trace"),
    ({"time_scale": 0.0}, "workload.time_scale=0.0 is invalid; expected a number > 0"),
    ({"format": "xml"}, "workload.format='xml' is invalid; expected one of auto, vidur"),
    ({"seed": -1}, "workload.seed=-1 is invalid; expected an integer >= 0"),
    ({"max_prompt_tokens": -5}, "workload.max_prompt_tokens=-5 is invalid"),
    ({"source": "synthetic", "name": "system_prompt", "num_requests": 3, "num_users": 8},
     "workload.num_requests=3 is invalid; expected null or num_users (8)"),
    ({"source": "synthetic", "name": "fixed", "prompt_tokens": 0},
     "workload.prompt_tokens=0 is invalid; expected an integer >= 1"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS,
                         ids=[next(iter(settings)) for settings, _ in BAD_SETTINGS])
def test_bad_settings_raise_one_line(settings, message):
    with pytest.raises(ValueError) as caught:
        validate_workload_config(dataclasses.replace(WorkloadConfig(), **settings))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_trace_rate_and_time_scale_are_exclusive():
    cfg = WorkloadConfig(name="t", source="trace", path="x.csv", arrival="trace",
                         request_rate=2.0, time_scale=0.5)
    with pytest.raises(ValueError, match=r"time_scale=0\.5 is invalid; expected 1\.0 when"):
        validate_workload_config(cfg)


@pytest.mark.parametrize("max_model_len", [0, 1, 2.5])
def test_bad_max_model_len(max_model_len):
    with pytest.raises(ValueError, match=r"max_model_len=.* is invalid"):
        build_workload(WorkloadConfig(), max_model_len)


def test_a_filter_nothing_passes_is_reported():
    cfg = WorkloadConfig(name="alpaca", num_requests=10, min_prompt_tokens=10_000)
    with pytest.raises(ValueError, match="pass filter=vllm"):
        build_workload(cfg, 2048)


def test_workload_has_unique_sorted_ids_and_arrivals():
    workload = build_workload(WorkloadConfig(name="mooncake", filter="none", num_requests=300,
                                             request_rate=3.4), max_model_len=200_000)
    assert np.all(np.diff(workload["arrival_s"]) >= 0)
    assert workload["request_id"].tolist() == list(range(300))


@pytest.mark.parametrize("name", ["sharegpt", "azure_conv", "fixed"])
def test_a_rate_sweep_builds_its_rows_once_and_gets_what_each_rate_would_build(name):
    base = dataclasses.replace(_load_yaml(name), num_requests=150)
    rows = workload_rows(base, max_model_len=2048)
    for rate in (0.5, 4.0, 30.0):
        at_rate = dataclasses.replace(base, request_rate=rate)
        pd.testing.assert_frame_equal(with_arrivals(rows, at_rate),
                                      build_workload(at_rate, max_model_len=2048))
    assert "arrival_s" not in rows.columns or rows["arrival_s"].isna().all()  # rows untouched
