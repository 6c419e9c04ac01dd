"""A hub id kvbench cannot fetch fails at once, in one line naming the id and the fix: a tokenizer
(workload.tokenizer) or a trace (workload.path=owner/name) on a machine without the hub."""

from __future__ import annotations

import time

import pytest
from huggingface_hub import constants

from kvbench.workloads import TokenizerUnavailableError
from kvbench.workloads.hub import HubUnavailableError, check_hub_id
from kvbench.workloads.raw_reading import read_hub_frame
from kvbench.workloads.tokenizer import NAMED_TOKENIZER_FIX, load_tokenizer

# Nothing listens on port 9 (discard): the connection is refused at once, as on a machine whose
# network is down.
UNREACHABLE_ENDPOINT = "http://127.0.0.1:9"


@pytest.fixture()
def unreachable_hub(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_ENDPOINT)
    load_tokenizer.cache_clear()
    yield
    load_tokenizer.cache_clear()


@pytest.fixture()
def hub_switched_off(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_an_unreachable_hub_is_one_line_at_once(unreachable_hub):
    started_s = time.perf_counter()
    with pytest.raises(HubUnavailableError) as caught:
        check_hub_id("some-org/some-model", "model", "tokenizer", "expected X")
    # Without the probe, the download retries for ~30 s before it gives up.
    assert time.perf_counter() - started_s < 10
    message = str(caught.value)
    assert message.startswith("tokenizer some-org/some-model: not a local path, and the Hugging "
                              "Face hub cannot be reached (")  # fmt: skip
    assert message.endswith("); expected X") and "\n" not in message


def test_a_switched_off_hub_and_a_non_id_are_one_line(hub_switched_off):
    with pytest.raises(HubUnavailableError, match=r"^tokenizer a/b: not a local path, and the "
                       r"Hugging Face hub is switched off \(HF_HUB_OFFLINE=1\) with no cached "
                       r"copy; expected X$"):  # fmt: skip
        check_hub_id("a/b", "model", "tokenizer", "expected X")
    with pytest.raises(HubUnavailableError, match=r"^tokenizer \./tok: no such local path, nor a "
                       r"hub id owner/name; expected X$"):  # fmt: skip
        check_hub_id("./tok", "model", "tokenizer", "expected X")


def test_a_hub_tokenizer_on_an_unreachable_hub_names_it_and_the_fix(unreachable_hub):
    with pytest.raises(TokenizerUnavailableError) as caught:
        load_tokenizer("some-org/some-model")
    message = str(caught.value)
    assert message.startswith("tokenizer some-org/some-model: not a local path, and the Hugging "
                              "Face hub cannot be reached")  # fmt: skip
    assert message.endswith(NAMED_TOKENIZER_FIX) and "\n" not in message


@pytest.mark.parametrize(("make_path", "problem"), [
    (lambda tmp_path: "./no-such-folder", "no such local path, nor a hub id owner/name"),
    (lambda tmp_path: str(tmp_path), "the folder holds no tokenizer transformers can load"),
], ids=["missing folder", "folder without a tokenizer"])  # fmt: skip
def test_a_tokenizer_path_that_holds_none_is_one_line(make_path, problem, tmp_path,
                                                      hub_switched_off):  # fmt: skip
    path = make_path(tmp_path)
    load_tokenizer.cache_clear()
    with pytest.raises(TokenizerUnavailableError) as caught:
        load_tokenizer(path)
    assert str(caught.value) == f"tokenizer {path}: {problem}; {NAMED_TOKENIZER_FIX}"


def test_a_hub_dataset_on_an_unreachable_hub_names_it_and_the_fix(unreachable_hub):
    with pytest.raises(HubUnavailableError) as caught:
        read_hub_frame("some-org/some-dataset/data.csv")
    message = str(caught.value)
    assert message.startswith("trace some-org/some-dataset: not a local path, and the Hugging "
                              "Face hub cannot be reached")  # fmt: skip
    assert message.endswith("; expected a local trace file (workload.path=FILE), or "
                            "HF_HUB_OFFLINE=1 to read the Hugging Face cache's copy")
