"""executors.kv_memory.KVMemory: the pools' reads, fp8 storage and swap space: milliseconds."""

import torch

from kvbench.executors.kv_memory import KVMemory, calibrated_scales

FP8 = torch.float8_e4m3fn


def _memory(kv_dtype=None, calibrate_scales=False, num_layers=1) -> KVMemory:
    return KVMemory(num_layers=num_layers, num_kv_heads=2, head_dim=3, num_slots=8, block_size=4,
                    dtype=torch.float32, kv_dtype=kv_dtype,
                    calibrate_scales=calibrate_scales)  # fmt: skip


def _tokens(scale: float, num_tokens: int = 4, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(num_tokens, 2, 3, generator=generator)  # [tokens, heads, dim]


def test_gather_padded_reads_each_rows_slots_and_zeros_its_pads():
    memory = _memory()
    rows = torch.arange(8 * 2 * 3, dtype=torch.float32).view(8, 2, 3) + 1  # [slots, heads, dim]
    memory.write(0, rows, -rows, torch.arange(8))
    slots = torch.tensor([[5, 2, -1], [-1, 7, 0]])  # [seqs, width]
    keys, values = memory.gather_padded(0, slots)
    assert keys.shape == (2, 2, 3, 3) and keys.is_contiguous()  # [seqs, heads, width, dim]
    assert torch.equal(keys[0, :, 0], rows[5]) and torch.equal(keys[0, :, 1], rows[2])
    assert torch.equal(keys[1, :, 1], rows[7]) and torch.equal(values[1, :, 2], -rows[0])
    assert not keys[0, :, 2].any() and not values[1, :, 0].any()


def test_a_float_pool_gives_back_exactly_what_was_written():
    memory = _memory()
    key, value = _tokens(1.0), _tokens(1.0, seed=1)
    memory.write(0, key, value, torch.tensor([6, 1, 3, 4]))
    keys, values = memory.gather(0, torch.tensor([6, 1, 3, 4]))  # [1, heads, tokens, dim]
    assert torch.equal(keys[0].transpose(0, 1), key)
    assert torch.equal(values[0].transpose(0, 1), value)


def test_an_fp8_pool_stores_a_byte_per_element_and_reads_back_in_the_models_dtype():
    memory = _memory(FP8, calibrate_scales=True)
    assert memory.keys[0].dtype == FP8
    assert memory.pool_bytes * 4 == _memory().pool_bytes
    key, value = _tokens(1e-3), _tokens(5e-4, seed=1)  # tiny: only calibrated scales keep them
    memory.write(0, key, value, torch.arange(4))
    assert memory.scales[0] == calibrated_scales(key, value)
    keys, _ = memory.gather_padded(0, torch.arange(4)[None])  # [1, heads, tokens, dim]
    assert keys.dtype == torch.float32
    read = keys[0].transpose(0, 1)  # [tokens, heads, dim]
    assert not torch.equal(read, key)  # rounded to e4m3 ...
    assert float(((read - key).abs() / key.abs()).max()) <= 2.0**-4  # ... by its 2^-4 at most


def test_calibrated_scales_are_set_by_each_layers_first_write_then_kept():
    memory = _memory(FP8, calibrate_scales=True, num_layers=2)
    key, value = _tokens(1e-3), _tokens(5e-4, seed=1)
    memory.write(0, key, value, torch.arange(4))
    first = calibrated_scales(key, value)
    assert memory.scales == [first, (1.0, 1.0)]
    memory.write(0, _tokens(9.0, seed=2), _tokens(9.0, seed=3), torch.arange(4, 8))
    assert memory.scales[0] == first


def test_a_swapped_fp8_sequence_comes_back_as_stored_not_scaled_twice():
    memory = _memory(FP8, calibrate_scales=True)
    memory.write(0, _tokens(1e-2), _tokens(1e-2, seed=1), torch.arange(4))
    before = memory.gather(0, torch.arange(4))
    memory.swap_out(7, torch.arange(4))
    memory.swap_in(7, torch.arange(4, 8))  # other slots, as after a preemption
    after = memory.gather(0, torch.arange(4, 8))
    assert all(torch.equal(old, new) for old, new in zip(before, after, strict=True))
    assert memory.swapped_bytes == 0


def test_calibrated_fp8_keeps_tiny_values_that_unit_scales_flush_to_zero():
    """K of magnitude 1e-3 lies below e4m3's smallest subnormal (2^-9): unit scales store 0,
    calibrated scales keep e4m3's 2^-4 relative rounding."""
    key, value = _tokens(1e-3), _tokens(1e-3, seed=1)
    errors = {}
    for calibrate in (False, True):
        memory = _memory(FP8, calibrate_scales=calibrate)
        memory.write(0, key, value, torch.arange(4))
        read = memory.gather(0, torch.arange(4))[0][0].transpose(0, 1)  # [tokens, heads, dim]
        errors[calibrate] = float(((read - key).abs() / key.abs()).max())
    assert errors[False] > 0.5 and errors[True] <= 2.0**-4


def test_an_fp8_pool_saturates_values_beyond_its_range():
    memory = _memory(FP8)
    memory.write(0, _tokens(0.0) + 1000.0, _tokens(0.0) - 1000.0, torch.arange(4))
    assert float(memory.keys[0].float().max()) == 448.0
    assert float(memory.values[0].float().min()) == -448.0


def test_noise_fills_every_slot_with_normal_k_v_stored_as_writes_store_them():
    fp32, fp8 = _memory(num_layers=2), _memory(FP8, num_layers=2)
    for memory in (fp32, fp8):
        memory.fill_noise(seed=3)
    for layer in range(2):
        for fp32_pool, fp8_pool in ((fp32.keys[layer], fp8.keys[layer]),
                                    (fp32.values[layer], fp8.values[layer])):  # fmt: skip
            assert fp8_pool.dtype == FP8
            assert torch.equal(fp8_pool, fp32_pool.to(FP8))  # the same noise, stored in fp8
    every = torch.cat([pool.flatten() for pool in (*fp32.keys, *fp32.values)])  # a draw of 48, x4
    assert (every != 0).all() and 0.7 < float(every.std()) < 1.3
    assert all(torch.equal(pool, fp32.keys[0]) for pool in (*fp32.keys, *fp32.values))  # one draw
    again = _memory(num_layers=2)
    again.fill_noise(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(again.values, fp32.values, strict=True))
