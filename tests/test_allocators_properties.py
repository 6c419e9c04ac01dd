"""Property tests every allocator must pass, driven by random admit/append/fork/free sequences
and beam-search steps (fork the new beams, free the parent, append to each beam).

The machine keeps its own model: each live sequence's request and token ids, and a simulated
physical KV store keyed by slot (``block * block_size + offset``) that the harness writes the way
an executor would (copies from ``take_copy_on_writes`` first, then the new tokens). After every
step it checks that each sequence reads back exactly its own tokens through its block table, that
nothing was written into a block another sequence references, that ref counts match the block
tables, and that ``usage()`` equals a from-scratch recount.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvbench.allocators import ALLOCATOR_NAMES, MemoryUsage, make_allocator
from kvbench.allocators.buddy import arena_roots
from kvbench.core.request import Request

CONTIGUOUS_NAMES = ("naive_max", "naive_pow2", "naive_oracle")

Token = tuple[object, ...]

prefix_identities = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"prefix_group": st.integers(0, 1), "prefix_tokens": st.integers(0, 48)}),
    st.fixed_dictionaries(
        {
            "prefix_block_hashes": st.lists(st.integers(1, 3), max_size=6).map(tuple),
            "hash_block_tokens": st.sampled_from([3, 4, 8]),
        }
    ),
)


def _power_of_two_at_least(value: int) -> int:
    power = 1
    while power < value:
        power *= 2
    return power


def _requested_slots(name: str, request: Request, max_model_len: int) -> int:
    """What each naive policy reserves, restated independently of the allocators."""
    if name == "naive_max":
        return max_model_len
    output_tokens = request.output_tokens
    if name == "naive_pow2" and output_tokens > 0:
        output_tokens = _power_of_two_at_least(output_tokens)
    return min(request.prompt_tokens + output_tokens, max_model_len)


def _prompt_token(request: Request, position: int) -> Token | None:
    """The token at ``position`` when the request's prefix identity fixes it, else None."""
    trace_hashes = request.prefix_block_hashes
    hash_tokens = request.hash_block_tokens
    if trace_hashes:
        if position < min(request.prompt_tokens, len(trace_hashes) * hash_tokens):
            return ("hash", trace_hashes[position // hash_tokens], position % hash_tokens)
    elif request.prefix_group is not None and position < min(
        request.prefix_tokens, request.prompt_tokens
    ):
        return ("group", request.prefix_group, position)
    return None


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self, allocator_name: str) -> None:
        super().__init__()
        self.name = allocator_name
        self.is_contiguous = allocator_name in CONTIGUOUS_NAMES
        self.requests: dict[int, Request] = {}
        self.tokens: dict[int, list[Token]] = {}
        self.requested: dict[int, int] = {}  # contiguous: policy slots at admission
        self.store: dict[int, Token] = {}
        self.next_id = 0

    @initialize(
        num_slots=st.integers(0, 160),
        block_size=st.sampled_from([1, 2, 3, 4, 8]),
        max_model_len=st.integers(1, 48),
    )
    def setup(self, num_slots: int, block_size: int, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.allocator = make_allocator(self.name, num_slots, block_size, max_model_len)
        self.block_size = self.allocator.block_size

    # --- helpers ---------------------------------------------------------------------------

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _token_for(self, seq_id: int, position: int) -> Token:
        known = _prompt_token(self.requests[seq_id], position)
        return known if known is not None else ("unique", self._new_id())

    def _slot(self, table: tuple[int, ...], position: int) -> int:
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def _reference_counts(self) -> Counter[int]:
        return Counter(
            block for seq_id in self.tokens for block in self.allocator.block_table(seq_id)
        )

    def _snapshot(self) -> tuple[object, ...]:
        tables = {
            seq_id: (self.allocator.block_table(seq_id), self.allocator.num_tokens(seq_id))
            for seq_id in self.tokens
        }
        return self.allocator.usage(), tables

    def _write(self, seq_id: int, first_position: int) -> None:
        """Write the sequence's tokens from ``first_position`` on, as an executor would."""
        table = self.allocator.block_table(seq_id)
        reference_counts = self._reference_counts()
        for position in range(first_position, len(self.tokens[seq_id])):
            block = table[position // self.block_size]
            assert reference_counts[block] == 1, f"write into block {block} shared by others"
            self.store[self._slot(table, position)] = self.tokens[seq_id][position]

    def _apply_copies(self) -> None:
        reference_counts = self._reference_counts()
        for source, destination in self.allocator.take_copy_on_writes():
            assert reference_counts[destination] == 1
            for offset in range(self.block_size):
                source_slot = source * self.block_size + offset
                destination_slot = destination * self.block_size + offset
                if source_slot in self.store:
                    self.store[destination_slot] = self.store[source_slot]
                else:
                    self.store.pop(destination_slot, None)

    def _pick(self, index: int) -> int:
        return sorted(self.tokens)[index % len(self.tokens)]

    # --- rules -----------------------------------------------------------------------------

    @rule(
        prompt_tokens=st.integers(0, 48),
        output_tokens=st.integers(0, 48),
        num_tokens=st.integers(0, 96),
        identity=prefix_identities,
    )
    def admit(
        self, prompt_tokens: int, output_tokens: int, num_tokens: int, identity: dict
    ) -> None:
        prompt_tokens = min(prompt_tokens, self.max_model_len)
        output_tokens = min(output_tokens, self.max_model_len - prompt_tokens)
        seq_id = self._new_id()
        request = Request(seq_id, 0.0, prompt_tokens, output_tokens, **identity)
        num_tokens = min(num_tokens, request.total_tokens)
        expected = self.allocator.can_admit(request, num_tokens)
        before = self._snapshot()
        admitted = self.allocator.admit(seq_id, request, num_tokens)
        assert admitted == expected
        if not admitted:
            assert self._snapshot() == before
            return
        self.requests[seq_id] = request
        self.requested[seq_id] = max(
            _requested_slots(self.name, request, self.max_model_len), num_tokens
        )
        self.tokens[seq_id] = [self._token_for(seq_id, position) for position in range(num_tokens)]
        prefix_cache = self.allocator.prefix_cache
        cached_tokens = prefix_cache.cached_prefix_tokens(seq_id) if prefix_cache else 0
        assert cached_tokens % self.block_size == 0 and cached_tokens <= num_tokens
        self._write(seq_id, cached_tokens)  # cached blocks already hold these tokens

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 1000), num_tokens=st.integers(0, 5))
    def append(self, index: int, num_tokens: int) -> None:
        self._append(self._pick(index), num_tokens)

    def _append(self, seq_id: int, num_tokens: int) -> None:
        expected = self.allocator.can_append(seq_id, num_tokens)
        before = self._snapshot()
        appended = self.allocator.append(seq_id, num_tokens)
        assert appended == expected
        if not appended:
            assert self._snapshot() == before
            return
        first_position = len(self.tokens[seq_id])
        self.tokens[seq_id] += [
            self._token_for(seq_id, first_position + offset) for offset in range(num_tokens)
        ]
        self._apply_copies()
        self._write(seq_id, first_position)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 1000))
    def fork(self, index: int) -> None:
        self._fork(self._pick(index))

    def _fork(self, parent_id: int) -> int | None:
        child_id = self._new_id()
        before = self._snapshot()
        if not self.allocator.fork(parent_id, child_id):
            assert self._snapshot() == before
            return None
        self.requests[child_id] = self.requests[parent_id]
        self.requested[child_id] = self.requested[parent_id]
        self.tokens[child_id] = list(self.tokens[parent_id])
        self._apply_copies()
        return child_id

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 1000))
    def free(self, index: int) -> None:
        self._free(self._pick(index))

    def _free(self, seq_id: int) -> None:
        self.allocator.free(seq_id)
        del self.tokens[seq_id]

    @precondition(lambda self: self.tokens)
    @rule(
        index=st.integers(0, 1000),
        num_children=st.integers(0, 3),
        num_tokens=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    )
    def beam_step(self, index: int, num_children: int, num_tokens: list[int]) -> None:
        """Beam search's step (as the engine replays recorded ancestry): the beam forks the new
        beams that extend it, is freed (0 children: pruned), and each new beam appends its next
        tokens, so a partial last block shared only by the new beams is copied on write while
        the parent's blocks live on in its children alone. Applied again to a child, it is a
        chain of forks and frees along one lineage."""
        parent_id = self._pick(index)
        children = [self._fork(parent_id) for _ in range(num_children)]
        self._free(parent_id)
        self.sequences_read_their_own_tokens()  # the children read the parent's tokens
        self.tables_are_well_formed()  # the parent's references are gone, the children's remain
        for child_id, count in zip(children, num_tokens, strict=False):
            if child_id is not None:
                self._append(child_id, count)

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def sequences_read_their_own_tokens(self) -> None:
        for seq_id, tokens in self.tokens.items():
            assert self.allocator.num_tokens(seq_id) == len(tokens)
            table = self.allocator.block_table(seq_id)
            assert [self.store.get(self._slot(table, p)) for p in range(len(tokens))] == tokens

    @invariant()
    def usage_matches_a_recount(self) -> None:
        expected = self._contiguous_usage() if self.is_contiguous else self._paged_usage()
        assert self.allocator.usage() == expected

    @invariant()
    def tables_are_well_formed(self) -> None:
        if self.is_contiguous:
            self._check_extents()
        else:
            self._check_block_tables()

    def _check_extents(self) -> None:
        occupied: set[int] = set()
        for seq_id in self.tokens:
            start_slot, num_slots = self.allocator.extent(seq_id)
            assert num_slots == _power_of_two_at_least(self.requested[seq_id])
            assert start_slot % num_slots == 0
            slots = set(range(start_slot, start_slot + num_slots))
            assert self.allocator.block_table(seq_id) == tuple(sorted(slots))
            assert not slots & occupied
            occupied |= slots

    def _check_block_tables(self) -> None:
        reference_counts = self._reference_counts()
        num_blocks = self.allocator.num_slots // self.block_size
        for block in range(num_blocks):
            assert self.allocator.ref_count(block) == reference_counts[block]
        for seq_id, tokens in self.tokens.items():
            num_table_blocks = len(self.allocator.block_table(seq_id))
            assert num_table_blocks == -(-len(tokens) // self.block_size)

    def _final_tokens(self, seq_id: int) -> int:
        true_final = min(self.requests[seq_id].total_tokens, self.max_model_len)
        return max(true_final, len(self.tokens[seq_id]))

    def _contiguous_usage(self) -> MemoryUsage:
        parts = Counter[str]()
        for seq_id, tokens in self.tokens.items():
            num_tokens = len(tokens)
            used_slots = max(self.requested[seq_id], num_tokens)
            will_hold = min(used_slots, self._final_tokens(seq_id))
            parts["token_states"] += num_tokens
            parts["reservation"] += will_hold - num_tokens
            parts["internal_frag"] += used_slots - will_hold
            parts["external_frag"] += self.allocator.extent(seq_id)[1] - used_slots
            parts["held"] += self.allocator.extent(seq_id)[1]
        unusable_slots = 0
        if self.name == "naive_max":
            largest_block = _power_of_two_at_least(self.max_model_len)
            roots = arena_roots(self.allocator.num_slots, largest_block)
            unusable_slots = sum(size for _, size in roots if size < largest_block)
        return MemoryUsage(
            num_slots=self.allocator.num_slots,
            token_states=parts["token_states"],
            reservation=parts["reservation"],
            internal_frag=parts["internal_frag"],
            external_frag=parts["external_frag"] + unusable_slots,
            free=self.allocator.num_slots - parts["held"] - unusable_slots,
        )

    def _paged_usage(self) -> MemoryUsage:
        block_size = self.block_size
        filled: dict[int, int] = {}
        usable: dict[int, int] = {}
        num_logical_blocks = 0
        for seq_id, tokens in self.tokens.items():
            final_tokens = self._final_tokens(seq_id)
            table = self.allocator.block_table(seq_id)
            num_logical_blocks += len(table)
            for index, block in enumerate(table):
                first = index * block_size
                block_filled = min(max(len(tokens) - first, 0), block_size)
                block_usable = min(max(final_tokens - first, 0), block_size)
                filled[block] = max(filled.get(block, 0), block_filled)
                usable[block] = max(usable.get(block, 0), block_usable)
        num_held = len(filled)
        num_blocks = self.allocator.num_slots // block_size
        num_shared = sum(1 for count in self._reference_counts().values() if count > 1)
        return MemoryUsage(
            num_slots=self.allocator.num_slots,
            token_states=sum(filled.values()),
            reservation=sum(usable.values()) - sum(filled.values()),
            internal_frag=num_held * block_size - sum(usable.values()),
            external_frag=self.allocator.num_slots - num_blocks * block_size,
            free=(num_blocks - num_held) * block_size,
            shared_slots=num_shared * block_size,
            saved_slots=(num_logical_blocks - num_held) * block_size,
        )

    def teardown(self) -> None:
        """Freeing everything gives the whole pool back (and, for buddy, fully merged)."""
        if not hasattr(self, "allocator"):
            return
        for seq_id in list(self.tokens):
            self.allocator.free(seq_id)
        self.tokens.clear()
        usage = self.allocator.usage()
        assert usage.token_states == usage.reservation == usage.internal_frag == 0
        assert usage.shared_slots == usage.saved_slots == 0
        if self.is_contiguous:
            largest_block = _power_of_two_at_least(self.max_model_len)
            roots = arena_roots(self.allocator.num_slots, largest_block)
            assert self.allocator.free_extents() == roots
            assert usage.free + usage.external_frag == self.allocator.num_slots
        else:
            num_blocks = self.allocator.num_slots // self.block_size
            assert usage.free == num_blocks * self.block_size
            assert all(self.allocator.ref_count(block) == 0 for block in range(num_blocks))


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_allocator_invariants_hold_under_random_operations(name: str) -> None:
    run_state_machine_as_test(
        lambda: AllocatorMachine(name),
        settings=settings(
            max_examples=80,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
