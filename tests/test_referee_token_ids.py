"""The referee's token ids carry kvbench's prefix identity: vLLM's block hashes over them agree
with kvbench's ``prompt_block_hashes`` on which blocks are shared (no vLLM needed)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.allocators.prefix_hashes import prompt_block_hashes
from kvbench.core.request import Request
from kvbench.referee.token_ids import OWN_ID_BASE, own_token_id, prompt_token_ids


@st.composite
def prefixed_requests(draw: st.DrawFn, request_id: int, hash_block_tokens: int) -> Request:
    prompt_tokens = draw(st.integers(1, 96))
    kind = draw(st.sampled_from(["none", "group", "hashes"]))
    if kind == "group":
        return Request(request_id, 0.0, prompt_tokens, 1, prefix_group=draw(st.integers(0, 2)),
                       prefix_tokens=draw(st.integers(0, 96)))  # fmt: skip
    if kind == "hashes":
        hashes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=8))
        return Request(request_id, 0.0, prompt_tokens, 1, prefix_block_hashes=tuple(hashes),
                       hash_block_tokens=hash_block_tokens)  # fmt: skip
    return Request(request_id, 0.0, prompt_tokens, 1)


@st.composite
def request_pairs(draw: st.DrawFn) -> tuple[Request, Request]:
    # One trace: its hash blocks have one size for every request.
    hash_block_tokens = draw(st.sampled_from([1, 4, 16, 24]))
    return (
        draw(prefixed_requests(0, hash_block_tokens)),
        draw(prefixed_requests(1, hash_block_tokens)),
    )


@settings(max_examples=300, deadline=None)
@given(pair=request_pairs(), block_size=st.sampled_from([1, 2, 4, 16, 32]))
def test_equal_token_prefixes_are_exactly_kvbench_equal_block_hashes(
    pair: tuple[Request, Request], block_size: int
) -> None:
    first, second = pair
    first_ids, second_ids = prompt_token_ids(first, 0), prompt_token_ids(second, 1)
    first_hashes = prompt_block_hashes(first, block_size)
    second_hashes = prompt_block_hashes(second, block_size)
    num_full_blocks = min(first.prompt_tokens, second.prompt_tokens) // block_size
    for block in range(num_full_blocks):
        end = (block + 1) * block_size
        # vLLM's block hash chains over every token up to the block's end.
        vllm_equal = first_ids[:end] == second_ids[:end]
        kvbench_equal = (
            block < min(len(first_hashes), len(second_hashes))
            and first_hashes[block] == second_hashes[block]
        )
        assert vllm_equal == kvbench_equal, (block, first, second)


def test_a_prompt_has_its_length_and_unknown_tokens_are_the_requests_own() -> None:
    request = Request(7, 0.0, 40, 5, prefix_group=3, prefix_tokens=32)
    ids = prompt_token_ids(request, 7)
    assert len(ids) == 40
    assert all(token < OWN_ID_BASE for token in ids[:32])
    assert ids[32:] == [own_token_id(7)] * 8
    assert prompt_token_ids(Request(8, 0.0, 40, 5), 8) == [own_token_id(8)] * 40


def test_ids_stay_in_int32_and_indices_out_of_range_are_refused() -> None:
    assert own_token_id(2**30 - 1) < 2**31
    with pytest.raises(ValueError, match="outside"):
        own_token_id(2**30)
