"""The grid a profile of real vLLM is fitted on: closed batches of controlled shapes.

``task=profile`` times kvbench's own executor on a grid of iteration shapes; this is the same for
vLLM's engine, which cannot be handed an iteration: each grid point is a closed batch of requests
whose steps take the shapes wanted (``referee.vllm_engine.run_waves``). Three kinds of point:

- prefills: ``count`` prompts of one length, each computing its prompt and one token (prompts
  beyond the step's token budget are chunked, as real traffic's are);
- decodes: ``decode_seqs`` requests of one prompt length, decoding ``decode_steps`` tokens (so
  ``decode_steps`` decode-only steps at contexts just past the prompt, where the prompts fit one
  step's token budget; where they do not, the first ones decode beside the others' chunks and
  the decode-only steps after them shrink as those finish);
- mixed: decodes as above, joined once they decode by prompts computed beside them.

Every step the engine runs is recorded with its shape exactly as a replay's (``chunks_shape``),
so the grid's steps and the replays' are priced alike. Points the engine's pool or sequence limit
could not hold at once are left out (a preemption would change the shapes). The lengths below are
for a 256-token context (``experiment=sim_to_vllm``: about a minute of vLLM steps on two CPU
cores, docs/sim_to_real.md); a model of k times that context also gets every length times k, so
the grid reaches the contexts its replays do (a profile fitted on short contexts alone priced
longer ones by extrapolation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from kvbench.core.request import Request

PREFILL_COUNTS = (1, 2, 4)
PREFILL_PROMPTS = (16, 48, 96, 144, 192)
DECODE_SEQS = (1, 2, 3, 4, 5, 6, 7, 8, 16)  # every count of the stair terms, 1-8
DECODE_PROMPTS = (32, 96, 160, 224)
DECODE_STEPS = 6
# Each point is measured this many times, in different parts of the run (``interleave``).
GRID_REPEATS = 2
# Mixed points: (decoding requests, their prompt, the prompts that join them).
MIXED = (
    (2, 32, (64,)), (2, 96, (192,)), (4, 32, (96, 96)), (4, 160, (48,)),
    (8, 32, (192, 192)), (8, 64, (128,)), (14, 32, (16,)),
)  # fmt: skip
BASE_MODEL_LEN = 256  # the context the lengths above are chosen for


@dataclass(frozen=True)
class VllmGridPoint:
    """One closed batch of the grid.

    Attributes:
        decode_seqs: requests that decode (0: a prefill point).
        decode_prompt_tokens: the prompt of each decoding request.
        decode_steps: decode-only tokens each decoding request generates after its first.
        prefill_prompts: prompts computed with one output token each: at once for a prefill
            point, beside the decodes (once every decoding request has its first token) for a
            mixed one.
    """

    decode_seqs: int = 0
    decode_prompt_tokens: int = 0
    decode_steps: int = 0
    prefill_prompts: tuple[int, ...] = ()

    def waves(self, first_request_id: int) -> list[list[Request]]:
        """The point's requests as ``run_waves`` takes them, ids from ``first_request_id``."""
        decodes = [Request(first_request_id + i, 0.0, self.decode_prompt_tokens,
                           self.decode_steps + 1) for i in range(self.decode_seqs)]  # fmt: skip
        first_prefill_id = first_request_id + self.decode_seqs
        prefills = [Request(first_prefill_id + i, 0.0, prompt, 1)
                    for i, prompt in enumerate(self.prefill_prompts)]  # fmt: skip
        return [wave for wave in (decodes, prefills) if wave]

    def num_blocks(self, block_size: int) -> int:
        """KV blocks the point's requests hold at most (all of them at their last token)."""
        decode_tokens = self.decode_prompt_tokens + self.decode_steps + 1
        return self.decode_seqs * -(-decode_tokens // block_size) + sum(
            -(-(prompt + 1) // block_size) for prompt in self.prefill_prompts
        )

    def fits(self, num_free_blocks: int, block_size: int, max_num_seqs: int,
             max_model_len: int) -> bool:  # fmt: skip
        """Whether the engine holds the whole point at once: no preemption, no request waiting
        for a sequence slot, none longer than the model's context."""
        longest = max([self.decode_prompt_tokens + self.decode_steps + 1,
                       *(prompt + 1 for prompt in self.prefill_prompts)])  # fmt: skip
        return (
            self.num_blocks(block_size) <= num_free_blocks
            and self.decode_seqs + len(self.prefill_prompts) <= max_num_seqs
            and longest <= max_model_len
        )


def mixed_decode_steps(num_decodes: int, prefill_prompts: tuple[int, ...],
                       max_num_batched_tokens: int) -> int:  # fmt: skip
    """Decode tokens the decoding requests of a mixed point need to outlast the joining prompts'
    chunks (each step gives the prompts the budget the decodes leave), and two decode-only steps
    after them: where the decoders start together (their prompts fit one step's budget; where
    they do not, the steps run other shapes, each recorded as it ran)."""
    per_step = max_num_batched_tokens - num_decodes
    return -(-sum(prefill_prompts) // per_step) + 2


def length_scales(max_model_len: int, base_model_len: int = BASE_MODEL_LEN) -> tuple[int, ...]:
    """The factors a grid's lengths, chosen for a ``base_model_len`` context, are taken at: 1,
    and ``max_model_len // base_model_len`` where that is more."""
    return tuple(sorted({1, max(1, max_model_len // base_model_len)}))


def scaled_lengths(lengths: tuple[int, ...], scales: tuple[int, ...]) -> list[int]:
    """Every length times every scale, shortest first, each once."""
    return sorted({length * k for k in scales for length in lengths})


Mixed = tuple[int, int, tuple[int, ...]]  # decoding requests, their prompt, the joining prompts


def scaled_mixed(mixed: tuple[Mixed, ...], scales: tuple[int, ...]) -> list[Mixed]:
    """Each mixed point at each scale (its prompts times the scale), scale by scale."""
    return [(num_seqs, prompt * k, tuple(tokens * k for tokens in joining))
            for k in scales for num_seqs, prompt, joining in mixed]  # fmt: skip


def vllm_grid(num_free_blocks: int, block_size: int, max_num_seqs: int,
              max_num_batched_tokens: int, max_model_len: int) -> list[VllmGridPoint]:  # fmt: skip
    """Every point the engine can hold at once, prefills first, then decodes, then mixed; the
    lengths at each of ``length_scales``, shortest first, each point once."""
    scales = length_scales(max_model_len)
    prefill_prompts = scaled_lengths(PREFILL_PROMPTS, scales)
    decode_prompts = scaled_lengths(DECODE_PROMPTS, scales)
    points = [VllmGridPoint(prefill_prompts=(prompt,) * count)
              for count in PREFILL_COUNTS for prompt in prefill_prompts]  # fmt: skip
    points += [VllmGridPoint(num_seqs, prompt, DECODE_STEPS)
               for num_seqs in DECODE_SEQS for prompt in decode_prompts]  # fmt: skip
    points += [
        VllmGridPoint(num_seqs, prompt,
                      mixed_decode_steps(num_seqs, joining, max_num_batched_tokens), joining)
        for num_seqs, prompt, joining in scaled_mixed(MIXED, scales)
    ]  # fmt: skip
    return [point for point in dict.fromkeys(points)
            if point.fits(num_free_blocks, block_size, max_num_seqs, max_model_len)]  # fmt: skip


Point = TypeVar("Point")  # a grid point: vLLM's here, the real executor's in ``real_grid``


def interleave(points: list[Point], num_parts: int) -> list[list[Point]]:
    """``GRID_REPEATS`` copies of ``points`` dealt into ``num_parts`` parts of every kind, to be
    measured between the replays: each part samples the machine at its own time, and a point's
    copies fall in different parts. Copy c of the i-th point goes to part (i + c x step) mod n:
    with step = len(points) mod n this deals the repeated list round-robin, whose part sizes
    differ by at most one; where that is 0 (a grid of a multiple of n points), step 1 keeps the
    copies apart."""
    step = len(points) % num_parts or 1
    parts: list[list[Point]] = [[] for _ in range(num_parts)]
    for copy in range(GRID_REPEATS):
        for index, point in enumerate(points):
            parts[(index + copy * step) % num_parts].append(point)
    return parts
