"""executor=real: the scheduler and allocators drive batched forwards of a real model whose K/V
live in the allocator's own memory; greedy outputs equal transformers' stock generation, through
prefix hits, preemption by recompute and by swap. Tiny random Llama: seconds."""

import pytest
import torch

from kvbench.allocators import make_allocator
from kvbench.core.request import Request
from kvbench.engine.scheduler import Scheduler, SchedulerLimits
from kvbench.executors.attention import batch_attention
from kvbench.executors.real import RealExecutor, run_real
from kvbench.executors.token_ids import prompt_ids
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import TINY_GQA, TINY_MHA

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def model():
    return load_model(TINY_GQA)


def _requests() -> list[Request]:
    """Six requests arriving together: two share a 20-token prefix group, lengths vary."""
    shapes = [(12, 9), (27, 5), (33, 14), (8, 11), (30, 7), (25, 10)]
    return [
        Request(request_id=i, arrival_s=0.0, prompt_tokens=prompt, output_tokens=output,
                prefix_group=0 if i in (2, 4) else None, prefix_tokens=20 if i in (2, 4) else 0)
        for i, (prompt, output) in enumerate(shapes)
    ]  # fmt: skip


_STOCK: dict[int, list[int]] = {}


def _stock_outputs(model, requests) -> dict[int, list[int]]:
    """Each request's greedy continuation by transformers' own generate, one at a time (the
    requests are always ``_requests()``: computed once)."""
    if _STOCK:
        return _STOCK
    outputs = _STOCK
    for request in requests:
        prompt = prompt_ids(request, model.config.vocab_size)
        with torch.inference_mode():
            generated = model.generate(torch.tensor([prompt]), max_new_tokens=request.output_tokens,
                                       min_new_tokens=request.output_tokens, do_sample=False)
        outputs[request.request_id] = generated[0].tolist()
    return outputs


def _serve(model, allocator_name, num_slots, preemption="recompute", block_size=8,
           backend="sdpa", kv_dtype=None):  # fmt: skip
    requests = _requests()
    allocator = make_allocator(allocator_name, num_slots, block_size, MAX_MODEL_LEN)
    limits = SchedulerLimits(max_model_len=MAX_MODEL_LEN, preemption=preemption,
                             swap_capacity_tokens=10_000)  # fmt: skip
    scheduler = Scheduler(limits)
    executor = RealExecutor(model, allocator, backend, kv_dtype)
    executor.keep_outputs = True
    run = run_real(requests, scheduler, allocator, executor)
    return requests, run, executor


@pytest.mark.parametrize("allocator", ["naive_max", "naive_oracle", "paged", "paged_prefix"])
def test_outputs_equal_stock_generation(model, allocator):
    requests, run, executor = _serve(model, allocator, num_slots=1024)
    stock = _stock_outputs(model, requests)
    assert executor.outputs == stock
    assert all(record.status == "finished" for record in run.result.requests)
    durations = run.result.steps.columns["duration_s"]
    assert len(durations) == run.num_forwards and min(durations) > 0
    # The pools are the allocator's slots: 2 (K, V) x layers x slots x KV heads x dim x 4 bytes.
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert run.kv_pool_bytes == (2 * config.num_hidden_layers * 1024 * config.num_key_value_heads
                                 * head_dim * 4)  # fmt: skip


def test_prefix_hits_skip_computation_and_keep_the_outputs(model):
    requests, run, executor = _serve(model, "paged_prefix", num_slots=1024)
    cached = {record.request_id: record.cached_prompt_tokens for record in run.result.requests}
    assert cached[4] == 16  # two full 8-token blocks of the shared 20-token prefix
    assert executor.outputs == _stock_outputs(model, requests)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preempted_sequences_continue_exactly(model, preemption):
    # 96 slots: the six requests need 183 at their ends, so the latest arrivals are preempted.
    requests, run, executor = _serve(model, "paged", num_slots=96, preemption=preemption)
    records = run.result.requests
    assert sum(record.num_preemptions for record in records) > 0
    if preemption == "swap":
        assert sum(record.num_swaps for record in records) > 0
    assert executor.outputs == _stock_outputs(model, requests)


@pytest.mark.parametrize(("allocator", "num_slots", "preemption"),
                         [("naive_oracle", 1024, "recompute"), ("paged_prefix", 1024, "recompute"),
                          ("paged", 96, "swap")])  # fmt: skip
def test_the_triton_kernel_decodes_the_stock_outputs(model, allocator, num_slots, preemption):
    # A GPU's decode path (executor.decode_backend=triton), here under Triton's CPU interpreter:
    # the contiguous arena, shared prefix blocks, and swapped sequences' new blocks.
    requests, run, executor = _serve(model, allocator, num_slots, preemption, backend="triton")
    assert executor.outputs == _stock_outputs(model, requests)
    if preemption == "swap":
        assert sum(record.num_swaps for record in run.result.requests) > 0


def test_fp8_pools_through_the_triton_kernels_decode_what_the_torch_kernels_do(model):
    # A GPU's path with fp8 pools, here under the interpreter: Triton's cache kernels write and
    # swap the bytes, its decode kernel dequantizes them; the torch kernels' tokens, on the same
    # fp8 pools (fp8 rounding moves both off the stock outputs alike).
    _, _, reference = _serve(model, "paged", 96, "swap", backend="torch", kv_dtype="fp8")
    _, run, executor = _serve(model, "paged", 96, "swap", backend="triton", kv_dtype="fp8")
    assert executor.memory.keys[0].dtype == torch.float8_e4m3fn
    assert (executor.memory.cache_backend, reference.memory.cache_backend) == ("triton", "torch")
    assert sum(record.num_swaps for record in run.result.requests) > 0
    assert executor.outputs == reference.outputs


def test_the_triton_kernel_on_the_cpu_needs_the_interpreter(model, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    allocator = make_allocator("paged", 256, 8, MAX_MODEL_LEN)
    with pytest.raises(ValueError, match="use sdpa or torch there"):
        RealExecutor(model, allocator, "triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["triton", "sdpa"])
@pytest.mark.parametrize(("allocator", "num_slots", "preemption"),
                         [("naive_oracle", 1024, "recompute"), ("paged_prefix", 1024, "recompute"),
                          ("paged", 96, "swap")])  # fmt: skip
def test_on_a_gpu_the_outputs_equal_stock_generation(allocator, num_slots, preemption, backend):
    # The model, the pools and the kernels on the GPU, swap space in host memory; the stock
    # outputs generated on the GPU too (a device's own rounding decides near ties).
    gpu_model = load_model(TINY_GQA).to("cuda")
    requests, run, executor = _serve(gpu_model, allocator, num_slots, preemption,
                                     backend=backend)  # fmt: skip
    assert executor.memory.keys[0].device.type == "cuda"
    for request in requests:
        prompt = prompt_ids(request, gpu_model.config.vocab_size)
        with torch.inference_mode():
            generated = gpu_model.generate(
                torch.tensor([prompt], device="cuda"), max_new_tokens=request.output_tokens,
                min_new_tokens=request.output_tokens, do_sample=False,
            )  # fmt: skip
        assert executor.outputs[request.request_id] == generated[0].tolist()
    assert run.peak_device_bytes >= run.kv_pool_bytes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_fp8_pools_decode_through_triton_what_they_do_through_torch():
    # fp8 pools on the GPU, written, copied and swapped by Triton's cache kernels (bit for bit
    # as torch's: kernels/gpu_check.py): Triton's decode kernel (compute capability 8.9 or
    # later) against the torch decode kernel's tokens, both through swaps.
    from kvbench.kernels import triton_fp8_problem

    gpu_model = load_model(TINY_GQA).to("cuda")
    problem = triton_fp8_problem(gpu_model.device)
    if problem:
        pytest.skip(problem)
    _, _, reference = _serve(gpu_model, "paged", 96, "swap", backend="torch", kv_dtype="fp8")
    _, run, executor = _serve(gpu_model, "paged", 96, "swap", backend="triton", kv_dtype="fp8")
    assert executor.memory.keys[0].device.type == "cuda"
    assert executor.memory.keys[0].dtype == torch.float8_e4m3fn
    assert sum(record.num_swaps for record in run.result.requests) > 0
    assert executor.outputs == reference.outputs


def test_requests_arrive_on_the_wall_clock(model):
    requests = [Request(request_id=i, arrival_s=0.05 * i, prompt_tokens=6, output_tokens=3)
                for i in range(3)]  # fmt: skip
    allocator = make_allocator("paged", 256, 8, MAX_MODEL_LEN)
    executor = RealExecutor(model, allocator)
    run = run_real(requests, Scheduler(SchedulerLimits(max_model_len=MAX_MODEL_LEN)), allocator,
                   executor)  # fmt: skip
    for record in run.result.requests:
        assert record.admit_s >= record.arrival_s
        assert record.first_token_s > record.admit_s


def test_each_step_records_the_idle_wait_before_it(model):
    # A clock the loop's sleeps move forward at once: the waits are exact, the test quick.
    import time

    slept_s = [0.0]

    def clock() -> float:
        return time.perf_counter() + slept_s[0]

    def sleep(seconds: float) -> None:
        slept_s[0] += seconds

    requests = [Request(0, 1.0, 6, 3), Request(1, 1.0, 6, 2), Request(2, 10.0, 6, 2)]
    allocator = make_allocator("paged", 256, 8, MAX_MODEL_LEN)
    run = run_real(requests, Scheduler(SchedulerLimits(max_model_len=MAX_MODEL_LEN)), allocator,
                   RealExecutor(model, allocator), clock=clock, sleep=sleep)  # fmt: skip
    starts = list(run.result.steps.columns["time_s"])
    ends = [start + d for start, d in zip(starts, run.result.steps.columns["duration_s"],
                                          strict=True)]  # fmt: skip
    last = next(i for i, start in enumerate(starts) if start >= 10.0)  # request 2's prefill
    # The first step waited from the run's start, request 2's from the end of the step before to
    # its own start, when request 2 arrived (the real time the loop takes between its clock reads
    # around the sleep falls in the wait: about 10 us, so the start is the arrival to 0.01 s).
    assert run.idle_before_s[0] == starts[0] == pytest.approx(1.0, abs=0.01)
    assert run.idle_before_s[last] == pytest.approx(starts[last] - ends[last - 1])
    assert starts[last] == pytest.approx(10.0, abs=0.01)
    assert [i for i, idle_s in enumerate(run.idle_before_s) if idle_s] == [0, last]


@pytest.mark.parametrize("kwarg", ["sliding_window", "softcap", "s_aux"])
def test_attention_variants_the_kernels_do_not_compute_are_refused(kwarg):
    module = torch.nn.Module()
    module.layer_idx = 3
    query = torch.zeros(1, 4, 2, 8)  # [1, num_q_heads, num_tokens, head_dim]
    key = torch.zeros(1, 2, 2, 8)  # [1, num_kv_heads, num_tokens, head_dim]
    with pytest.raises(NotImplementedError, match=f"layer 3 asks for {kwarg}"):
        batch_attention(module, query, key, key, None, kvbench_batch=object(), **{kwarg: 4096})


@pytest.mark.parametrize(
    ("num_slots", "block_size", "prefills", "decode_position", "unlimited_prefills"), [
        (64, 4, [16, 16, 8], 16, [16]),  # 40 tokens, as sequences of the model's longest (16)
        (8, 4, [7, 7, 7, 7, 7, 5], 7, [7, 7, 2]),  # a pool of 8 slots: sequences of at most 7
    ])  # fmt: skip
def test_warm_up_prefills_the_largest_step_once_per_process_and_writes_nothing(
        model, monkeypatch, num_slots, block_size, prefills, decode_position,
        unlimited_prefills):  # fmt: skip
    from kvbench.executors import real

    monkeypatch.setattr(real, "_warmed_tokens", {})
    limits = SchedulerLimits(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=40)
    forwards = []
    for _ in range(2):  # a second executor of the process runs the decode alone
        executor = RealExecutor(model, make_allocator("paged", num_slots, block_size, 16))
        monkeypatch.setattr(executor.runner, "forward", lambda inputs, run=executor.runner.forward:
                            forwards.append(inputs) or run(inputs))  # fmt: skip
        executor.warm_up(limits)
        assert all((pool == 0).all() for pool in (*executor.memory.keys, *executor.memory.values))
    # Another model of the process warms up its own.
    other = RealExecutor(load_model(TINY_MHA), make_allocator("paged", num_slots, block_size, 16))
    monkeypatch.setattr(other.runner, "forward", lambda inputs, run=other.runner.forward:
                        forwards.append(inputs) or run(inputs))  # fmt: skip
    other.warm_up(limits)
    first_prefill, first_decode, second_decode, other_prefill, _ = forwards
    assert [len(seq.token_ids) for seq in first_prefill] == prefills
    assert [len(seq.token_ids) for seq in other_prefill] == prefills
    assert all(seq.num_unwritten == len(seq.token_ids) for seq in first_prefill)
    for decode in (first_decode, second_decode):
        (seq,) = decode
        assert (seq.first_position, seq.num_unwritten) == (decode_position, 1)
    # Without limits: a 16-token prefill.
    monkeypatch.setattr(real, "_warmed_tokens", {})
    forwards.clear()
    executor.warm_up()
    assert [len(seq.token_ids) for seq in forwards[0]] == unlimited_prefills
