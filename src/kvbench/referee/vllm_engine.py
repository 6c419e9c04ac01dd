"""Real vLLM serving a real model on this machine: the timed referee of kvbench's executors.

``serve_on_vllm(requests, settings)`` (or ``start_vllm`` once, then ``replay`` per workload, or
``run_waves`` for closed batches whose shapes are set by step: a profile's grid)
starts vLLM's own engine (``vllm.LLM``, in this process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, eager mode) on a local Hugging Face model folder (SmolLM2-135M
as ``task=logit_equivalence`` converts it, or any other), sizes its KV pool in blocks exactly as
kvbench's ``allocator.num_gpu_blocks`` does (vLLM's ``num_gpu_blocks_override``), and replays the
requests on the wall clock: each is added when its ``arrival_s`` has passed, with its prompt as
token ids (``referee.token_ids``: shared prefixes stay shared, so prefix caching sees kvbench's
prefix identity), greedy, EOS ignored, ``max_tokens`` = its output tokens. Each engine step is
timed and its schedule read from vLLM's scheduler (one ``schedule()`` per step: the CPU platform
schedules synchronously), so a profile can be fitted on vLLM's own step times and kvbench's
predictions compared request by request (issue 16).

Installing: the referee's requirements plus ``requirements/referee-engine.txt`` (the packages
vLLM's model loader imports on top of its scheduler's; docs/referee.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvbench.core.catalog import hf_kv_shape
from kvbench.core.request import Request
from kvbench.engine.cost_model import IterationShape
from kvbench.engine.simulate_v1 import chunks_shape
from kvbench.referee.token_ids import prompt_token_ids
from kvbench.referee.vllm_v1 import _import_vllm

# vLLM's CPU attention backend takes blocks in multiples of 32 tokens (it refuses 16).
CPU_BLOCK_MULTIPLE = 32


@dataclass(frozen=True)
class EngineSettings:
    """How the real engine is started.

    Attributes:
        model_dir: a local Hugging Face model folder (config.json and weights; no tokenizer needed).
        num_gpu_blocks: KV blocks in the pool, vLLM's ``num_gpu_blocks_override`` (null block
            included, as kvbench's ``allocator.num_gpu_blocks``).
        block_size: tokens per block (a multiple of 32 on vLLM's CPU backend).
        max_num_seqs: most requests running at once.
        max_num_batched_tokens: token budget of one step (chunked prefill).
        max_model_len: longest prompt + output.
        enable_prefix_caching: vLLM's automatic prefix caching.
        dtype: the model's compute dtype (``float32`` or ``bfloat16``).
        kv_cache_dtype: vLLM's ``kv_cache_dtype``: ``auto`` (the model's dtype) or ``fp8``
            (e4m3 at unit scales, one byte per element; vLLM's CPU attention reads it on x86
            with AVX-512 or AMX, at head sizes that are multiples of 32).
    """

    model_dir: Path
    num_gpu_blocks: int
    block_size: int = CPU_BLOCK_MULTIPLE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_prefix_caching: bool = False
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class EngineStep:
    """One engine step as it ran.

    Attributes:
        start_s: when ``LLMEngine.step()`` began, seconds after the replay's start.
        duration_s: its wall time (schedule, forward pass, sampling, outputs).
        scheduled_tokens: (request id, tokens computed) of the step, in vLLM's order.
        shape: what the step computed (``engine.simulate_v1.chunks_shape`` of its requests:
            prefill chunks with their context, prefix hits included, and decode tokens), what a
            cost model prices.
        num_blocks_in_use: KV blocks held by requests right after the step was scheduled (the
            pool less its free queue and the null block).
    """

    start_s: float
    duration_s: float
    scheduled_tokens: tuple[tuple[int, int], ...]
    shape: IterationShape
    num_blocks_in_use: int

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of prompts (chunks included) and of recomputed inputs."""
        return self.shape.num_prefill_tokens

    @property
    def num_decode_tokens(self) -> int:
        """Generated tokens fed back (one per decoding request)."""
        return self.shape.num_decode_tokens


@dataclass(frozen=True)
class EngineRequest:
    """One request's times, in seconds after the replay's start.

    Attributes:
        request_id: the kvbench request's id.
        arrival_s: when it was handed to the engine (its trace arrival, or later if a step
            was running then).
        first_token_s: when the step that produced its first token ended.
        finish_s: when the step that produced its last token ended.
        num_output_tokens: tokens generated (its ``output_tokens``).
    """

    request_id: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    num_output_tokens: int


@dataclass(frozen=True)
class EngineRun:
    """A replay through the real engine: its steps, its requests, the engine's start-up time,
    and the wall-clock time the replay started (Unix seconds: steps of several replays placed
    on one time line show the machine's drift)."""

    steps: tuple[EngineStep, ...]
    requests: tuple[EngineRequest, ...]
    startup_s: float
    started_unix_s: float = 0.0


@dataclass(frozen=True)
class _Schedule:
    """One ``schedule()`` as recorded: per request (kvbench id, prompt tokens, tokens computed
    before the step, prefix hits included, tokens scheduled), and the blocks then in use."""

    scheduled: tuple[tuple[int, int, int, int], ...]
    num_blocks_in_use: int


@dataclass
class VllmEngine:
    """A started vLLM engine, ready to replay workloads one after the other (``replay``)."""

    settings: EngineSettings
    llm: Any
    startup_s: float
    vocab_size: int
    schedules: list[_Schedule]


def start_vllm(settings: EngineSettings, clock: Callable[[], float] = time.perf_counter
               ) -> VllmEngine:  # fmt: skip
    """Start vLLM's engine as ``settings`` say (about half a minute on this CPU: one start serves
    many replays). Raises ``RefereeUnavailable`` (one line) where vLLM is not installed, and
    ValueError (one line) for K/V it cannot hold in fp8 here (``fp8_problem``)."""
    problem = fp8_problem(settings)
    if problem:
        raise ValueError(problem)
    started_s = clock()
    llm = _start_engine(settings)
    return VllmEngine(settings, llm, clock() - started_s,
                      llm.llm_engine.model_config.get_vocab_size(), _record_schedules(llm))


def serve_on_vllm(
    requests: Sequence[Request],
    settings: EngineSettings,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> EngineRun:
    """Start an engine and replay ``requests`` through it (``start_vllm``, then ``replay``)."""
    _check(requests, settings)
    return replay(start_vllm(settings, clock), requests, clock, sleep)


def replay(
    engine: VllmEngine,
    requests: Sequence[Request],
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> EngineRun:
    """Replay ``requests`` (by ``arrival_s``) through the started ``engine``; every request runs
    to its ``output_tokens``. The prefix cache is emptied first, so one replay's blocks never
    serve the next. Raises ``ValueError`` for a request the engine would refuse."""
    _check(requests, engine.settings)
    progress = _Progress.start(engine, clock)
    core = engine.llm.llm_engine
    pending = sorted(range(len(requests)), key=lambda index: requests[index].arrival_s)
    while pending or core.has_unfinished_requests():
        now_s = progress.now_s()
        while pending and requests[pending[0]].arrival_s <= now_s:
            index = pending.pop(0)
            progress.add(requests[index], index, now_s)
        if not core.has_unfinished_requests():
            sleep(max(0.0, requests[pending[0]].arrival_s - now_s))
            continue
        progress.step()
    return progress.run()


def run_waves(
    engine: VllmEngine,
    waves: Sequence[Sequence[Request]],
    clock: Callable[[], float] = time.perf_counter,
) -> EngineRun:
    """Serve closed batches whose shapes are set by step, not by the clock (a profile's grid):
    the first wave joins at once, each next one as soon as every request before it has its first
    token (so a wave's prompts are computed beside the earlier waves' decodes), and every request
    runs to its ``output_tokens``. Each request's ``arrival_s`` is ignored; its ``arrival_s`` in
    the run is when it was handed to the engine. The prefix cache is emptied first."""
    requests = [request for wave in waves for request in wave]
    _check(requests, engine.settings)
    progress = _Progress.start(engine, clock)
    core = engine.llm.llm_engine
    index = 0
    for wave in waves:
        while any(request_id not in progress.first_token for request_id in progress.arrived):
            progress.step()
        now_s = progress.now_s()
        for request in wave:
            progress.add(request, index, now_s)
            index += 1
    while core.has_unfinished_requests():
        progress.step()
    return progress.run()


@dataclass
class _Progress:
    """One run on the engine as it goes: when each request joined, got its first token and
    finished, and every step (times in seconds after the run's start)."""

    engine: VllmEngine
    clock: Callable[[], float]
    start_s: float
    started_unix_s: float
    arrived: dict[int, float] = field(default_factory=dict)
    first_token: dict[int, float] = field(default_factory=dict)
    finished: dict[int, tuple[float, int]] = field(default_factory=dict)
    steps: list[EngineStep] = field(default_factory=list)

    @classmethod
    def start(cls, engine: VllmEngine, clock: Callable[[], float]) -> _Progress:
        engine.llm.reset_prefix_cache()
        engine.schedules.clear()
        return cls(engine, clock, clock(), time.time())

    def now_s(self) -> float:
        return self.clock() - self.start_s

    def add(self, request: Request, index: int, now_s: float) -> None:
        _add(self.engine.llm.llm_engine, request, index, self.engine.vocab_size)
        self.arrived[request.request_id] = now_s

    def step(self) -> None:
        step_start_s = self.now_s()
        outputs = self.engine.llm.llm_engine.step()
        step_end_s = self.now_s()
        self.steps.append(_step_record(step_start_s, step_end_s, self.engine.schedules.pop()))
        for output in outputs:
            request_id = _kvbench_id(output.request_id)
            if output.outputs and output.outputs[0].token_ids:
                self.first_token.setdefault(request_id, step_end_s)
            if output.finished:
                self.finished[request_id] = (step_end_s, len(output.outputs[0].token_ids))

    def run(self) -> EngineRun:
        return EngineRun(
            steps=tuple(self.steps),
            requests=tuple(
                EngineRequest(request_id, self.arrived[request_id], self.first_token[request_id],
                              *self.finished[request_id])
                for request_id in sorted(self.arrived)
            ),
            startup_s=self.engine.startup_s,
            started_unix_s=self.started_unix_s,
        )  # fmt: skip


def _check(requests: Sequence[Request], settings: EngineSettings) -> None:
    if settings.block_size % CPU_BLOCK_MULTIPLE:
        raise ValueError(f"block_size={settings.block_size}: vLLM's CPU attention takes multiples "
                         f"of {CPU_BLOCK_MULTIPLE} tokens")  # fmt: skip
    pool_tokens = (settings.num_gpu_blocks - 1) * settings.block_size  # less the null block
    if pool_tokens < settings.max_model_len:
        raise ValueError(f"num_gpu_blocks={settings.num_gpu_blocks}: {pool_tokens} tokens cannot "
                         f"hold one request of max_model_len={settings.max_model_len}, which vLLM "
                         "refuses at start; lower max_model_len or give more blocks")  # fmt: skip
    for request in requests:
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError(f"request {request.request_id}: the engine needs a prompt and at "
                             "least one output token")  # fmt: skip
        if request.prompt_tokens + request.output_tokens > settings.max_model_len:
            raise ValueError(f"request {request.request_id}: {request.prompt_tokens} + "
                             f"{request.output_tokens} tokens exceed max_model_len="
                             f"{settings.max_model_len}")  # fmt: skip


def cpu_fp8_problem() -> str | None:
    """Why vLLM's CPU attention cannot read fp8 K/V on this CPU (None: it can): its fp8 kernels
    need x86 with AVX-512 or AMX (vLLM 0.32's ``cpu_attn._get_attn_isa``; torch reports an AMX
    CPU as AVX512)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        return None
    return (f"vLLM's CPU attention reads fp8 K/V on x86 with AVX-512 or AMX, and this CPU's "
            f"vector instructions are {capability}")  # fmt: skip


def fp8_problem(settings: EngineSettings) -> str | None:
    """Why vLLM cannot hold ``settings``' K/V as they ask here (None: it can): fp8 needs this
    CPU (``cpu_fp8_problem``) and a head size that is a multiple of 32."""
    if settings.kv_cache_dtype == "auto":
        return None
    if settings.kv_cache_dtype != "fp8":
        return f"kv_cache_dtype={settings.kv_cache_dtype!r}: allowed are auto and fp8"
    problem = cpu_fp8_problem()
    if problem:
        return f"fp8 K/V: {problem}; keep K/V in the model's dtype"
    head_size = _kv_shape(settings)[2]
    if head_size % 32:
        return (f"fp8 K/V: vLLM's CPU attention reads them at head sizes that are multiples of "
                f"32, and the model's is {head_size}; keep K/V in the model's dtype")
    return None


def _start_engine(settings: EngineSettings) -> Any:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    _import_vllm()  # one line naming the install command where vLLM is missing
    from vllm import LLM

    # Typed Any: vLLM types dtype as a Literal of its names, which a str setting cannot satisfy.
    dtype: Any = settings.dtype
    return LLM(
        model=str(settings.model_dir),
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype=dtype,
        block_size=settings.block_size,
        num_gpu_blocks_override=settings.num_gpu_blocks,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        enable_prefix_caching=settings.enable_prefix_caching,
        kv_cache_dtype=settings.kv_cache_dtype,
        # The pool's own bytes, not a share of the machine: vLLM's CPU worker otherwise asks for
        # gpu_memory_utilization x the NUMA node's memory minus this process's resident set, and
        # refuses to start in a process already holding more (a test worker that loaded models).
        kv_cache_memory_bytes=pool_bytes(settings),
        seed=0,
    )


def pool_bytes(settings: EngineSettings) -> int:
    """Bytes of the engine's KV pool: ``num_gpu_blocks`` blocks of K and V for every layer, at the
    model folder's ``config.json`` shape (KV heads x head size) and the K/V dtype (the compute
    dtype's, or one byte in fp8)."""
    num_layers, num_kv_heads, head_size = _kv_shape(settings)
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[settings.dtype]
    if settings.kv_cache_dtype == "fp8":
        dtype_bytes = 1
    bytes_per_token = 2 * num_layers * num_kv_heads * head_size * dtype_bytes
    return settings.num_gpu_blocks * settings.block_size * bytes_per_token


def _kv_shape(settings: EngineSettings) -> tuple[int, int, int]:
    """(layers, KV heads, head size) of the model folder's ``config.json``."""
    config = json.loads((settings.model_dir / "config.json").read_text())
    return hf_kv_shape(SimpleNamespace(**config))


def _record_schedules(llm: Any) -> list[_Schedule]:
    """A list the engine's scheduler appends each step's ``_Schedule`` to (the last entry is the
    step that just ran). vLLM's ``schedule()`` advances each scheduled request's computed tokens
    by what it scheduled (after its prefix hit), so what was computed before is the difference.
    """
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    schedule = scheduler.schedule
    block_pool = scheduler.kv_cache_manager.block_pool
    recorded: list[_Schedule] = []

    def recording_schedule(*args: Any, **kwargs: Any) -> Any:
        output = schedule(*args, **kwargs)
        step = []
        for request_id, tokens in output.num_scheduled_tokens.items():
            state = scheduler.requests[request_id]
            step.append((_kvbench_id(request_id), state.num_prompt_tokens,
                         state.num_computed_tokens - tokens, tokens))  # fmt: skip
        # Less the null block, which is never free.
        in_use = block_pool.num_gpu_blocks - 1 - block_pool.get_num_free_blocks()
        recorded.append(_Schedule(tuple(step), in_use))
        return output

    scheduler.schedule = recording_schedule
    return recorded


def _kvbench_id(vllm_request_id: str) -> int:
    """The kvbench request id in vLLM's (vLLM appends ``-<random suffix>`` to the one given)."""
    return int(vllm_request_id.split("-", 1)[0])


def _add(engine: Any, request: Request, index: int, vocab_size: int) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # kvbench's ids name prefix identity; the model needs ids of its vocabulary (a collision of
    # whole blocks after the modulo is as unlikely as one of vLLM's block hashes).
    token_ids = [token_id % vocab_size for token_id in prompt_token_ids(request, index)]
    params = SamplingParams(max_tokens=request.output_tokens, ignore_eos=True, temperature=0.0,
                            detokenize=False)  # fmt: skip
    engine.add_request(str(request.request_id), TokensPrompt(prompt_token_ids=token_ids), params)


def _step_record(start_s: float, end_s: float, recorded: _Schedule) -> EngineStep:
    return EngineStep(
        start_s=start_s,
        duration_s=end_s - start_s,
        scheduled_tokens=tuple((entry[0], entry[3]) for entry in recorded.scheduled),
        shape=chunks_shape(entry[1:] for entry in recorded.scheduled),
        num_blocks_in_use=recorded.num_blocks_in_use,
    )
