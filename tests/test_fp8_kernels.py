"""fp8 K/V (e4m3, vLLM's kv_cache_dtype=fp8) read by the decode kernels and dequantized on load,
torch and Triton (the interpreter on a CPU), against a float64 reference.

Two bounds. Against the reference over the *dequantized* K/V (what the cache holds) the query
dtype's (fp16) bound of docs/kernels.md holds: every e4m3 value times a power-of-two scale is exact
in fp16, so dequantizing adds no error. Against the reference over the *unquantized* K/V (what the
model computed) the fp8 rounding shows, bounded from e4m3's unit roundoff u8 = 2^-4: each V element
moves by <= u8 |v| (the output by <= u8 max|V|), and each score by
<= delta = scale x u8 x sum_i |q_i k_i|, which moves the softmax weights by a factor within
exp(+-2 delta), the output by <= (exp(2 delta) - 1) max|V|.
"""

from __future__ import annotations

import pytest
import torch
from kvbench.kernels import (
    contiguous_decode_attention,
    materialize_batch,
    paged_decode_attention,
    reference_contiguous_decode,
    scattered_block_tables,
)

FP8 = torch.float8_e4m3fn
U_FP16, U_FP8 = 2.0**-11, 2.0**-4
K_SCALE, V_SCALE = 0.5, 0.25  # powers of two: dequantization is exact in fp16


def _quantize(tensor: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 storage, its dequantized values in float64)."""
    stored = (tensor.float() / scale).to(FP8)
    return stored, stored.double() * scale


@pytest.mark.parametrize("backend", ["torch", "sdpa", "triton"])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_fp8_kv_is_dequantized_on_load_within_fp8s_bound(backend: str, layout: str) -> None:
    context_lens = [5, 17, 40]
    tables = scattered_block_tables(context_lens, 8, torch.Generator().manual_seed(1))
    batch = materialize_batch(tables, context_lens, 8, num_q_heads=4, num_kv_heads=2, head_dim=16,
                              dtype=torch.float16, seed=3)  # fmt: skip
    lens = batch.layout.context_lens
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    if layout == "paged":
        key_fp8, _ = _quantize(batch.key_cache, K_SCALE)
        value_fp8, _ = _quantize(batch.value_cache, V_SCALE)
        out = paged_decode_attention(batch.query, key_fp8, value_fp8, batch.layout.block_tables,
                                     lens, backend=backend, **scales)  # fmt: skip
    else:
        key_fp8, _ = _quantize(batch.key, K_SCALE)
        value_fp8, _ = _quantize(batch.value, V_SCALE)
        out = contiguous_decode_attention(batch.query, key_fp8, value_fp8, lens, backend=backend,
                                          **scales)  # fmt: skip
    assert out.dtype == torch.float16
    # The contiguous copy of the same logical K/V, quantized the same way (element by element).
    _, key_deq = _quantize(batch.key, K_SCALE)
    _, value_deq = _quantize(batch.value, V_SCALE)
    query = batch.query.double()
    error = (out.double() - reference_contiguous_decode(query, key_deq, value_deq, lens)).abs()
    value_scale = value_deq.abs().max()
    reference = reference_contiguous_decode(query, key_deq, value_deq, lens)
    bound = U_FP16 * (value_scale + reference.abs()) + 1e-5 * value_scale
    assert (error <= bound).all(), f"vs dequantized: {error.max():.3g} > {bound.min():.3g}"
    # Against the unquantized K/V: fp8's own rounding, bounded from the mechanism.
    exact = reference_contiguous_decode(query, batch.key.double(), batch.value.double(), lens)
    grouped = query.view(3, 2, 2, 16)  # [seqs, kv heads, group, head_dim]
    abs_products = torch.einsum("shgd,sthd->shgt", grouped.abs(), batch.key.double().abs())
    delta = abs_products.amax() * U_FP8 / 16**0.5
    fp8_bound = (U_FP8 + torch.expm1(2 * delta)) * batch.value.double().abs().max()
    fp8_error = (out.double() - exact).abs().max()
    assert fp8_error <= fp8_bound + bound.max(), f"vs exact: {fp8_error:.3g} > {fp8_bound:.3g}"
    assert fp8_error > 10 * error.max()  # the fp8 rounding is what shows, not the kernel's


def test_fp8_values_need_the_query_in_a_kernel_dtype() -> None:
    query = torch.zeros(1, 2, 16, dtype=torch.float16)
    key = torch.zeros(1, 4, 2, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"or K/V in torch\.float8_e4m3fn"):
        contiguous_decode_attention(query, key.to(FP8), key, torch.tensor([4], dtype=torch.int32),
                                    backend="torch")  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 0.0173, 3.7])
def test_the_byte_table_dequantizes_every_fp8_value_bit_for_bit_as_the_cast(dtype, scale) -> None:
    from kvbench.kernels import fp8_dequantized

    every_byte = torch.arange(256, dtype=torch.uint8).view(FP8)  # NaN at 0x7F and 0xFF
    rows = every_byte[torch.randperm(256)].view(4, 8, 8).transpose(1, 2)  # not contiguous
    table = fp8_dequantized(rows, scale, dtype)
    cast = (rows.float() * scale).to(dtype)
    assert table.dtype == dtype and table.shape == rows.shape
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(table.contiguous().view(bits), cast.contiguous().view(bits))


def test_the_triton_cache_kernels_move_fp8_as_bytes_bit_for_bit_as_torch(monkeypatch) -> None:
    # The GPU's K/V writes and copy-on-writes on fp8 pools (here under the interpreter): the
    # kernels get bytes (a pointer to Triton's fp8e4nv compiles on compute capability 8.9 or
    # later only), and leave the pools as torch's indexing does, bit for bit.
    from kvbench.kernels import block_copy_triton, copy_blocks, kv_write_triton, write_kv

    kernel_dtypes = []
    for module, name in ((kv_write_triton, "triton_write_kv"),
                         (block_copy_triton, "triton_copy_blocks")):  # fmt: skip
        kernel = getattr(module, name)

        def spy(*tensors, kernel=kernel):
            kernel_dtypes.extend(t.dtype for t in tensors[:-1])  # the last: the slots or pairs
            kernel(*tensors)

        monkeypatch.setattr(module, name, spy)
    generator = torch.Generator().manual_seed(5)
    key, value = (torch.randn(6, 2, 16, generator=generator).to(FP8) for _ in "kv")
    slots = torch.tensor([3, 17, -1, 31, 8, 0])  # -1: a padding token, not written
    pools = {}
    for backend in ("triton", "torch"):
        key_cache, value_cache = (torch.zeros(4, 8, 2, 16, dtype=FP8) for _ in "kv")
        write_kv(key, value, key_cache, value_cache, slots, backend=backend)
        copy_blocks(key_cache, value_cache, [(0, 1), (2, 3)], backend=backend)
        pools[backend] = [cache.view(torch.uint8) for cache in (key_cache, value_cache)]
    assert kernel_dtypes == [torch.uint8] * 6  # 4 tensors written, 2 pools copied
    assert all(torch.equal(a, b) for a, b in zip(pools["triton"], pools["torch"], strict=True))
    assert pools["torch"][0][1].any() and pools["torch"][0][3].any()  # blocks 1 and 3 copied to


def test_triton_reads_fp8_on_gpus_of_compute_capability_8_9_or_later(monkeypatch) -> None:
    from kvbench.kernels import triton_fp8_problem

    assert triton_fp8_problem(torch.device("cpu")) is None  # the interpreter converts in software
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    for capability, readable in (((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None,
                            capability=capability: capability)  # fmt: skip
        problem = triton_fp8_problem(torch.device("cuda"))
        assert (problem is None) == readable, capability
    assert problem is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert triton_fp8_problem(torch.device("cuda")) == (
        "Triton reads fp8 (e4m3) K/V on GPUs of compute capability 8.9 or later, and NVIDIA "
        "A100-SXM4-80GB is 8.0"
    )
