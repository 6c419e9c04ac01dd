"""SGLang's RadixAttention cache: a radix tree of cached prefixes over a pool of pages.

Every token a request's prefix identity names (``prefix_group`` positions, or a trace hash and
the offset in its hash block, as ``referee.token_ids`` numbers them) is a token the tree can
match; two requests agree on a token exactly when their identities do. An edge of the tree holds
a run of tokens and the pages that store them (``page_tokens`` tokens a page: 1, SGLang's
default, matches token by token; more matches whole pages only, like SGLang's paged radix cache).

- Admission walks the tree from the root as far as the request's known prompt matches (split-
  ting an edge where the match ends inside it), references every node on that path (a node in
  use by a running sequence is never evicted), and inserts the rest of its known prompt as a new
  leaf: later requests hit it at once, as the block-hash cache's admitted blocks are hit.
- A sequence's other tokens (its unknown prompt tail and what it generates) live in pages of its
  own. When it ends, its full own pages stay in the tree as an unmatched leaf (SGLang caches a
  finished request's tokens whole); nothing can hit them, but they hold memory until evicted.
- Eviction frees least recently used leaves that no running sequence references, one at a time,
  so a parent goes only after its children (LRU leaf eviction).

With a CPU tier (``cpu_cache_pages`` > 0, SGLang's HiCache host tier, vLLM's CPU offloading), an
evicted leaf of known tokens moves to CPU memory instead of leaving the tree (its node stays, with
no GPU pages); the CPU tier drops its own least recently used leaves when full. An admission whose
GPU match ends where CPU nodes continue it loads them back into fresh pages (they leave the CPU
tier: the tiers are exclusive), and the engine prices the copy over PCIe
(``loaded_prefix_tokens``).

Cached pages nobody references count as free in ``usage()`` (the pool takes them back on
demand), as ``paged_prefix`` counts its cached free blocks. Forks copy the parent's own pages
(the tree path is shared), like a contiguous allocator's fork.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import count

from kvbench.allocators.base import CohortRounds, MemoryUsage, check_token_count
from kvbench.allocators.cohort import Cohort
from kvbench.core.request import Request

# A run of tokens: (stream, offset of its first token in the stream, number of tokens). Tokens
# are equal when their streams and offsets are; a stream is a trace hash block or a prefix group
# (an int) or one finished sequence's own tokens (a tuple, equal to nothing else).
Run = tuple[object, int, int]
_TRACE_HASH_TAG = 1
_PREFIX_GROUP_TAG = 2


def known_token_runs(request: Request) -> list[Run]:
    """The runs of the request's leading prompt tokens that its prefix identity names."""
    if request.prefix_block_hashes:
        hash_block_tokens = request.hash_block_tokens
        if hash_block_tokens < 1:
            raise ValueError(
                f"request {request.request_id} has prefix_block_hashes but "
                f"hash_block_tokens={hash_block_tokens}"
            )
        known_tokens = min(
            request.prompt_tokens, len(request.prefix_block_hashes) * hash_block_tokens
        )
        runs: list[Run] = []
        for index, trace_hash in enumerate(request.prefix_block_hashes):
            first_token = index * hash_block_tokens
            if first_token >= known_tokens:
                break
            num_tokens = min(hash_block_tokens, known_tokens - first_token)
            runs.append((hash((_TRACE_HASH_TAG, trace_hash)), 0, num_tokens))
        return runs
    if request.prefix_group is not None:
        known_tokens = min(request.prefix_tokens, request.prompt_tokens)
        if known_tokens > 0:
            return [(hash((_PREFIX_GROUP_TAG, request.prefix_group)), 0, known_tokens)]
    return []


def slice_runs(runs: list[Run], start: int, end: int) -> list[Run]:
    """The tokens ``[start, end)`` of ``runs``, as runs."""
    sliced: list[Run] = []
    position = 0
    for stream, offset, num_tokens in runs:
        run_end = position + num_tokens
        if run_end > start and position < end:
            first = max(start, position)
            sliced.append((stream, offset + first - position, min(end, run_end) - first))
        position = run_end
        if position >= end:
            break
    return sliced


def common_prefix_tokens(first: list[Run], second: list[Run]) -> int:
    """How many leading tokens the two runs agree on."""
    i = j = 0
    used_i = used_j = 0  # tokens of first[i] / second[j] already compared
    matched = 0
    while i < len(first) and j < len(second):
        stream_i, offset_i, tokens_i = first[i]
        stream_j, offset_j, tokens_j = second[j]
        if stream_i != stream_j or offset_i + used_i != offset_j + used_j:
            break
        step = min(tokens_i - used_i, tokens_j - used_j)
        matched += step
        used_i += step
        used_j += step
        if used_i == tokens_i:
            i, used_i = i + 1, 0
        if used_j == tokens_j:
            j, used_j = j + 1, 0
    return matched


def _page_key(runs: list[Run], start: int, page_tokens: int) -> tuple[Run, ...]:
    """What the page of tokens ``[start, start + page_tokens)`` holds: a child's key."""
    return tuple(slice_runs(runs, start, start + page_tokens))


@dataclass(eq=False, slots=True)  # identity: sequences and the eviction heap point at nodes
class _Node:
    """An edge of the tree: its tokens, the pages that hold them, who uses them."""

    runs: list[Run]
    num_tokens: int
    pages: list[int]
    parent: _Node | None
    children: dict[tuple[Run, ...], _Node] = field(default_factory=dict)
    ref_count: int = 0  # running sequences whose path goes through this node
    last_access: int = 0  # the allocator's clock when a sequence last took or left it
    in_tree: bool = True
    on_cpu: bool = False  # in the CPU tier: no GPU pages (its children are on the CPU too)
    matchable: bool = True  # False for a finished sequence's own tokens: nothing can hit them


@dataclass(slots=True, eq=False)  # identity: the cohort finds members by it
class _RadixSequence:
    """A sequence: its path in the tree (``node`` and above) and the pages of its own after it."""

    request: Request
    final_tokens: int  # the request's true final length, capped at max_model_len
    num_tokens: int
    node: _Node  # the deepest node of its path (the root when it has none)
    path_tokens: int  # tokens its path covers (a multiple of page_tokens)
    cached_tokens: int  # of those, tokens it found in the tree at admission
    blocks: list[int]  # its own pages (the cohort appends here)
    loaded_tokens: int = 0  # of the cached ones, those loaded from the CPU tier
    cohort_offset: int | None = None


class RadixAllocator:
    """A radix tree of cached prefixes over ``num_slots // page_tokens`` pages.

    Attributes:
        num_hit_tokens: known prompt tokens admissions found in the tree.
        num_evicted_pages: cached pages the pool took back for other content.
        num_cpu_hit_tokens: of the hit tokens, those loaded back from the CPU tier.
    """

    name = "radix"
    forks_share_blocks = False  # a fork copies the parent's own pages (it may fail)

    def __init__(
        self, num_slots: int, max_model_len: int, *, page_tokens: int = 1, cpu_cache_pages: int = 0
    ) -> None:
        if page_tokens < 1:
            raise ValueError(f"page_tokens={page_tokens}: must be >= 1")
        if cpu_cache_pages < 0:
            raise ValueError(f"cpu_cache_pages={cpu_cache_pages}: must be >= 0")
        if num_slots < 0:
            raise ValueError(f"num_slots={num_slots}: must be >= 0")
        self.num_slots = num_slots
        self.block_size = page_tokens  # a block-table entry is a page
        self.max_model_len = max_model_len
        self.num_pages = num_slots // page_tokens
        self.num_hit_tokens = 0
        self.num_evicted_pages = 0
        self.cpu_cache_pages = cpu_cache_pages
        self.num_cpu_hit_tokens = 0
        self._num_cpu_pages = 0
        self._cpu_leaves: list[tuple[int, int, _Node]] = []  # (last access, tie, node)
        self._root = _Node(runs=[], num_tokens=0, pages=[], parent=None)
        self._root.ref_count = 1  # never evicted
        # Freed pages, reused last in first out; then pages never used, by id (a counter: an
        # unbounded pool costs nothing until used).
        self._free_pages: list[int] = []
        self._next_fresh_page = 0
        self._num_evictable_pages = 0  # pages of cached nodes no sequence references
        self._num_held_tree_pages = 0  # pages of nodes some running sequence references
        self._num_shared_tree_pages = 0  # of those, referenced by more than one
        self._num_own_pages = 0
        self._num_logical_pages = 0  # block-table entries over all sequences
        self._sequences: dict[int, _RadixSequence] = {}
        self._evictable_leaves: list[tuple[int, int, _Node]] = []  # (last access, tie, node)
        self._clock = count(1)
        self._tie = count()
        self._unique_streams = count()
        self._copies: list[tuple[int, int]] = []
        # Partially filled last own pages (sequences outside the cohort): page -> (filled slots,
        # slots the request will fill), as PagedAllocator tracks them.
        self._partial_pages: dict[int, tuple[int, int]] = {}
        self._partial_filled_slots = 0
        self._partial_usable_slots = 0
        self._cohort = Cohort(page_tokens, self._allocate_pages)
        self._last_runs: tuple[Request, list[Run]] | None = None

    # --- the prefix-cache view the engine reads ---------------------------------------------

    @property
    def prefix_cache(self) -> RadixAllocator:
        """The allocator is its own prefix cache (``cached_prefix_tokens``, ``match_tokens``)."""
        return self

    def cached_prefix_tokens(self, seq_id: int) -> int:
        """Leading tokens the sequence found in the tree at admission (0 for a fork)."""
        return self._sequences[seq_id].cached_tokens

    def loaded_prefix_tokens(self, seq_id: int) -> int:
        """Of ``cached_prefix_tokens``, those loaded from the CPU tier at admission."""
        return self._sequences[seq_id].loaded_tokens

    def match_tokens(self, request: Request, num_tokens: int) -> int:
        """Leading tokens of a sequence of ``num_tokens`` tokens of ``request`` the tree holds
        now (whole pages), without changing anything."""
        runs = self._runs(request)
        limit = self._insert_limit(runs, num_tokens)
        node, child, _, matched = self._match(runs, limit)
        if child is None:
            matched = self._match_cpu(node, runs, matched, limit)[3]
        return matched

    # --- Allocator ---------------------------------------------------------------------------

    def can_admit(self, request: Request, num_tokens: int) -> bool:
        """Whether ``admit`` would succeed now, without changing anything."""
        check_token_count(num_tokens)
        runs = self._runs(request)
        node, child, child_tokens, matched = self._match(runs, self._insert_limit(runs, num_tokens))
        return self._pages_for(num_tokens - matched) <= self._available_pages(
            node, child, child_tokens
        )

    def admit(self, seq_id: int, request: Request, num_tokens: int) -> bool:
        """Reference the tree's longest match of the request's known prompt, insert the rest of
        it, and give the sequence pages of its own for everything after; False if no room."""
        if seq_id in self._sequences:
            raise ValueError(f"sequence {seq_id} is already allocated")
        check_token_count(num_tokens)
        runs = self._runs(request)
        limit = self._insert_limit(runs, num_tokens)
        node, child, child_tokens, matched = self._match(runs, limit)
        num_new_pages = self._pages_for(num_tokens - matched)
        if num_new_pages > self._available_pages(node, child, child_tokens):
            return False
        cpu_nodes: list[_Node] = []
        gpu_matched = matched
        if child is not None:
            node = self._split(child, child_tokens)
        elif self._num_cpu_pages:
            cpu_nodes, cpu_child, cpu_child_tokens, matched = self._match_cpu(
                node, runs, matched, limit
            )
            if cpu_child is not None:
                cpu_nodes.append(self._split(cpu_child, cpu_child_tokens))
        now = next(self._clock)
        self._reference_path(node, now)  # before allocating, so eviction cannot take it
        for cpu_node in cpu_nodes:  # nor drop the CPU nodes it loads
            self._reference(cpu_node)
            cpu_node.last_access = now
            # They leave the tier now: the leaves the allocation evicts into it count without
            # them (as PrefixCache takes loaded blocks out before the pool allocates).
            self._num_cpu_pages -= cpu_node.num_tokens // self.block_size
        pages = self._allocate_pages(num_new_pages)
        num_loaded_pages = self._load_from_cpu(cpu_nodes, pages)
        if cpu_nodes:
            node = cpu_nodes[-1]
        pages = pages[num_loaded_pages:]
        num_tree_pages = (limit - matched) // self.block_size
        if num_tree_pages:
            node = self._add_child(node, slice_runs(runs, matched, limit), pages[:num_tree_pages])
            self._reference(node)
            node.last_access = now
        own_pages = pages[num_tree_pages:]
        self._num_own_pages += len(own_pages)
        seq = _RadixSequence(
            request=request,
            final_tokens=min(request.total_tokens, self.max_model_len),
            num_tokens=num_tokens,
            node=node,
            path_tokens=limit if num_tree_pages else matched,
            cached_tokens=matched,
            blocks=own_pages,
            loaded_tokens=matched - gpu_matched,
        )
        self._sequences[seq_id] = seq
        self._num_logical_pages += seq.path_tokens // self.block_size + len(own_pages)
        self.num_hit_tokens += matched
        self.num_cpu_hit_tokens += matched - gpu_matched
        self._track_last_page(seq)
        return True

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether ``append`` would succeed now, without changing anything."""
        check_token_count(num_tokens)
        seq = self._sequences[seq_id]
        return self._append_pages(seq, num_tokens) <= self.num_free_blocks()

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Grow the sequence's own pages by ``num_tokens`` tokens; False if no room."""
        check_token_count(num_tokens)
        seq = self._sequences[seq_id]
        if seq.cohort_offset is not None:
            raise RuntimeError("the sequence is in the cohort: leave_cohort first")
        num_new_pages = self._append_pages(seq, num_tokens)
        if num_new_pages > self.num_free_blocks():
            return False
        if num_tokens == 0:
            return True
        if seq.blocks:
            self._untrack_partial(seq.blocks[-1])
        if num_new_pages:
            seq.blocks += self._allocate_pages(num_new_pages)
            self._num_own_pages += num_new_pages
            self._num_logical_pages += num_new_pages
        seq.num_tokens += num_tokens
        self._track_last_page(seq)
        return True

    def try_append_round(self, seq_ids: list[int]) -> bool:
        """One ``append(seq_id, 1)`` for each of ``seq_ids`` if none is at its final length and
        the pool holds a page for each that starts one; False (no change) otherwise."""
        sequences = [self._sequences[seq_id] for seq_id in seq_ids]
        if any(seq.num_tokens >= seq.final_tokens for seq in sequences):
            return False  # past its final length: one by one (as the cohort refuses it)
        page_tokens = self.block_size
        num_starters = sum(
            1 for seq in sequences if (seq.num_tokens - seq.path_tokens) % page_tokens == 0
        )
        if num_starters > self.num_free_blocks():
            return False
        for seq_id in seq_ids:
            self.append(seq_id, 1)
        return True

    def fork(self, parent_id: int, child_id: int) -> bool:
        """Make ``child_id`` share the parent's tree path and hold a copy of its own pages;
        False if the pool cannot hold the copy."""
        if child_id in self._sequences:
            raise ValueError(f"sequence {child_id} is already allocated")
        parent = self._sequences[parent_id]
        if parent.cohort_offset is not None:
            raise RuntimeError("the sequence is in the cohort: leave_cohort first")
        if len(parent.blocks) > self.num_free_blocks():
            return False
        self._reference_path(parent.node, next(self._clock))
        pages = self._allocate_pages(len(parent.blocks))
        self._copies.extend(zip(parent.blocks, pages, strict=True))
        self._num_own_pages += len(pages)
        child = _RadixSequence(
            request=parent.request,
            final_tokens=parent.final_tokens,
            num_tokens=parent.num_tokens,
            node=parent.node,
            path_tokens=parent.path_tokens,
            cached_tokens=0,
            blocks=pages,
        )
        self._sequences[child_id] = child
        self._num_logical_pages += child.path_tokens // self.block_size + len(pages)
        self._track_last_page(child)
        return True

    def free(self, seq_id: int) -> None:
        """Release the sequence: its path stays cached, its full own pages become an
        unmatched cached leaf, its partial last page is freed."""
        seq = self._sequences.pop(seq_id)
        if seq.cohort_offset is not None:
            self._cohort.leave(seq)
        if seq.blocks:
            self._untrack_partial(seq.blocks[-1])
        self._num_logical_pages -= seq.path_tokens // self.block_size + len(seq.blocks)
        self._num_own_pages -= len(seq.blocks)
        now = next(self._clock)
        node: _Node | None = seq.node
        while node is not None and node is not self._root:
            node.last_access = now
            self._unreference(node)
            node = node.parent
        num_full_pages = (seq.num_tokens - seq.path_tokens) // self.block_size
        if num_full_pages:
            unique_run: Run = ((next(self._unique_streams),), 0, num_full_pages * self.block_size)
            leaf = self._add_child(seq.node, [unique_run], seq.blocks[:num_full_pages])
            leaf.last_access = now
            leaf.matchable = False
            self._push_if_evictable(leaf)
        self._free_pages.extend(reversed(seq.blocks[num_full_pages:]))

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence currently holds."""
        seq = self._sequences[seq_id]
        if seq.cohort_offset is not None:
            return seq.cohort_offset + self._cohort.round_index
        return seq.num_tokens

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Pages of the sequence's tree path, then its own."""
        seq = self._sequences[seq_id]
        path_pages: list[list[int]] = []
        node: _Node | None = seq.node
        while node is not None:
            path_pages.append(node.pages)
            node = node.parent
        return tuple(page for pages in reversed(path_pages) for page in pages) + tuple(seq.blocks)

    def held_slots(self, seq_id: int) -> int:
        """Slots of the pages in the sequence's table (shared ones included)."""
        seq = self._sequences[seq_id]
        return seq.path_tokens + len(seq.blocks) * self.block_size

    def ref_count(self, page: int) -> int:
        """Block-table entries that point at ``page`` (walks the tree: for tests)."""
        for seq in self._sequences.values():
            if page in seq.blocks:
                return 1
        stack = [self._root]
        while stack:
            node = stack.pop()
            if page in node.pages:
                return node.ref_count
            stack.extend(node.children.values())
        return 0

    def free_blocks(self) -> tuple[int, ...]:
        """The free pages in the order they will be handed out, then the pages of the cached
        leaves nobody references, least recently used first (evicted in that order)."""
        leaves = sorted(
            (last_access, tie, node.pages)
            for last_access, tie, node in self._evictable_leaves
            if self._is_gpu_leaf(node) and node.last_access == last_access
        )
        evictable = tuple(page for _, _, pages in leaves for page in pages)
        fresh = tuple(range(self._next_fresh_page, self.num_pages))
        return tuple(reversed(self._free_pages)) + fresh + evictable

    def cached_tokens(self) -> int:
        """Tokens the tree holds in GPU pages (referenced or not), own pages of running
        sequences aside."""
        return (self._num_held_tree_pages + self._num_evictable_pages) * self.block_size

    def cpu_cached_tokens(self) -> int:
        """Tokens the CPU tier holds."""
        return self._num_cpu_pages * self.block_size

    def take_copy_on_writes(self) -> list[tuple[int, int]]:
        """(src_page, dst_page) copies forks made since the last call."""
        copies, self._copies = self._copies, []
        return copies

    def usage(self) -> MemoryUsage:
        """The pool split into the paper's categories; cached pages nobody uses are free."""
        page_tokens = self.block_size
        num_partial_pages = len(self._partial_pages)
        num_held_pages = self._num_held_tree_pages + self._num_own_pages
        cohort_unfilled = self._cohort.num_unfilled_slots
        cohort_frag = self._cohort.internal_frag_slots
        return MemoryUsage(
            num_slots=self.num_slots,
            token_states=(
                (num_held_pages - num_partial_pages) * page_tokens
                + self._partial_filled_slots - cohort_unfilled
            ),
            reservation=(
                self._partial_usable_slots - self._partial_filled_slots
                + cohort_unfilled - cohort_frag
            ),
            internal_frag=(
                num_partial_pages * page_tokens - self._partial_usable_slots + cohort_frag
            ),
            external_frag=self.num_slots - self.num_pages * page_tokens,
            free=self.num_free_blocks() * page_tokens,
            shared_slots=self._num_shared_tree_pages * page_tokens,
            saved_slots=(self._num_logical_pages - num_held_pages) * page_tokens,
        )

    # --- CohortAllocator ---------------------------------------------------------------------

    def join_cohort(self, seq_ids: list[int]) -> bool:
        """Let ``advance_cohort`` append a token per round to each of ``seq_ids`` (own pages
        only: nothing a round writes is shared); False if one is past its final length."""
        members = [self._sequences[seq_id] for seq_id in seq_ids]
        for seq in members:
            if seq.cohort_offset is not None:
                raise ValueError("the sequence is already in the cohort")
            if seq.num_tokens > seq.final_tokens:
                return False
        for seq in members:
            if seq.blocks:
                self._untrack_partial(seq.blocks[-1])
            self._cohort.join(seq)
        return True

    def leave_cohort(self, seq_ids: list[int]) -> None:
        """Take the sequences out of the cohort (their token counts written back)."""
        for seq_id in seq_ids:
            seq = self._sequences[seq_id]
            self._cohort.leave(seq)
            self._track_last_page(seq)

    def cohort_next_round_blocks(self) -> int:
        """Pages the cohort's next round takes."""
        return self._cohort.next_round_blocks()

    def cohort_rounds(self) -> CohortRounds:
        """The pages and internal fragmentation of the cohort's next rounds."""
        return self._cohort.rounds()

    def advance_cohort(self, num_rounds: int) -> None:
        """Append ``num_rounds`` tokens to every cohort member."""
        num_new_pages = self._cohort.advance(num_rounds)
        self._num_own_pages += num_new_pages
        self._num_logical_pages += num_new_pages

    def num_free_blocks(self) -> int:
        """Pages free for new allocations: free ones and cached ones nobody references."""
        return self._num_unused_pages() + self._num_evictable_pages

    def _num_unused_pages(self) -> int:
        return len(self._free_pages) + self.num_pages - self._next_fresh_page

    # --- the tree ------------------------------------------------------------------------------

    def _runs(self, request: Request) -> list[Run]:
        # The engine asks can_admit and then admit for the same request: derive its runs once.
        if self._last_runs is None or self._last_runs[0] is not request:
            self._last_runs = (request, known_token_runs(request))
        return self._last_runs[1]

    def _insert_limit(self, runs: list[Run], num_tokens: int) -> int:
        """Known tokens a sequence of ``num_tokens`` tokens can match or insert: whole pages."""
        known_tokens = sum(run[2] for run in runs)
        return min(known_tokens, num_tokens) // self.block_size * self.block_size

    def _match(self, runs: list[Run], limit: int) -> tuple[_Node, _Node | None, int, int]:
        """The longest match of ``runs[:limit]`` in whole pages: (deepest node matched whole,
        the child matched partly or None, its matched tokens, tokens matched in all)."""
        page_tokens = self.block_size
        node = self._root
        position = 0
        while position + page_tokens <= limit:
            child = node.children.get(_page_key(runs, position, page_tokens))
            if child is None or child.on_cpu:
                break
            common = common_prefix_tokens(child.runs, slice_runs(runs, position, limit))
            common = common // page_tokens * page_tokens
            if common < child.num_tokens:
                return node, child, common, position + common
            node = child
            position += common
        return node, None, 0, position

    def _match_cpu(
        self, node: _Node, runs: list[Run], position: int, limit: int
    ) -> tuple[list[_Node], _Node | None, int, int]:
        """Continue a GPU match that ended at the end of ``node``, ``position`` tokens in,
        through CPU nodes: (CPU nodes matched whole, the CPU child matched partly or None, its
        matched tokens, tokens matched in all)."""
        page_tokens = self.block_size
        matched_whole: list[_Node] = []
        while position + page_tokens <= limit:
            child = node.children.get(_page_key(runs, position, page_tokens))
            if child is None or not child.on_cpu:
                break
            common = common_prefix_tokens(child.runs, slice_runs(runs, position, limit))
            common = common // page_tokens * page_tokens
            if common < child.num_tokens:
                return matched_whole, child, common, position + common
            matched_whole.append(child)
            node = child
            position += common
        return matched_whole, None, 0, position

    def _load_from_cpu(self, cpu_nodes: list[_Node], pages: list[int]) -> int:
        """Give the (referenced) CPU nodes the leading ``pages``, in path order: they are back
        on the GPU. Returns the pages they took."""
        num_taken = 0
        for node in cpu_nodes:
            num_pages = node.num_tokens // self.block_size
            node.pages = pages[num_taken : num_taken + num_pages]
            node.on_cpu = False
            num_taken += num_pages
            self._num_held_tree_pages += num_pages  # referenced by the admission
        return num_taken

    def _available_pages(self, node: _Node, child: _Node | None, child_tokens: int) -> int:
        """Pages an admission matching up to ``node`` (and ``child_tokens`` into ``child``) can
        take: free and evictable ones, less the unreferenced ones its match would reference."""
        locked_pages = 0
        if child is not None and child.ref_count == 0:
            locked_pages += child_tokens // self.block_size
        walker: _Node | None = node
        while walker is not None and walker.ref_count == 0:
            locked_pages += len(walker.pages)
            walker = walker.parent
        return self.num_free_blocks() - locked_pages

    def _split(self, child: _Node, num_tokens: int) -> _Node:
        """Cut ``child``'s edge after ``num_tokens`` tokens; returns the new upper node (the
        lower part stays ``child``, so paths through it still hold)."""
        parent = child.parent
        assert parent is not None
        num_upper_pages = num_tokens // self.block_size
        upper = _Node(
            runs=slice_runs(child.runs, 0, num_tokens),
            num_tokens=num_tokens,
            pages=child.pages[:num_upper_pages],
            parent=parent,
            ref_count=child.ref_count,
            last_access=child.last_access,
            on_cpu=child.on_cpu,
        )
        parent.children[_page_key(child.runs, 0, self.block_size)] = upper
        child.runs = slice_runs(child.runs, num_tokens, child.num_tokens)
        child.num_tokens -= num_tokens
        child.pages = child.pages[num_upper_pages:]
        child.parent = upper
        upper.children[_page_key(child.runs, 0, self.block_size)] = child
        return upper

    def _add_child(self, parent: _Node, runs: list[Run], pages: list[int]) -> _Node:
        """A new, unreferenced node under ``parent`` (its pages cached: evictable)."""
        num_tokens = sum(run[2] for run in runs)
        child = _Node(runs=runs, num_tokens=num_tokens, pages=pages, parent=parent)
        parent.children[_page_key(runs, 0, self.block_size)] = child
        self._num_evictable_pages += len(pages)
        return child

    def _reference_path(self, node: _Node, now: int) -> None:
        walker: _Node | None = node
        while walker is not None and walker is not self._root:
            self._reference(walker)
            walker.last_access = now
            walker = walker.parent

    def _reference(self, node: _Node) -> None:
        num_pages = len(node.pages)
        if node.ref_count == 0:
            self._num_evictable_pages -= num_pages
            self._num_held_tree_pages += num_pages
        elif node.ref_count == 1:
            self._num_shared_tree_pages += num_pages
        node.ref_count += 1

    def _unreference(self, node: _Node) -> None:
        num_pages = len(node.pages)
        node.ref_count -= 1
        if node.ref_count == 1:
            self._num_shared_tree_pages -= num_pages
        elif node.ref_count == 0:
            self._num_held_tree_pages -= num_pages
            self._num_evictable_pages += num_pages
            self._push_if_evictable(node)

    def _is_gpu_leaf(self, node: _Node) -> bool:
        """Whether the GPU may evict the node now: in the tree, on the GPU, unreferenced, and
        no child on the GPU."""
        return (
            node.in_tree and not node.on_cpu and node.ref_count == 0
            and not any(not child.on_cpu for child in node.children.values())
        )

    def _push_if_evictable(self, node: _Node) -> None:
        if node.parent is not None and self._is_gpu_leaf(node):
            heapq.heappush(self._evictable_leaves, (node.last_access, next(self._tie), node))

    def _allocate_pages(self, num_pages: int) -> list[int]:
        """Take free pages, evicting least recently used unreferenced leaves while too few
        are free (the caller has checked ``num_free_blocks``)."""
        free_pages = self._free_pages
        pages: list[int] = []
        # Evict only when nothing is free, so one call takes the pages that as many single
        # allocations would (the fast path's rounds take them in one call).
        while len(pages) < num_pages:
            if not free_pages:
                num_fresh = min(self.num_pages - self._next_fresh_page, num_pages - len(pages))
                if num_fresh:
                    pages += range(self._next_fresh_page, self._next_fresh_page + num_fresh)
                    self._next_fresh_page += num_fresh
                    continue
                self._evict_one_leaf()
            num_taken = min(len(free_pages), num_pages - len(pages))
            pages += reversed(free_pages[-num_taken:])
            del free_pages[-num_taken:]
        return pages

    def _evict_one_leaf(self) -> None:
        """Free the GPU pages of the least recently used GPU leaf: it moves to the CPU tier
        (known tokens, with a tier) or leaves the tree."""
        while True:
            last_access, _, node = heapq.heappop(self._evictable_leaves)
            if self._is_gpu_leaf(node) and node.last_access == last_access:
                break
        parent = node.parent
        assert parent is not None
        num_pages = len(node.pages)
        self._num_evictable_pages -= num_pages
        self.num_evicted_pages += num_pages
        self._free_pages.extend(reversed(node.pages))
        node.pages = []
        if self.cpu_cache_pages and node.matchable:
            node.on_cpu = True
            self._num_cpu_pages += num_pages
            self._push_if_cpu_leaf(node)
            while self._num_cpu_pages > self.cpu_cache_pages:
                self._drop_cpu_leaf()
        else:
            self._remove(node)
        if parent is not self._root:
            self._push_if_evictable(parent)

    def _push_if_cpu_leaf(self, node: _Node) -> None:
        if node.in_tree and node.on_cpu and node.ref_count == 0 and not node.children:
            heapq.heappush(self._cpu_leaves, (node.last_access, next(self._tie), node))

    def _drop_cpu_leaf(self) -> None:
        """The CPU tier is full: forget its least recently used leaf."""
        while True:
            last_access, _, node = heapq.heappop(self._cpu_leaves)
            if (node.in_tree and node.on_cpu and node.ref_count == 0 and not node.children
                    and node.last_access == last_access):  # fmt: skip
                break
        self._num_cpu_pages -= node.num_tokens // self.block_size
        parent = node.parent
        self._remove(node)
        if parent is not None:
            self._push_if_cpu_leaf(parent)

    def _remove(self, node: _Node) -> None:
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[_page_key(node.runs, 0, self.block_size)]
        node.in_tree = False

    # --- own pages -----------------------------------------------------------------------------

    def _pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _append_pages(self, seq: _RadixSequence, num_tokens: int) -> int:
        own_tokens = seq.num_tokens + num_tokens - seq.path_tokens
        return self._pages_for(own_tokens) - len(seq.blocks)

    def _track_last_page(self, seq: _RadixSequence) -> None:
        filled_slots = (seq.num_tokens - seq.path_tokens) % self.block_size
        if filled_slots == 0 or not seq.blocks:
            return
        first_token = seq.num_tokens - filled_slots
        final_tokens = max(seq.final_tokens, seq.num_tokens)
        usable_slots = min(final_tokens - first_token, self.block_size)
        page = seq.blocks[-1]
        self._untrack_partial(page)
        self._partial_pages[page] = (filled_slots, usable_slots)
        self._partial_filled_slots += filled_slots
        self._partial_usable_slots += usable_slots

    def _untrack_partial(self, page: int) -> None:
        filled_slots, usable_slots = self._partial_pages.pop(page, (0, 0))
        self._partial_filled_slots -= filled_slots
        self._partial_usable_slots -= usable_slots


def unbounded_radix_hits(requests: list[Request], page_tokens: int) -> int:
    """Hit tokens of a radix cache that never evicts, given ``requests`` in arrival order, each
    admitted with its prompt: the longest known prefix each shares with an earlier request, in
    whole pages (the ideal a bounded cache reaches at best). The tree alone, without pages:
    page 1 costs what page 16 does."""
    tree = RadixAllocator(0, 1, page_tokens=page_tokens)
    hit_tokens = 0
    for request in requests:
        runs = known_token_runs(request)
        limit = tree._insert_limit(runs, request.prompt_tokens)
        node, child, child_tokens, matched = tree._match(runs, limit)
        hit_tokens += matched
        if child is not None:
            node = tree._split(child, child_tokens)
        if limit > matched:
            tree._add_child(node, slice_runs(runs, matched, limit), [])
    return hit_tokens
