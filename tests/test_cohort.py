"""The allocators' cohort (lazy rounds) against single appends, operation by operation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.allocators import CohortAllocator, PagedAllocator, make_allocator
from kvbench.core.request import Request

MAX_LEN = 256
COHORT_ALLOCATORS = ["paged", "paged_prefix", "naive_max", "naive_pow2", "naive_oracle"]


def _assert_same_state(lazy, single, seq_ids: list[int]) -> None:
    assert lazy.usage() == single.usage()
    for seq_id in seq_ids:
        assert lazy.block_table(seq_id) == single.block_table(seq_id)
        assert lazy.num_tokens(seq_id) == single.num_tokens(seq_id)


@pytest.mark.parametrize("allocator_name", COHORT_ALLOCATORS)
@settings(max_examples=60, deadline=None)
@given(
    block_size=st.sampled_from([1, 3, 16]),
    num_blocks=st.integers(20, 400),
    data=st.data(),
)
def test_cohort_rounds_leave_the_state_of_single_appends(
    allocator_name, block_size, num_blocks, data
):
    lazy = make_allocator(allocator_name, num_blocks * block_size, block_size, MAX_LEN)
    single = make_allocator(allocator_name, num_blocks * block_size, block_size, MAX_LEN)
    block_size = lazy.block_size  # 1 for the contiguous allocators
    final_tokens: dict[int, int] = {}
    live: list[int] = []  # every sequence, admitted order
    members: list[int] = []  # the cohort, in join order
    next_id = 0
    for _ in range(data.draw(st.integers(1, 30), label="operations")):
        operation = data.draw(st.sampled_from(["admit", "advance", "advance", "leave", "free"]))
        if operation == "admit":
            prompt = data.draw(st.integers(1, 60), label="prompt")
            request = Request(next_id, 0.0, prompt, data.draw(st.integers(1, 80), label="out"))
            if lazy.admit(next_id, request, prompt + 1):
                assert single.admit(next_id, request, prompt + 1)
                live.append(next_id)
                final_tokens[next_id] = request.total_tokens
                if data.draw(st.booleans(), label="join"):
                    assert lazy.join_cohort([next_id])
                    members.append(next_id)
            next_id += 1
        elif operation == "advance" and members:
            # Within every member's final length and the pool's free blocks.
            room = min(final_tokens[i] - lazy.num_tokens(i) for i in members)
            rounds = lazy.cohort_rounds()
            before = lazy.usage()
            num_rounds = taken = 0
            frag = before.internal_frag
            for _ in range(min(room, data.draw(st.integers(1, 40), label="rounds"))):
                needed = rounds.new_blocks[num_rounds % len(rounds.new_blocks)]
                if taken + needed > lazy.num_free_blocks():
                    break
                taken += needed
                for seq_id in members:
                    assert single.append(seq_id, 1)
                num_rounds += 1
                # The cohort's description predicts every round's usage.
                frag += rounds.internal_frag_slots.get(rounds.first_round + num_rounds - 1, 0)
                usage = single.usage()
                assert usage.internal_frag == frag
                assert usage.free == before.free - taken * block_size
                assert usage.token_states == before.token_states + num_rounds * len(members)
            lazy.advance_cohort(num_rounds)
        elif operation == "leave" and members:
            seq_id = data.draw(st.sampled_from(members), label="leaver")
            lazy.leave_cohort([seq_id])
            members.remove(seq_id)
        elif operation == "free" and live:
            seq_id = data.draw(st.sampled_from(live), label="freed")
            lazy.free(seq_id)  # a member leaves the cohort on its own
            single.free(seq_id)
            live.remove(seq_id)
            if seq_id in members:
                members.remove(seq_id)
        _assert_same_state(lazy, single, live)
    lazy.leave_cohort(members)
    _assert_same_state(lazy, single, live)


def test_a_member_joins_a_stretch_after_the_others():
    """Blocks go out round by round, earlier members first within a round."""
    allocator = PagedAllocator(1_000, 4, MAX_LEN)
    for seq_id, prompt in enumerate([4, 8, 3]):
        assert allocator.admit(seq_id, Request(seq_id, 0.0, prompt, 50), prompt)
    assert allocator.join_cohort([1, 0, 2])
    # 1 and 0 are at a block boundary (in join order), 2 gets there a round later.
    assert allocator.cohort_rounds().new_blocks == (2, 1, 0, 0)
    allocator.advance_cohort(2)
    assert allocator.block_table(1) == (1, 2, 4)
    assert allocator.block_table(0) == (0, 5)
    assert allocator.block_table(2) == (3, 6)
    assert [allocator.num_tokens(i) for i in range(3)] == [6, 10, 5]


def test_a_shared_partial_block_keeps_its_sequences_out_of_the_cohort():
    allocator = PagedAllocator(1_000, 16, MAX_LEN)
    assert allocator.admit(0, Request(0, 0.0, 20, 10), 20)
    assert allocator.fork(0, 1)
    assert not allocator.join_cohort([0, 1])  # the next token copies the shared block
    assert allocator.usage() == allocator.usage()  # nothing changed
    assert allocator.append(0, 1)  # copy-on-write
    assert allocator.join_cohort([0, 1])  # the full blocks they share do not matter


def test_members_refuse_appends_and_forks():
    allocator = PagedAllocator(1_000, 16, MAX_LEN)
    assert isinstance(allocator, CohortAllocator)
    assert allocator.admit(0, Request(0, 0.0, 20, 10), 20)
    assert allocator.join_cohort([0])
    with pytest.raises(RuntimeError, match="cohort"):
        allocator.append(0, 1)
    with pytest.raises(RuntimeError, match="cohort"):
        allocator.fork(0, 1)
    with pytest.raises(ValueError, match="already"):
        allocator.join_cohort([0])


def test_paged_prefix_keeps_a_sequence_that_could_fill_a_hashed_block_out():
    allocator = make_allocator("paged_prefix", 1_000, 4, MAX_LEN)
    request = Request(0, 0.0, 12, 10, prefix_group=0, prefix_tokens=12)
    assert allocator.admit(0, request, 6)  # holds 6 of the 12 prompt tokens it hashes
    assert not allocator.join_cohort([0])  # a round would complete (and cache) block 2
    assert allocator.admit(1, Request(1, 0.0, 12, 10, prefix_group=0, prefix_tokens=12), 13)
    assert allocator.join_cohort([1])


@pytest.mark.parametrize("allocator_name", ["naive_max", "naive_pow2", "naive_oracle"])
def test_contiguous_members_refuse_appends_and_forks(allocator_name):
    allocator = make_allocator(allocator_name, 4_096, 1, MAX_LEN)
    assert allocator.admit(0, Request(0, 0.0, 20, 10), 21)
    assert allocator.join_cohort([0])
    allocator.advance_cohort(4)
    assert allocator.num_tokens(0) == 25
    with pytest.raises(RuntimeError, match="cohort"):
        allocator.append(0, 1)
    with pytest.raises(RuntimeError, match="cohort"):
        allocator.fork(0, 1)
    allocator.leave_cohort([0])
    assert allocator.append(0, 1) and allocator.num_tokens(0) == 26
