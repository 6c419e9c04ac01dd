"""load_trace on the real shared traces (skipped without ../shared/traces) and on small files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest

from kvbench.workloads import formats, load_trace, raw_reading, save_trace
from kvbench.workloads.formats import FORMAT_NAMES, SCHEMAS
from kvbench.workloads.schema import ReadOptions
from kvbench.workloads.transforms import arrival_statistics, filter_vllm, repeated_block_fraction

TRACES_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture(scope="module")
def traces_dir() -> Path:
    if not TRACES_DIR.is_dir():
        pytest.skip(f"shared traces not found at {TRACES_DIR} (they are not shipped)")
    return TRACES_DIR


# file, format, rows, prompt mean, output mean: the table of ../shared/traces/README.md
SHARED_TRACES = [
    ("sharegpt/sharegpt_val_10k_llama2.csv", "vidur", 10_000, 245.8, 325.6),
    ("sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "vidur", 30_731, 2340.0, 438.7),
    ("alpaca/alpaca_5000_gpt2bpe_lengths.csv", "lengths", 5_000, 18.0, 58.6),
    ("azure2023/AzureLLMInferenceTrace_conv.csv", "azure", 19_366, 1154.7, 211.1),
    ("mooncake/conversation_trace.jsonl", "mooncake", 12_031, 12035.1, 342.6),
    ("arxiv/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", "vidur", 28_257,
     2588.1, 291.4),
]


@pytest.mark.parametrize(("file", "detected", "num_rows", "prompt_mean", "output_mean"),
                         SHARED_TRACES, ids=[row[0].split("/")[0] + ":" + row[1]
                                             for row in SHARED_TRACES])
def test_shared_trace_matches_readme(traces_dir, file, detected, num_rows, prompt_mean,
                                     output_mean):
    trace = load_trace(traces_dir / file)
    assert trace.attrs["format"] == detected
    assert len(trace) == num_rows
    assert trace["prompt_tokens"].mean() == pytest.approx(prompt_mean, abs=0.05)
    assert trace["output_tokens"].mean() == pytest.approx(output_mean, abs=0.05)
    assert list(trace.columns[:4]) == ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    assert trace.dtypes.iloc[:4].astype(str).tolist() == ["int64", "float64", "int64", "int64"]
    assert trace["request_id"].is_unique


def test_sharegpt_after_vllm_filter_matches_readme(traces_dir):
    filtered = filter_vllm(load_trace(traces_dir / "sharegpt/sharegpt_val_10k_llama2.csv"))
    assert len(filtered) == 8_983
    assert filtered["prompt_tokens"].mean() == pytest.approx(107.9, abs=0.05)
    assert filtered["output_tokens"].mean() == pytest.approx(329.1, abs=0.05)


def test_vidur_traces_have_no_timestamps(traces_dir):
    arxiv = "arxiv/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
    trace = load_trace(traces_dir / arxiv)
    assert trace["arrival_s"].isna().all()


def test_azure_arrivals_span_an_hour_at_the_readme_rate(traces_dir):
    trace = load_trace(traces_dir / "azure2023/AzureLLMInferenceTrace_conv.csv")
    statistics = arrival_statistics(trace["arrival_s"])
    assert trace["arrival_s"].iloc[0] == 0.0
    assert trace["arrival_s"].is_monotonic_increasing
    assert statistics["span_s"] == pytest.approx(3502, abs=1)
    assert statistics["request_rate"] == pytest.approx(5.53, abs=0.005)
    assert statistics["interarrival_cv"] == pytest.approx(1.09, abs=0.005)


def test_mooncake_keeps_prefix_hashes_of_512_token_blocks(traces_dir):
    trace = load_trace(traces_dir / "mooncake/conversation_trace.jsonl")
    assert trace.attrs["hash_block_tokens"] == 512
    assert trace["prefix_block_hashes"].iloc[0] == list(range(14))
    num_blocks = trace["prefix_block_hashes"].map(len)
    assert (num_blocks == -(-trace["prompt_tokens"] // 512)).all()
    assert arrival_statistics(trace["arrival_s"])["span_s"] == pytest.approx(3537, abs=1)
    assert repeated_block_fraction(trace) == pytest.approx(0.366, abs=0.0005)


def test_raw_alpaca_json_is_tokenized_with_smollm2(traces_dir):
    trace = load_trace(traces_dir / "alpaca/alpaca_5000.json")
    assert trace.attrs["format"] == "alpaca"
    assert len(trace) == 5_000
    # SmolLM2's BPE counts close to GPT-2's here (measured: 18.0 / 58.2 vs 18.0 / 58.6).
    assert 15 < trace["prompt_tokens"].mean() < 21
    assert 50 < trace["output_tokens"].mean() < 67


def test_format_is_detected_from_content_not_extension(tmp_path):
    vidur = tmp_path / "looks_like.json"
    vidur.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,0.5\n20,6,1.5\n")
    mooncake = tmp_path / "looks_like.csv"
    mooncake.write_text('{"timestamp": 1500, "input_length": 600, "output_length": 3, '
                        '"hash_ids": [7, 8]}\n')
    azure = tmp_path / "azure.txt"
    azure.write_text("TIMESTAMP, ContextTokens, GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900, 374, 44\n"
                     "2023-11-16 18:15:50.9951690, 396, 109\n")
    lengths = tmp_path / "lengths.parquet"
    lengths.write_text("prompt_tokens,output_tokens,arrival_s\n3,4,0.0\n")

    assert load_trace(vidur).attrs["format"] == "vidur"
    assert load_trace(vidur)["arrival_s"].tolist() == [0.5, 1.5]
    moon = load_trace(mooncake)
    assert (moon.attrs["format"], moon["arrival_s"].iloc[0]) == ("mooncake", 1.5)
    azure_trace = load_trace(azure)
    assert azure_trace.attrs["format"] == "azure"
    assert azure_trace["arrival_s"].tolist() == pytest.approx([0.0, 4.314579])
    assert azure_trace["prompt_tokens"].tolist() == [374, 396]
    assert load_trace(lengths).attrs["format"] == "lengths"


def test_vidur_extra_columns_are_ignored(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n3,4,7,0.75\n")
    assert load_trace(path).columns.tolist() == ["request_id", "arrival_s", "prompt_tokens",
                                                 "output_tokens"]


def test_explicit_format_overrides_detection(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n3,4\n")
    assert load_trace(path, format="lengths")["prompt_tokens"].tolist() == [3]
    with pytest.raises(ValueError, match="format='csv' is unknown"):
        load_trace(path, format="csv")


def test_every_format_is_one_schema_entry_with_its_converter():
    names = tuple(schema.name for schema in SCHEMAS)
    assert names == FORMAT_NAMES[1:] and FORMAT_NAMES[0] == "auto"
    assert all(callable(schema.convert) for schema in SCHEMAS)


def test_load_trace_converts_through_the_entry_of_the_format(tmp_path, monkeypatch):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n3,4\n")
    calls = []

    def spy(raw, locator, options):
        calls.append((tuple(raw.columns), locator.container, options))
        return formats.from_lengths(raw, locator, options)

    entry = dataclasses.replace(formats.LENGTHS_SCHEMA, convert=spy)
    monkeypatch.setitem(formats.SCHEMAS_BY_NAME, "lengths", entry)
    frame = load_trace(path, format="lengths", tokenizer="some/tokenizer")
    assert calls == [(("prompt_tokens", "output_tokens"), "csv",
                      ReadOptions("some/tokenizer", None))]
    assert frame.attrs["format"] == "lengths" and frame["output_tokens"].tolist() == [4]


def _sharegpt_records() -> list[dict]:
    return [
        {"id": "a", "conversations": [{"from": "human", "value": "Hello there, how are you?"},
                                      {"from": "gpt", "value": "Fine, thanks."}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "I start."}]},
        {"id": "c", "conversations": [{"from": "system", "value": "Be terse."},
                                      {"from": "human", "value": "Name a colour."},
                                      {"from": "gpt", "value": "Blue."},
                                      {"from": "human", "value": "Another?"}]},
    ]


def test_sharegpt_uses_first_human_turn_and_the_gpt_answer(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(_sharegpt_records()))
    trace = load_trace(path)
    assert trace.attrs["format"] == "sharegpt"
    assert trace["request_id"].tolist() == [0, 2]
    assert trace.attrs["num_skipped"] == 1
    assert (trace["prompt_tokens"] > 0).all() and (trace["output_tokens"] > 0).all()
    assert trace["arrival_s"].isna().all()


def test_alpaca_prompt_joins_instruction_and_input(tmp_path):
    from kvbench.workloads.tokenizer import count_tokens, load_tokenizer

    records = [{"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
               {"instruction": "Say hi.", "input": "", "output": "Hi!"}]
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(records))
    trace = load_trace(path)
    expected = count_tokens(["Add the numbers.\n2 and 3", "Say hi."], load_tokenizer())
    assert trace["prompt_tokens"].tolist() == expected.tolist()


def test_alpaca_csv_texts_are_tokenized_as_written(tmp_path):
    from kvbench.workloads.tokenizer import count_tokens, load_tokenizer

    # pandas would read "None", "NULL" and "N/A" as missing and "007", "1e3", "1.50" as numbers
    # ("7", "1000.0", "1.5"), and multi-line text is one record.
    path = tmp_path / "alpaca.csv"
    path.write_text('instruction,input,output\nNone,,N/A\nNULL,,007\n1e3,"x\ny",1.50\n')
    trace = load_trace(path)
    tokenizer = load_tokenizer()
    assert trace["prompt_tokens"].tolist() == count_tokens(["None", "NULL", "1e3\nx\ny"],
                                                           tokenizer).tolist()
    assert trace["output_tokens"].tolist() == count_tokens(["N/A", "007", "1.50"],
                                                           tokenizer).tolist()
    assert (trace["prompt_tokens"] > 0).all()


def test_hub_id_goes_to_datasets_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(path, data_files=None, split=None):
        calls.append((path, data_files, split))
        return datasets.Dataset.from_dict({"prompt_tokens": [5, 6], "output_tokens": [7, 8]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(raw_reading, "check_hub_id", lambda *args: None)  # no hub asked here
    trace = load_trace("someone/some-trace/data/lengths.csv")
    assert calls == [("someone/some-trace", "data/lengths.csv", "train")]
    assert trace["output_tokens"].tolist() == [7, 8]


def test_missing_local_file_that_is_no_hub_id(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "nowhere" / "trace.csv")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").mkdir()
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        load_trace("traces/typo.csv")  # a local folder, so not a hub dataset id


def test_parquet_round_trip_keeps_columns_dtypes_and_attrs(tmp_path):
    trace = pd.DataFrame({
        "request_id": np.array([4, 9, 2], dtype="int64"),
        "arrival_s": [0.0, 0.25, 1.5],
        "prompt_tokens": np.array([600, 30, 1030], dtype="int64"),
        "output_tokens": np.array([3, 0, 12], dtype="int64"),
        "prefix_group": pd.array([0, None, 0], dtype="Int64"),
        "prefix_tokens": np.array([512, 0, 512], dtype="int64"),
        "prefix_block_hashes": [[1, 2], [3], [1, 2, 5]],
    })
    trace.attrs["hash_block_tokens"] = 512
    path = save_trace(trace, tmp_path / "trace.kvb")
    loaded = load_trace(path)
    assert loaded.attrs["format"] == "parquet"
    assert loaded.attrs["hash_block_tokens"] == 512
    pd.testing.assert_frame_equal(loaded, trace)


def test_parquet_round_trip_of_a_real_trace(traces_dir, tmp_path):
    trace = load_trace(traces_dir / "mooncake/conversation_trace.jsonl")
    loaded = load_trace(save_trace(trace, tmp_path / "mooncake.parquet"))
    pd.testing.assert_frame_equal(loaded, trace)
    assert loaded.attrs["hash_block_tokens"] == 512


def test_parquet_without_arrivals_round_trips_nan(tmp_path):
    trace = load_trace(save_trace(
        pd.DataFrame({"request_id": [0], "arrival_s": [float("nan")], "prompt_tokens": [1],
                      "output_tokens": [2]}), tmp_path / "t.parquet"))
    assert trace["arrival_s"].isna().all()
    assert "hash_block_tokens" not in trace.attrs


def test_a_workload_s_samples_and_beams_are_not_a_trace_s_columns(tmp_path):
    # save_trace writes only what load_trace reads back: n and beams are the workload config's.
    workload = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 0.5],
                             "prompt_tokens": [10, 20], "output_tokens": [5, 6],
                             "num_samples": [2, 2]})  # fmt: skip
    loaded = load_trace(save_trace(workload, tmp_path / "w.parquet"))
    assert "num_samples" not in loaded.columns
    pd.testing.assert_frame_equal(loaded, workload.drop(columns="num_samples"))
