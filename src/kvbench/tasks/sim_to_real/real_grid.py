"""The grid a profile of kvbench's own real executor is fitted on in ``experiment=sim_to_real``.

``task=profile`` times ``RealExecutor.run`` on single iterations; ``run_real`` prices more than
that: an iteration lasts from the end of the one before (scheduling, the previous iteration's
bookkeeping) to the end of its forward. So this grid is served through ``run_real`` itself, as
closed batches whose iterations take the shapes wanted (as ``vllm_grid`` does for vLLM), and every
step is timed exactly as a replay's. Four kinds of point, each under kernel block size 1 (a
contiguous arena, ``naive_oracle``) and 16 (``paged``):

- prefills: ``count`` prompts of one length, each computing its prompt and one token (one step);
- decodes: ``num_seqs`` prompts of one length prefilled together, then ``DECODE_STEPS``
  decode-only steps at contexts just past the prompt;
- mixed: decodes as above, joined after their prefill by prompts computed beside their first
  decode (the joiners arrive ``JOIN_AFTER_S`` after the start, while the first step runs);
- idle waits: one request arriving ``IDLE_WAITS_S`` after the point starts, so ``run_real``
  sleeps first and its prefill is the first step after an idle wait (the wake terms).

Sized to the experiment's shapes (``max_model_len`` 64: prompts of 4-52 tokens, decode batches of
1-6 at contexts 9-56, mixed steps) and to about 12-20 s of steps on two CPU cores per copy (172
steps), with 7.85 s of idle waits; ``interleave`` (``vllm_grid``) deals ``GRID_REPEATS`` copies
into the parts measured between the real runs. A model of k times that context also gets every
length times k (``vllm_grid.length_scales``), in a pool k times as large, so the grid reaches the
contexts its runs do (``experiment=sim_to_real_long``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.request import Request
from kvbench.tasks.sim_to_real.vllm_grid import length_scales, scaled_lengths, scaled_mixed

BLOCK_SIZES = (1, 16)  # the kernel's: a contiguous allocator's arena, the paged allocators'
PREFILL_COUNTS = (1, 2, 4)
PREFILL_PROMPTS = (4, 20)  # the decode points' prefills add 1-6 prompts of 8, 28 and 52
DECODE_SEQS = (1, 2, 3, 4, 5, 6)  # every batch the runs have (the stair terms)
DECODE_PROMPTS = (8, 28, 52)
DECODE_STEPS = 3
# Mixed points: (decoding requests, their prompt, the prompts that join their first decode).
MIXED = ((1, 16, (16,)), (2, 40, (8,)), (4, 8, (32,)), (2, 24, (48,)), (3, 16, (8, 8)))
# When the joining prompts of a mixed point arrive: after the first step (the decoders' prefill,
# tens of ms on a CPU) has begun, so they are admitted beside the decoders' first decode.
JOIN_AFTER_S = 0.02
# Idle waits before a request (s), spanning the waits of the experiment's runs (tenths of a
# second between a 4 req/s run's requests, seconds at 0.5 req/s: the wake-up rises fastest over
# the short ones); its prompt and decode steps are a decode point's (block size 16: a wake-up is
# not the kernel's).
IDLE_WAITS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
IDLE_PROMPT_TOKENS = 20
# The grid's own pool: the largest point held at once, with no preemption, under either layout.
GRID_POOL_SLOTS = 1024
BASE_MODEL_LEN = 64  # the context the lengths above are chosen for


@dataclass(frozen=True)
class RealGridPoint:
    """One closed batch of the grid, served by ``run_real``.

    Attributes:
        block_size: the kernel's block size (1: ``naive_oracle``'s arena; else ``paged``).
        num_seqs: requests prefilled together at t = 0.
        prompt_tokens: each of their prompts.
        decode_steps: decode-only tokens each generates after its first (0: a prefill point).
        joining_prompts: prompts arriving at ``JOIN_AFTER_S``, computed beside the first decode
            with one output token each (a mixed point).
        wait_s: how long after the point starts its requests arrive (an idle-wait point: the
            executor sleeps until then).
    """

    block_size: int
    num_seqs: int
    prompt_tokens: int
    decode_steps: int = 0
    joining_prompts: tuple[int, ...] = ()
    wait_s: float = 0.0

    @property
    def allocator(self) -> str:
        """The allocator serving the point: ``naive_oracle`` (block size 1) or ``paged``."""
        return "naive_oracle" if self.block_size == 1 else "paged"

    def requests(self) -> list[Request]:
        """The point's requests (ids from 0), as ``run_real`` takes them."""
        first = [Request(i, self.wait_s, self.prompt_tokens, self.decode_steps + 1)
                 for i in range(self.num_seqs)]  # fmt: skip
        return first + [Request(self.num_seqs + i, self.wait_s + JOIN_AFTER_S, prompt, 1)
                        for i, prompt in enumerate(self.joining_prompts)]  # fmt: skip

    def num_slots(self) -> int:
        """Slots the point holds at most: every request at its last token, in whole blocks (a
        buddy arena's power-of-two extents for block size 1)."""
        tokens = [r.prompt_tokens + r.output_tokens for r in self.requests()]
        if self.block_size == 1:
            return sum(1 << (n - 1).bit_length() for n in tokens)
        return sum(-(-n // self.block_size) * self.block_size for n in tokens)

    def fits(self, num_slots: int, max_num_seqs: int, max_model_len: int) -> bool:
        """Whether the point runs at once in a pool of ``num_slots``: no preemption, no request
        waiting for a sequence slot, none longer than the model's context."""
        requests = self.requests()
        return (
            self.num_slots() <= num_slots
            and len(requests) <= max_num_seqs
            and all(r.prompt_tokens + r.output_tokens <= max_model_len for r in requests)
        )


def grid_pool_slots(max_model_len: int) -> int:
    """The grid's own pool for a model of ``max_model_len``: ``GRID_POOL_SLOTS`` times its
    largest length scale."""
    return GRID_POOL_SLOTS * max(length_scales(max_model_len, BASE_MODEL_LEN))


def real_grid(max_num_seqs: int, max_model_len: int) -> list[RealGridPoint]:
    """Every point the grid's pool and the scheduler's limits hold at once: prefills, decodes,
    mixed, under each block size, their lengths at each length scale (each point once), and the
    idle waits."""
    scales = length_scales(max_model_len, BASE_MODEL_LEN)
    prefill_prompts = scaled_lengths(PREFILL_PROMPTS, scales)
    decode_prompts = scaled_lengths(DECODE_PROMPTS, scales)
    mixed = scaled_mixed(MIXED, scales)
    points = []
    for block_size in BLOCK_SIZES:
        points += [RealGridPoint(block_size, count, prompt)
                   for count in PREFILL_COUNTS for prompt in prefill_prompts]  # fmt: skip
        points += [RealGridPoint(block_size, num_seqs, prompt, DECODE_STEPS)
                   for num_seqs in DECODE_SEQS for prompt in decode_prompts]  # fmt: skip
        points += [RealGridPoint(block_size, num_seqs, prompt, DECODE_STEPS, joining)
                   for num_seqs, prompt, joining in mixed]  # fmt: skip
    points += [RealGridPoint(16, 1, IDLE_PROMPT_TOKENS, DECODE_STEPS, wait_s=wait_s)
               for wait_s in IDLE_WAITS_S]  # fmt: skip
    num_slots = grid_pool_slots(max_model_len)
    return [point for point in dict.fromkeys(points)
            if point.fits(num_slots, max_num_seqs, max_model_len)]  # fmt: skip
