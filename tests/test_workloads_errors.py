"""Bad trace files: one TraceError line naming the file, the row and what was expected."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from kvbench.workloads import TraceError, UnsortedTraceWarning, load_trace


def _load_error(path, **kwargs) -> str:
    with pytest.raises(TraceError) as caught:
        load_trace(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


def test_missing_column(tmp_path):
    path = tmp_path / "vidur.csv"
    path.write_text("num_prefill_tokens,arrived_at\n10,0.0\n")
    assert _load_error(path) == (
        f"{path}: line 1: missing column(s) num_decode_tokens (found num_prefill_tokens,"
        f"arrived_at); expected columns num_prefill_tokens,num_decode_tokens[,arrived_at] "
        f"(Vidur/Sarathi CSV)"
    )


def test_non_integer_length(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n5,6\n7,6.5\n8,9\n")
    assert _load_error(path) == (
        f"{path}: line 3: output_tokens = 6.5 is not an integer; expected a non-negative "
        f"integer token count"
    )


def test_non_numeric_length_after_a_blank_line(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n5,6\n\n7,many\n")
    assert _load_error(path) == (
        f"{path}: line 4: output_tokens = 'many' is not an integer; expected a non-negative "
        f"integer token count"
    )


def test_negative_length(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.00,-3,10\n")
    assert _load_error(path) == (
        f"{path}: line 3: ContextTokens = -3 is negative; expected a non-negative integer "
        f"token count"
    )


def test_empty_file(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    assert _load_error(path) == (
        f"{path}: line 1: the file is empty; expected a CSV header line or JSON records"
    )


def test_header_without_rows(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text("prompt_tokens,output_tokens\n")
    assert _load_error(path) == (
        f"{path}: line 2: the file has a header but no data rows; expected one request per "
        f"line after the header"
    )


def test_malformed_json_line(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    good = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n"
                    + '{"timestamp": 9, "input_length": 5, "output_length": 3, "hash_ids": [1\n')
    assert _load_error(path) == (
        f"{path}: line 3: malformed JSON (Expecting ',' delimiter at column 71); expected one "
        f"JSON object per line"
    )


def test_malformed_first_json_line(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600\n')
    assert "line 1: malformed JSON" in _load_error(path)


def test_malformed_json_list(tmp_path):
    path = tmp_path / "alpaca.json"
    path.write_text('[{"instruction": "a", "input": "", "output": "b"},\n'
                    ' {"instruction": "c" "input": ""}]')
    assert _load_error(path) == (
        f"{path}: line 2: malformed JSON (Expecting ',' delimiter at column 22); expected a "
        f"JSON list of objects"
    )


def test_missing_json_field(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3}\n'
                    '{"timestamp": 5, "input_length": 600}\n')
    assert _load_error(path) == (
        f"{path}: line 2: output_length is empty; expected a non-negative integer token count"
    )


def test_unknown_header(tmp_path):
    path = tmp_path / "what.csv"
    path.write_text("a,b\n1,2\n")
    message = _load_error(path)
    assert message.startswith(f"{path}: line 1: columns a,b match no known trace format; "
                              f"expected one of: num_prefill_tokens")


def test_ragged_csv_line(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("prompt_tokens,output_tokens\n1,2\n3,4,5\n")
    assert _load_error(path) == (
        f"{path}: line 3: 3 fields where the header has 2; expected one value per header column"
    )


def test_bad_timestamp(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.68,374,44\nyesterday,3,10\n")
    assert "line 3: TIMESTAMP = 'yesterday' is not a date-time" in _load_error(path)


def test_parquet_format_on_a_csv(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n1,2\n")
    assert "line 1: not a parquet file" in _load_error(path, format="parquet")


def test_unsorted_timestamps_are_sorted_stably_with_a_warning(tmp_path):
    path = tmp_path / "unsorted.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n"
                    "10,1,0.0\n11,1,2.0\n12,1,1.0\n13,1,1.0\n14,1,3.0\n")
    with pytest.warns(UnsortedTraceWarning) as caught:
        trace = load_trace(path)
    assert str(caught[0].message) == (
        f"{path}: line 4: arrival goes back in time (1 row(s) earlier than the row above); rows "
        f"were sorted stably by arrival_s and keep their request_id"
    )
    assert trace["arrival_s"].tolist() == [0.0, 1.0, 1.0, 2.0, 3.0]
    assert trace["request_id"].tolist() == [0, 2, 3, 1, 4]  # ties keep file order
    assert trace["prompt_tokens"].tolist() == [10, 12, 13, 11, 14]


def test_sorted_trace_does_not_warn(tmp_path):
    path = tmp_path / "sorted.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n1,1,0.0\n2,1,0.0\n3,1,1.0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_trace(path)


def test_partially_missing_arrivals(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n1,1,0.0\n2,1,\n")
    assert _load_error(path) == (
        f"{path}: line 3: arrival_s is empty; expected a non-negative time (arrival_s on every "
        f"row)"
    )


def test_trace_error_is_a_value_error():
    assert issubclass(TraceError, ValueError)


def test_a_parquet_string_column_of_bytes_that_are_not_utf8_names_its_row(tmp_path):
    # A parquet file may declare a string column and hold other bytes; pyarrow refuses them only
    # when they are converted (found by tests/test_trace_fuzz.py's ten thousand traces).
    import pyarrow as pa
    import pyarrow.parquet as pq

    instructions = pa.array([b"fine", b"\xff\xfe"], type=pa.binary()).view(pa.string())
    path = tmp_path / "alpaca.parquet"
    pq.write_table(pa.table({"instruction": instructions, "output": ["a", "b"]}), path)
    with pytest.raises(TraceError) as error:
        load_trace(path, format="alpaca")
    assert str(error.value) == (f"{path}: row 2: instruction holds bytes that are not UTF-8 text; "
                                "expected a string")


# --- What pandas would have guessed: values read as written, rows as the file lays them out ---


def test_a_trailing_comma_on_every_row_keeps_each_value_in_its_column(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n10,5,0,\n20,6,1,\n30,7,2,\n")
    trace = load_trace(path)
    # pandas reads such rows with the first value as the index, every value one column left.
    assert trace["prompt_tokens"].tolist() == [10, 20, 30]
    assert trace["output_tokens"].tolist() == [5, 6, 7]
    assert trace["arrival_s"].tolist() == [0.0, 1.0, 2.0]


_COUNTS_EXPECTED = "expected a non-negative integer token count"
CSV_ERRORS = [
    # A value past the header on every row, or on one: pandas would shift the row or drop it.
    ("prompt_tokens,output_tokens\n10,5,99\n20,6,98\n",
     "line 2: 3 fields where the header has 2; expected one value per header column"),
    ("prompt_tokens,output_tokens\n10,5,\n20,6,7\n",
     "line 3: 3 fields where the header has 2; expected one value per header column"),
    # A quoted line break: the bad record's own first line, not the line count before it.
    ('prompt_tokens,output_tokens,note\n10,5,"a\nb"\n20,6,x\n-1,7,y\n',
     f"line 5: prompt_tokens = -1 is negative; {_COUNTS_EXPECTED}"),
    # pandas' missing-value words are named as written, not as an empty cell.
    *((f"prompt_tokens,output_tokens\n10,5\n11,{word}\n",
       f"line 3: output_tokens = {word!r} is not an integer; {_COUNTS_EXPECTED}")
      for word in ("nan", "NA", "None", "null")),
    ("request_id,prompt_tokens,output_tokens\n-1,3,4\n",
     "line 2: request_id = -1 is negative; expected a non-negative integer request id"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), CSV_ERRORS)
def test_a_csv_value_is_named_where_and_as_it_is_written(tmp_path, text, message):
    path = tmp_path / "lengths.csv"
    path.write_text(text)
    assert _load_error(path) == f"{path}: {message}"


def test_block_hashes_without_the_tokens_each_covers(tmp_path):
    path = tmp_path / "hashes.jsonl"
    path.write_text('{"prompt_tokens": 10, "output_tokens": 5, "prefix_block_hashes": []}\n'
                    '{"prompt_tokens": 10, "output_tokens": 5, "prefix_block_hashes": [1, 2]}\n')
    message = _load_error(path)
    assert message.startswith(f"{path}: line 2: prefix_block_hashes without the tokens each hash "
                              "covers")
    assert "expected a parquet file written by kvbench.workloads.save_trace" in message


@pytest.mark.parametrize("kind", ["fifo", "broken link"])
def test_a_path_that_holds_no_regular_file(tmp_path, kind):
    path = tmp_path / "trace.csv"
    if kind == "fifo":
        os.mkfifo(path)
        problem = "not a regular file (a pipe, a device or a socket); expected a trace file"
    else:
        path.symlink_to(tmp_path / "gone.csv")
        problem = "a symbolic link whose target is missing"
    with pytest.raises(OSError) as caught:
        load_trace(path)  # a fifo with no writer would block a reader: it must not be opened
    assert str(caught.value).startswith(f"{path}: {problem}")
    assert not isinstance(caught.value, FileNotFoundError)
