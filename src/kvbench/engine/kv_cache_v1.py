"""vLLM v1's KV-cache manager for one full-attention group: block pool, free queue, prefix cache.

The memory side of ``scheduler=vllm_v1`` (``engine.scheduler_v1``), modelled on vLLM 0.32's
``KVCacheManager``, ``FullAttentionManager`` and ``BlockPool`` (``vllm/v1/core/``), refereed step
for step by the real ones (docs/referee.md). What it reproduces, because each changes which
blocks are free, cached or evicted later:

- the pool is ``allocator.num_slots // block_size`` blocks: vLLM's ``num_gpu_blocks`` less its
  null block, which never holds tokens;
- the free queue (vLLM's ``FreeKVCacheBlockQueue``): blocks are taken from its head; a freed
  request's blocks are released tail first, those without a hash to the *front* of the queue
  (reused first) and hashed ones to the back (LRU order for eviction); taking a hashed block
  from the head evicts its hash;
- prefix caching (``enable_caching``): every full block of a request's tokens (prompt and
  generated) is named by a chained hash; a block is cached as soon as it is allocated for tokens
  that fill it (before they are computed), so a later request of the same step can hit it;
  duplicates are kept (a hash may name several blocks; a lookup takes the first cached); a lookup
  finds whole blocks from the start, at most ``num_tokens - 1`` tokens (a full hit still
  recomputes its last token); a hit on a free cached block takes it back out of the queue.

Block identities: kvbench knows prompt tokens only by their prefix identity
(``allocators.prefix_hashes.prompt_block_hashes``); every later block (a prompt's own tokens, the
generated ones) belongs to its request alone, so its hash chains the request id. The referee's
token ids (``referee.token_ids``) give vLLM the same equalities.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from kvbench.allocators.base import CohortRounds, MemoryUsage
from kvbench.allocators.cohort import count_in_calendar, final_block_fragment
from kvbench.allocators.prefix_hashes import prompt_block_hashes
from kvbench.core.request import Request

if TYPE_CHECKING:
    from kvbench.engine.cpu_tier_v1 import CpuOffloadTier

_OWN_BLOCK_TAG = 3  # keeps a request's own blocks apart from prefix identities (tags 1, 2)

NOT_LOADING, LOADING, LOADED = 0, 1, 2  # V1Sequence.load_state


class V1Sequence:
    """One request's state in the v1 engine: its tokens, what is computed, its blocks.

    Attributes:
        request: the request.
        num_output_tokens: tokens sampled and taken in so far (kept across preemptions: vLLM
            recomputes them).
        num_output_placeholders: tokens sampled but not yet taken in (vLLM's name): under async
            scheduling, the one a step produced until the next step has been scheduled; zeroed
            by a preemption (the token is still taken in later); always 0 synchronously.
        num_computed_tokens: tokens whose KV is (or is being) computed, hits included.
        num_in_flight_tokens: of those, the ones a step still in flight computes (vLLM's name):
            under async scheduling, what the last step scheduled for it until its output is
            taken in; always 0 when a step is scheduled synchronously.
        num_preemptions: times it was preempted (its lookups are then counted apart).
        blocks: its block table (pool block ids).
        num_cached_blocks: leading blocks already offered to the prefix cache.
        load_state: its load from a CPU tier (``engine.cpu_tier_v1``): ``NOT_LOADING``,
            ``LOADING`` (admitted with blocks, waiting outside the batch), ``LOADED`` (the copy
            completed; it computes from the next step it is scheduled).
    """

    __slots__ = (
        "_hashes",
        "blocks",
        "load_state",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_in_flight_tokens",
        "num_output_placeholders",
        "num_output_tokens",
        "num_preemptions",
        "request",
    )

    def __init__(self, request: Request) -> None:
        self.request = request
        self.num_output_tokens = 0
        self.num_output_placeholders = 0
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
        self.blocks: list[int] = []
        self.num_cached_blocks = 0
        self.load_state = NOT_LOADING
        self._hashes: list[int] | None = None

    @property
    def request_id(self) -> int:
        """The request's id."""
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        """Prompt plus sampled tokens taken in: the input a (re)admission computes."""
        return self.request.prompt_tokens + self.num_output_tokens

    @property
    def num_generated_tokens(self) -> int:
        """Tokens sampled so far, taken in or not."""
        return self.num_output_tokens + self.num_output_placeholders

    def block_hashes(self, num_blocks: int, block_size: int) -> list[int]:
        """The chained hashes of its first ``num_blocks`` full blocks (prompt known prefix, then
        blocks of its own)."""
        hashes = self._hashes
        if hashes is None:
            hashes = self._hashes = list(prompt_block_hashes(self.request, block_size))
        while len(hashes) < num_blocks:
            parent = hashes[-1] if hashes else 0
            hashes.append(hash((parent, _OWN_BLOCK_TAG, self.request.request_id)))
        return hashes


class V1KVCache:
    """vLLM v1's block pool of ``num_blocks`` blocks, with or without its prefix cache.

    The scheduler (``engine.scheduler_v1``) calls it as vLLM's scheduler calls its
    ``KVCacheManager``: ``find_hit`` and ``can_admit`` / ``admit`` for a waiting request,
    ``can_grow`` / ``grow`` for a running one, ``free`` on preemption and on finishing.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        *,
        enable_caching: bool,
        num_slots: int | None = None,
        cpu_tier: CpuOffloadTier | None = None,
    ) -> None:
        """``num_slots``: the pool's slots when they are more than ``num_blocks`` whole blocks
        (the rest is external fragmentation, as for the ``paged`` allocator); ``cpu_tier``: the
        host memory vLLM's CPU offloading stores prompt blocks in (prefix caching on)."""
        if cpu_tier is not None and not enable_caching:
            raise ValueError("a CPU tier holds prefix blocks: it needs enable_caching")
        if block_size < 1 or num_blocks < 0:
            raise ValueError(f"block_size={block_size}, num_blocks={num_blocks}: invalid pool")
        self.num_slots = num_blocks * block_size if num_slots is None else num_slots
        if self.num_slots < num_blocks * block_size:
            raise ValueError(f"num_slots={num_slots}: fewer than {num_blocks} blocks hold")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._ref_counts = [0] * num_blocks
        self._hash_of_block: list[int | None] = [None] * num_blocks
        # hash -> the blocks caching it, in insertion order (a lookup takes the first).
        self._blocks_of_hash: dict[int, dict[int, None]] = {}
        self._num_shared_blocks = 0
        self.num_evicted_blocks = 0
        self.cpu_tier = cpu_tier
        # Blocks handed to requests in the current step (new, or cached ones hit): a store of a
        # finished request's blocks among them is copied at once (``CpuOffloadTier``).
        self.step_allocated_blocks: set[int] = set()
        self._cohort = _DecodeCohort(block_size)

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (cached free blocks included)."""
        return len(self._free_queue)

    @property
    def num_blocks_in_use(self) -> int:
        """Blocks referenced by requests."""
        return self.num_blocks - len(self._free_queue)

    def free_block_ids(self) -> list[int]:
        """The free queue's blocks, the next to be taken first: two runs leave the same queue
        only if every allocation and every release came in the same order."""
        return list(self._free_queue)

    def find_hit(self, seq: V1Sequence) -> list[int]:
        """The cached blocks of the sequence's leading full blocks, up to the first miss, covering
        at most ``num_tokens - 1`` tokens (vLLM's ``get_computed_blocks``); none without caching."""
        if not self.enable_caching:
            return []
        block_size = self.block_size
        max_hit_blocks = (seq.num_tokens - 1) // block_size
        hits = []
        blocks_of_hash = self._blocks_of_hash
        for block_hash in seq.block_hashes(max_hit_blocks, block_size)[:max_hit_blocks]:
            blocks = blocks_of_hash.get(block_hash)
            if not blocks:
                break
            hits.append(next(iter(blocks)))
        return hits

    def can_admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """Whether the sequence's whole input fits (vLLM 0.32's ``full_sequence_must_fit``):
        the blocks it lacks beyond those it holds (a loaded request) and its hits, plus the
        hits that wait in the free queue. Its first ``num_new_tokens`` then fit too (they are
        part of it)."""
        num_tokens = min(seq.num_tokens, self.max_model_len)
        return self._num_blocks_for(seq, hits, num_tokens) <= len(self._free_queue)

    def can_load(self, seq: V1Sequence, hits: list[int], num_load_blocks: int,
                 num_reserved_blocks: int) -> bool:  # fmt: skip
        """Whether a waiting sequence may be admitted to load ``num_load_blocks`` blocks from
        the CPU tier after its hits: its whole input fits (``can_admit``), and the blocks of
        its hits and loads fit beside the ``num_reserved_blocks`` that requests still
        prefilling need (vLLM keeps those for them while a load holds its blocks)."""
        if not self.can_admit(seq, hits, 0):
            return False
        num_tokens = (len(hits) + num_load_blocks) * self.block_size
        num_blocks = self._num_blocks_for(seq, hits, num_tokens)
        return num_blocks <= len(self._free_queue) - num_reserved_blocks

    def admit_to_load(self, seq: V1Sequence, hits: list[int], num_load_blocks: int) -> None:
        """Give a waiting sequence its hits and fresh blocks for the ``num_load_blocks`` blocks
        it loads (the caller checked ``can_load``); they are cached once loaded
        (``cache_computed``)."""
        for block_id in hits:
            self._touch(block_id)
        seq.blocks = list(hits) + self._take_free_blocks(num_load_blocks)
        seq.num_cached_blocks = len(hits)
        seq.num_computed_tokens = len(seq.blocks) * self.block_size

    def remaining_blocks(self, seq: V1Sequence) -> int:
        """Blocks a request still needs to hold its whole input (vLLM's reservation for a
        request still prefilling)."""
        num_tokens = min(seq.num_tokens, self.max_model_len)
        return max(-(-num_tokens // self.block_size) - len(seq.blocks), 0)

    def _num_blocks_for(self, seq: V1Sequence, hits: list[int], num_tokens: int) -> int:
        """Free blocks ``num_tokens`` tokens take beyond the sequence's blocks and hits, the
        hits waiting in the free queue included (touching takes them out)."""
        num_required = -(-num_tokens // self.block_size)
        ref_counts = self._ref_counts
        num_free_hits = sum(1 for block_id in hits if ref_counts[block_id] == 0)
        return max(num_required - len(seq.blocks) - len(hits), 0) + num_free_hits

    def admit(self, seq: V1Sequence, hits: list[int], num_new_tokens: int) -> None:
        """Give a waiting sequence its hits and blocks for ``num_new_tokens`` more tokens (the
        caller checked ``can_admit``); its computed tokens become the hit tokens."""
        for block_id in hits:  # touched before allocating: allocation cannot evict them
            self._touch(block_id)
        seq.blocks = list(hits)
        seq.num_cached_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        self.grow(seq, num_new_tokens)

    def can_grow(self, seq: V1Sequence, num_new_tokens: int) -> bool:
        """Whether ``grow`` has the blocks it needs."""
        return self._num_new_blocks(seq, num_new_tokens) <= len(self._free_queue)

    def grow(self, seq: V1Sequence, num_new_tokens: int) -> None:
        """Allocate for ``num_new_tokens`` more tokens and cache the blocks they fill."""
        num_new_blocks = self._num_new_blocks(seq, num_new_tokens)
        if num_new_blocks > len(self._free_queue):
            raise RuntimeError("too few free blocks: check can_grow first")
        if num_new_blocks > 0:
            seq.blocks += self._take_free_blocks(num_new_blocks)
        if self.enable_caching:
            num_cached_tokens = min(seq.num_computed_tokens + num_new_tokens, seq.num_tokens)
            self._cache_full_blocks(seq, num_cached_tokens // self.block_size)

    def cache_computed(self, seq: V1Sequence, num_tokens: int) -> None:
        """Cache the full blocks of the sequence's first ``num_tokens`` tokens (vLLM's
        ``cache_blocks``: async scheduling's catch-up once a sampled token is taken in)."""
        if self.enable_caching:
            self._cache_full_blocks(seq, min(num_tokens, seq.num_tokens) // self.block_size)

    # The decode cohort: running sequences that each decode one token a round, their counts and
    # blocks kept lazily (the scheduler's ``LazyDecoders``). A round costs O(blocks it starts).

    def join_decoders(self, seqs: list[V1Sequence]) -> bool:
        """Take ``seqs`` (each decoding: its next token's input computed but for that token;
        counts current) into the cohort, after its members in running order: from now on each
        round (``advance_decoders``) grows each member by one token, in join order, until it
        leaves (``leave_decoders``). Always True: a block pool grows any sequence a token."""
        cohort = self._cohort
        block_size = self.block_size
        round_index = cohort.round_index
        for seq in seqs:
            computed = seq.num_computed_tokens
            # A member starts a block in the rounds where its computed tokens are a multiple
            # of block_size: rounds r with (computed - round_index + r) % block_size == 0.
            phase = (computed - round_index) % block_size
            cohort.phases[phase][seq] = None
            final_tokens = min(seq.request.total_tokens, self.max_model_len)
            last_block_start, unused_slots = final_block_fragment(final_tokens, block_size)
            frag_round = round_index + last_block_start - computed  # it enters its final block
            if unused_slots and frag_round >= round_index:
                count_in_calendar(cohort.frag_calendar, frag_round, unused_slots)
            cohort.members[seq] = (phase, frag_round, unused_slots)
            cohort.add_partial(self._partial_block(seq), 1)
        return True

    def next_round_blocks(self) -> int:
        """Blocks the cohort's next round takes (one per member that starts a block)."""
        cohort = self._cohort
        return len(cohort.phases[-cohort.round_index % self.block_size])

    def decode_rounds(self) -> CohortRounds:
        """The blocks each of the cohort's next rounds takes and the internal fragmentation it
        adds (members entering the block of their final token), while none joins or leaves."""
        cohort = self._cohort
        block_size = self.block_size
        round_index = cohort.round_index
        new_blocks = tuple(len(cohort.phases[-(round_index + k) % block_size])
                           for k in range(block_size))  # fmt: skip
        return CohortRounds(new_blocks=new_blocks, first_round=round_index,
                            internal_frag_slots=cohort.frag_calendar)  # fmt: skip

    def advance_decoders(self, num_rounds: int) -> None:
        """Run ``num_rounds`` rounds of the cohort (the free queue holds their blocks: check
        ``next_round_blocks``), as that many steps of one ``grow`` per member in running order
        would: round by round, the members that start a block take the free queue's first.
        The blocks members fill are cached when they leave (each holds a token of its own
        request: no one else's lookup can hit it meanwhile)."""
        cohort = self._cohort
        phases = cohort.phases
        block_size = self.block_size
        num_members = len(cohort.members)
        for _ in range(num_rounds):
            round_index = cohort.round_index
            starting = phases[-round_index % block_size]
            if starting:
                for seq, block_id in zip(starting, self._take_free_blocks(len(starting)),
                                         strict=True):  # fmt: skip
                    seq.blocks.append(block_id)
                cohort.num_logical_blocks += len(starting)
            # After the round, the members whose next token starts a block have a full last
            # block; every other member's last block holds one token more.
            num_full = len(phases[(-round_index - 1) % block_size])
            cohort.num_partial = num_members - num_full
            cohort.partial_filled_slots += num_members - block_size * num_full
            cohort.internal_frag_slots += cohort.frag_calendar.pop(round_index, 0)
            cohort.round_index = round_index + 1

    def leave_decoders(self, seqs: list[V1Sequence]) -> None:
        """Take ``seqs`` out of the cohort, their counts written back (``advance_decoders``'s
        rounds included), and cache the blocks their taken-in tokens fill (a token in flight
        waits, as ``cache_computed`` has it)."""
        cohort = self._cohort
        for seq in seqs:
            phase, frag_round, unused_slots = cohort.members.pop(seq)
            del cohort.phases[phase][seq]
            if unused_slots and frag_round >= cohort.round_index:  # not entered yet
                count_in_calendar(cohort.frag_calendar, frag_round, -unused_slots)
            cohort.add_partial(self._partial_block(seq), -1)
            if self.enable_caching:
                num_known_tokens = seq.num_computed_tokens - seq.num_output_placeholders
                self._cache_full_blocks(seq, num_known_tokens // self.block_size)

    def free(self, seq: V1Sequence) -> None:
        """Release the sequence's blocks, tail first: unhashed ones to the front of the free
        queue, hashed ones (still cached) to its back."""
        ref_counts = self._ref_counts
        hash_of_block = self._hash_of_block
        reuse_first = []
        reuse_last = []
        for block_id in reversed(seq.blocks):
            num_refs = ref_counts[block_id] - 1
            ref_counts[block_id] = num_refs
            if num_refs == 1:
                self._num_shared_blocks -= 1
            elif num_refs == 0:
                if hash_of_block[block_id] is None:
                    reuse_first.append(block_id)
                else:
                    reuse_last.append(block_id)
        queue = self._free_queue
        for block_id in reversed(reuse_first):  # the first of them ends at the head
            queue[block_id] = None
            queue.move_to_end(block_id, last=False)
        for block_id in reuse_last:
            queue[block_id] = None
        seq.blocks = []
        seq.num_cached_blocks = 0

    def held_slots(self, seq: V1Sequence) -> int:
        """Slots of the sequence's blocks (shared ones included)."""
        return len(seq.blocks) * self.block_size

    def usage(self, sequences: list[V1Sequence]) -> MemoryUsage:
        """The pool in the paper's categories; ``sequences`` are those holding blocks outside
        the decode cohort (whose part is kept as its rounds run).

        Held blocks hold the tokens scheduled into them (``token_states``); a sequence's partly
        filled last block splits into the slots its later tokens will fill (``reservation``) and
        those it never fills (``internal_frag``). Cached free blocks are free.
        """
        block_size = self.block_size
        max_model_len = self.max_model_len
        num_held = self.num_blocks_in_use
        cohort = self._cohort
        num_logical = cohort.num_logical_blocks
        partial_filled = cohort.partial_filled_slots
        num_partial = cohort.num_partial
        partial_usable = num_partial * block_size - cohort.internal_frag_slots
        # Every step records this over the whole batch: the loop avoids calls (min, max and
        # the request's total_tokens property cost a third of it).
        for seq in sequences:
            blocks = seq.blocks
            num_logical += len(blocks)
            computed = seq.num_computed_tokens
            filled = computed % block_size
            if filled and blocks:
                request = seq.request
                final_tokens = request.prompt_tokens + request.output_tokens
                if final_tokens > max_model_len:
                    final_tokens = max_model_len
                # The last block's slots up to its final token (or what it computed past it).
                usable = (final_tokens if final_tokens > computed else computed) - computed + filled
                num_partial += 1
                partial_filled += filled
                partial_usable += usable if usable < block_size else block_size
        return MemoryUsage(
            num_slots=self.num_slots,
            token_states=(num_held - num_partial) * block_size + partial_filled,
            reservation=partial_usable - partial_filled,
            internal_frag=num_partial * block_size - partial_usable,
            external_frag=self.num_slots - self.num_blocks * block_size,
            free=len(self._free_queue) * block_size,
            shared_slots=self._num_shared_blocks * block_size,
            saved_slots=(num_logical - num_held) * block_size,
        )

    def _partial_block(self, seq: V1Sequence) -> tuple[int, int, int]:
        """(blocks, filled slots, never-filled slots) of the sequence's partly filled last block
        as ``usage`` counts them (filled 0: its last block is full)."""
        block_size = self.block_size
        computed = seq.num_computed_tokens
        filled = computed % block_size if seq.blocks else 0
        if not filled:
            return len(seq.blocks), 0, 0
        final_tokens = min(seq.request.total_tokens, self.max_model_len)
        usable = min(max(final_tokens, computed) - computed + filled, block_size)
        return len(seq.blocks), filled, block_size - usable

    def _num_new_blocks(self, seq: V1Sequence, num_new_tokens: int) -> int:
        num_tokens = min(seq.num_computed_tokens + num_new_tokens, self.max_model_len)
        return max(-(-num_tokens // self.block_size) - len(seq.blocks), 0)

    def _touch(self, block_id: int) -> None:
        if self.cpu_tier is not None:
            self.step_allocated_blocks.add(block_id)
        num_refs = self._ref_counts[block_id]
        if num_refs == 0:
            del self._free_queue[block_id]
        elif num_refs == 1:
            self._num_shared_blocks += 1
        self._ref_counts[block_id] = num_refs + 1

    def _take_free_blocks(self, num_blocks: int) -> list[int]:
        """The free queue's first blocks, their cached hashes evicted."""
        popitem = self._free_queue.popitem
        block_ids = [popitem(last=False)[0] for _ in range(num_blocks)]
        ref_counts = self._ref_counts
        hash_of_block = self._hash_of_block
        if self.cpu_tier is not None:
            self.step_allocated_blocks.update(block_ids)
        for block_id in block_ids:
            ref_counts[block_id] = 1
            block_hash = hash_of_block[block_id]
            if block_hash is not None:
                hash_of_block[block_id] = None
                blocks = self._blocks_of_hash[block_hash]
                del blocks[block_id]
                if not blocks:
                    del self._blocks_of_hash[block_hash]
                self.num_evicted_blocks += 1
        return block_ids

    def _cache_full_blocks(self, seq: V1Sequence, num_full_blocks: int) -> None:
        """Cache the sequence's blocks ``[num_cached_blocks, num_full_blocks)`` (duplicates of a
        hash another block caches are cached too, as vLLM does not deduplicate)."""
        first_block = seq.num_cached_blocks
        if num_full_blocks <= first_block:
            return
        hashes = seq.block_hashes(num_full_blocks, self.block_size)
        hash_of_block = self._hash_of_block
        blocks_of_hash = self._blocks_of_hash
        for index in range(first_block, num_full_blocks):
            block_id = seq.blocks[index]
            if hash_of_block[block_id] is not None:
                continue  # already cached (a hit)
            block_hash = hashes[index]
            hash_of_block[block_id] = block_hash
            blocks_of_hash.setdefault(block_hash, {})[block_id] = None
        seq.num_cached_blocks = num_full_blocks


class _DecodeCohort:
    """``V1KVCache``'s decode cohort: its members, which start a block in which rounds, the
    rounds in which members enter the block of their final token, and the members' part of
    ``usage`` (kept as rounds run, so a step's usage costs O(non-members))."""

    __slots__ = ("frag_calendar", "internal_frag_slots", "members", "num_logical_blocks",
                 "num_partial", "partial_filled_slots", "phases", "round_index")  # fmt: skip

    def __init__(self, block_size: int) -> None:
        self.round_index = 0  # rounds run since the pool was made
        # phase -> members (in running order) that start a block in rounds r with
        # -r % block_size == phase.
        self.phases: list[dict[V1Sequence, None]] = [{} for _ in range(block_size)]
        # member -> (phase, round it enters its final block, that block's never-filled slots)
        self.members: dict[V1Sequence, tuple[int, int, int]] = {}
        self.frag_calendar: dict[int, int] = {}  # round -> never-filled slots entered in it
        self.num_logical_blocks = 0  # the members' block-table entries
        self.num_partial = 0  # members whose last block is partly filled
        self.partial_filled_slots = 0  # slots those blocks hold tokens in
        self.internal_frag_slots = 0  # slots of those blocks no token will fill

    def add_partial(self, part: tuple[int, int, int], sign: int) -> None:
        """Count a member's blocks and partly filled last block (``_partial_block``) in
        (``sign`` 1) or out (-1)."""
        num_blocks, filled, unused = part
        self.num_logical_blocks += sign * num_blocks
        if filled:
            self.num_partial += sign
            self.partial_filled_slots += sign * filled
            self.internal_frag_slots += sign * unused
