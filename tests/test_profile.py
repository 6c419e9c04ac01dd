"""task=profile and executor=profiled: the fit recovers known coefficients, the profiled cost model
prices shapes by its terms, the profile file round-trips, and the grid's points time on a real
(tiny) model."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import assert_least_squares_optimum, compose_config, forbid_model_load

from kvbench.config import ConfigError
from kvbench.core.catalog import get_deployment
from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import (
    OPTIONAL_TERMS,
    PROFILE_TERMS,
    ProfiledCostModel,
    iteration_features,
    signed_terms,
)
from kvbench.tasks.profile.fit import abs_pct_errors, fit_relative, free_signed_terms
from kvbench.tasks.profile.grid import (
    IterationPoint,
    SwapPoint,
    beyond_grid,
    grid_shapes,
    iteration_grid,
    longest_prompt_tokens,
    longest_sequence_tokens,
    point_shape,
    spread_contexts,
)
from kvbench.tasks.profile.profile_file import (
    load_profiled_cost_model,
    profile_file_name,
    recorded_grid,
    setup_differences,
    write_profile,
)

COEFFICIENTS = {
    "fixed_s": 0.02, "per_seq_s": 4e-4, "per_token_s": 3e-3, "per_prefill_pair_s": 2e-7,
    "per_context_token_s": 1e-6, "per_context_block_s": 5e-6, "per_mean_context_s": 2e-5,
    "per_mixed_step_s": 4e-3, "swap_per_token_s": 1e-6, "swap_per_block_s": 3e-6,
}  # fmt: skip
# A matmul library's stairs, not monotone (as MKL's on this project's AMD EPYC): 25 ms more
# from 2 rows, 15 more from 3, 22 less from 4, 9 more from 6, a bump at 7 and at 11, 3 more
# from 16 (the level of the line past the table of counts).
STAIRS = {"stair_2_tokens_s": 0.025, "stair_3_tokens_s": 0.015, "stair_4_tokens_s": -0.022,
          "stair_5_tokens_s": -2e-3, "stair_6_tokens_s": 9e-3, "stair_7_tokens_s": 0.02,
          "stair_8_tokens_s": -0.028, "stair_9_tokens_s": 6e-3, "stair_10_tokens_s": 0.0,
          "stair_11_tokens_s": 0.018, "stair_12_tokens_s": -0.02, "stair_13_tokens_s": 1e-3,
          "stair_14_tokens_s": 8e-3, "stair_15_tokens_s": -7e-3,
          "stair_16_tokens_s": 3e-3}  # fmt: skip
# A per-token slope that steepens past 64 and 256 tokens (the cpu grid's steps stop at 512, so
# it cannot tell a slope past 1,024: its fit gives that 0).
HINGES = {"per_token_past_64_s": 5e-4, "per_token_past_256_s": 2e-4,
          "per_token_past_1024_s": 0.0}  # fmt: skip


def _cpu_grid() -> tuple[object, int]:
    """profile_grid=cpu (the default) and SmolLM2's K/V bytes a token."""
    cfg, deployment, _ = compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                                        "model.dtype=fp32")  # fmt: skip
    return cfg.profile_grid, deployment.model.kv_bytes_per_token


def _grid_shapes() -> list[tuple[IterationShape, int]]:
    return [(point_shape(point), point.block_size) for point in iteration_grid(*_cpu_grid())]


def test_the_fit_recovers_the_coefficients_that_made_the_times():
    coefficients = COEFFICIENTS | STAIRS | HINGES
    model = ProfiledCostModel(coefficients, 16)
    shapes = _grid_shapes()
    features = [iteration_features(shape, block_size) for shape, block_size in shapes]
    times = [ProfiledCostModel(coefficients, b).iteration_time_s(s) for s, b in shapes]
    fitted = fit_relative(features, times, signed_terms(PROFILE_TERMS))
    expected = [coefficients[term] for term in PROFILE_TERMS]
    assert fitted == pytest.approx(expected, rel=1e-6)
    assert model.iteration_time_s(IterationShape(0, 0, 0, 0)) == 0.0


def test_the_fit_keeps_coefficients_non_negative():
    # Times that fall with the batch: an unconstrained fit would give per_seq_s < 0.
    features = [(1.0, float(n)) for n in range(1, 9)]
    times = [0.1 - 0.001 * n for n in range(1, 9)]
    fitted = fit_relative(features, times)
    assert (fitted >= 0).all() and fitted[1] == 0.0
    assert np.median(abs_pct_errors(np.asarray(features) @ fitted, times)) < 5


def test_the_fit_is_the_best_non_negative_one_on_noisy_times():
    # Noisy times of a five-term model: whichever terms come out 0, no other choice of
    # non-negative coefficients prices the points closer. (Seed 11 is one where dropping the
    # most negative term and refitting stops short of the optimum.)
    true_s = np.array([0.01, 0.001, 1e-4, 1e-6, 1e-6])  # [num_terms]
    for seed in range(20):
        rng = np.random.default_rng(seed)
        num_points = int(rng.integers(8, 25))
        features = np.column_stack([np.ones(num_points)] + [
            rng.integers(1, high, num_points) for high in (9, 130, 5000, 2000)
        ]).astype(float)  # [num_points, num_terms]  # fmt: skip
        times = features @ true_s * np.exp(rng.normal(0, 0.3, num_points))  # [num_points]
        assert_least_squares_optimum(features, times, fit_relative(features, times))


def test_block_size_prices_decode_attention_per_block():
    shape = IterationShape(0, 0, 8, 4096)
    small, large = (ProfiledCostModel(COEFFICIENTS, b).iteration_time_s(shape) for b in (1, 64))
    # 4096 context tokens: 4096 blocks of 1 vs 64 blocks of 64.
    assert small - large == pytest.approx(COEFFICIENTS["per_context_block_s"] * (4096 - 64))
    model = ProfiledCostModel(COEFFICIENTS, 16)
    assert model.decode_time_fn(8)(4096) == model.iteration_time_s(shape)
    assert model.swap_time_s(1024) == pytest.approx(1024 * 1e-6 + 64 * 3e-6)


def test_stairs_price_a_step_from_its_token_count():
    with_stairs = ProfiledCostModel(COEFFICIENTS | STAIRS, 16)
    without = ProfiledCostModel(COEFFICIENTS, 16)  # a profile written before the stairs: 0

    def stairs_s(shape: IterationShape) -> float:
        return with_stairs.iteration_time_s(shape) - without.iteration_time_s(shape)

    decode_stairs = [stairs_s(IterationShape(0, 0, n, 40 * n))
                     for n in (1, 2, 3, 4, 7, 8, 11, 15, 16, 32)]  # fmt: skip
    assert decode_stairs == pytest.approx([0, 0.025, 0.04, 0.018, 0.045, 0.017, 0.041, 0.023,
                                           0.026, 0.026])  # fmt: skip
    # A prefill's tokens count as rows too: a 5-token prompt is past the 5-token stair.
    assert stairs_s(IterationShape(5, 15, 0, 0, num_prefill_seqs=1)) == pytest.approx(0.016)
    assert stairs_s(IterationShape(2, 3, 1, 30, num_prefill_seqs=1)) == pytest.approx(0.04)


def test_the_fit_prices_stairs_with_either_sign_and_only_those_its_points_tell_apart():
    # Decode steps of 1-4, 6-8, 16 and 32 sequences (none of 5 or of 9-15), priced by falling
    # and rising stairs.
    costs = COEFFICIENTS | STAIRS | {"stair_6_tokens_s": -4e-3, "stair_7_tokens_s": 9e-3}
    shapes = [IterationShape(0, 0, n, n * context) for n in (1, 2, 3, 4, 6, 7, 8, 16, 32)
              for context in (20, 200)]  # fmt: skip
    features = [iteration_features(shape, 16) for shape in shapes]
    times = [ProfiledCostModel(costs, 16).iteration_time_s(shape) for shape in shapes]
    fitted = dict(zip(PROFILE_TERMS, fit_relative(features, times, signed_terms(PROFILE_TERMS)),
                      strict=True))  # fmt: skip
    for term in ("stair_2_tokens_s", "stair_3_tokens_s", "stair_4_tokens_s",
                 "stair_7_tokens_s", "stair_8_tokens_s"):  # fmt: skip
        assert fitted[term] == pytest.approx(costs[term], rel=1e-6), term
    # No step computes 5 tokens: the 5 and 6 stairs are one column, fitted once, on the later,
    # at their sum; so are the stairs of 9-16 tokens, on the 16 one.
    assert fitted["stair_5_tokens_s"] == 0.0
    assert fitted["stair_6_tokens_s"] == pytest.approx(
        costs["stair_5_tokens_s"] + costs["stair_6_tokens_s"], rel=1e-6)
    unseen = [f"stair_{tokens}_tokens_s" for tokens in range(9, 16)]
    assert [fitted[term] for term in unseen] == [0.0] * 7
    assert fitted["stair_16_tokens_s"] == pytest.approx(
        sum(costs[term] for term in unseen) + costs["stair_16_tokens_s"], rel=1e-6)
    # Without signed terms the fit keeps every stair >= 0, and misses the falling ones.
    non_negative = fit_relative(features, times)
    assert (non_negative >= 0).all()
    assert np.median(abs_pct_errors(np.asarray(features) @ non_negative, times)) > 1


def test_the_signed_fit_is_the_optimum_with_its_other_terms_never_below_0():
    # 400 random problems, some with a column twice. scipy's bounded solver (bvls) left a term
    # at its bound a rounding error below it in 5 of them, and stopped short of the optimum on
    # one CI run's vLLM grid steps: a profile must neither price below 0 nor miss the optimum.
    for seed in range(400):
        rng = np.random.default_rng(seed)
        num_points, num_terms = int(rng.integers(10, 40)), int(rng.integers(3, 12))
        features = np.abs(rng.normal(size=(num_points, num_terms)))  # [num_points, num_terms]
        if seed % 2:
            features[:, -1] = features[:, 0]
        times = np.abs(rng.normal(size=num_points)) + 0.1  # [num_points]
        signed = rng.random(num_terms) < 0.3  # [num_terms]
        signed[:2] = True, False
        fitted = fit_relative(features, times, signed)
        assert (fitted[~signed] >= 0).all(), seed
        if num_points > 2 * num_terms:  # else the fit can price every point exactly
            assert_least_squares_optimum(features, times, fitted,
                                         free_signed_terms(features, signed))  # fmt: skip


def test_the_fit_with_signed_terms_is_the_least_squares_optimum_on_noisy_times():
    # The cpu grid's shapes priced by stairs that fall from 4 and 8 rows, under noise: no
    # coefficients with the same signs (stairs any, the other terms >= 0) price them closer.
    shapes = _grid_shapes()
    features = np.array([iteration_features(shape, block_size) for shape, block_size in shapes])
    signed = signed_terms(PROFILE_TERMS)
    for seed in range(10):
        rng = np.random.default_rng(seed)
        times = np.array([ProfiledCostModel(COEFFICIENTS | STAIRS, block_size).iteration_time_s(
            shape) for shape, block_size in shapes])  # fmt: skip
        times *= np.exp(rng.normal(0, 0.1, len(shapes)))  # [num_points]
        fitted = fit_relative(features, times, signed)
        assert_least_squares_optimum(features, times, fitted, free_signed_terms(features, signed))
        assert fitted[PROFILE_TERMS.index("stair_4_tokens_s")] < 0


def test_hinges_steepen_the_per_token_slope_past_their_token_counts():
    with_hinges = ProfiledCostModel(COEFFICIENTS | HINGES | {"per_token_past_1024_s": 1e-4}, 16)
    without = ProfiledCostModel(COEFFICIENTS, 16)  # a profile written before the hinges: 0

    def hinges_s(num_tokens: int) -> float:
        shape = IterationShape(num_tokens, num_tokens * (num_tokens + 1) // 2, 0, 0,
                               num_prefill_seqs=1)  # fmt: skip
        return with_hinges.iteration_time_s(shape) - without.iteration_time_s(shape)

    assert [hinges_s(n) for n in (1, 64, 65, 300, 2000)] == pytest.approx([
        0, 0, 5e-4, 5e-4 * 236 + 2e-4 * 44, 5e-4 * 1936 + 2e-4 * 1744 + 1e-4 * 976])


def test_missing_and_unknown_coefficients_are_refused():
    with pytest.raises(ValueError, match="per_seq_s"):
        ProfiledCostModel({k: v for k, v in COEFFICIENTS.items() if k != "per_seq_s"}, 16)
    with pytest.raises(ValueError, match="wake_s price no term"):  # an older wake form's
        ProfiledCostModel(COEFFICIENTS | {"wake_s": 0.03}, 16)


def test_mixed_steps_and_wake_ups_are_priced_apart_and_older_profiles_price_them_0():
    wake = {"wake_per_sqrt_idle_s": 0.02, "wake_per_idle_s": 0.01}
    full = ProfiledCostModel(COEFFICIENTS | wake, 16)
    older = ProfiledCostModel({k: v for k, v in COEFFICIENTS.items()
                               if k not in OPTIONAL_TERMS}, 16)  # fmt: skip
    mixed = IterationShape(20, 210, 2, 80, num_prefill_seqs=1)
    assert full.iteration_time_s(mixed) - older.iteration_time_s(mixed) == pytest.approx(4e-3)
    for unmixed in (IterationShape(20, 210, 0, 0, num_prefill_seqs=1), IterationShape(0, 0, 2, 80)):
        assert full.iteration_time_s(unmixed) == older.iteration_time_s(unmixed)
    # 0.02 x sqrt(wait) + 0.01 x wait: 0 at no wait, steep over the first fraction of a second.
    assert full.wake_time_s(4.0) == pytest.approx(0.08) and full.wake_time_s(0.0) == 0.0
    assert full.wake_time_s(0.01) == pytest.approx(0.0021)
    assert older.wake_time_s(2.0) == 0.0


def test_profile_file_round_trips_and_names_its_model(tmp_path):
    versions = {"kvbench": "1.0", "torch": "2.13.0", "transformers": "5.0"}
    name = profile_file_name("cpu", "smollm2-135m", "fp32", versions)
    assert name == "profile_cpu_smollm2-135m_fp32_torch2.13.0_kvbench1.0.json"
    path = tmp_path / name
    write_profile(path, {"model": "smollm2-135m", "coefficients": COEFFICIENTS})
    deployment = get_deployment("smollm2-135m", "cpu")
    model = load_profiled_cost_model(path, 16, deployment)
    assert model.coefficients == COEFFICIENTS and model.block_size == 16
    with pytest.raises(ValueError, match=r"measured on model smollm2-135m.*model=opt-13b"):
        load_profiled_cost_model(path, 16, get_deployment("opt-13b", "a100-40gb"))
    write_profile(path, {"model": "smollm2-135m", "dtype": "fp32", "coefficients": COEFFICIENTS})
    assert deployment.model.dtype == "bf16"  # the catalog's SmolLM2
    with pytest.raises(ValueError, match=r"at dtype fp32, this run is model\.dtype=bf16; set "
                                         r"model\.dtype=fp32 or profile it"):  # fmt: skip
        load_profiled_cost_model(path, 16, deployment)
    path.write_text(json.dumps({"model": "smollm2-135m", "coefficients": {}}))
    with pytest.raises(ValueError, match="no coefficient fixed_s"):
        load_profiled_cost_model(path, 16, deployment)
    write_profile(path, {"model": "smollm2-135m", "coefficients": COEFFICIENTS | {"wake_s": 1.0}})
    with pytest.raises(ValueError, match=r"coefficient wake_s, which this kvbench does not price"):
        load_profiled_cost_model(path, 16, deployment)


def test_a_profile_names_and_checks_the_dtype_its_k_v_were_stored_in(tmp_path):
    versions = {"kvbench": "1.0", "torch": "2.13.0", "transformers": "5.0"}
    assert profile_file_name("cpu", "smollm2-135m", "fp32", versions, "fp8") == (
        "profile_cpu_smollm2-135m_fp32_kvfp8_torch2.13.0_kvbench1.0.json")
    assert profile_file_name("cpu", "smollm2-135m", "fp32", versions, "fp32") == (
        profile_file_name("cpu", "smollm2-135m", "fp32", versions))
    path = tmp_path / "profile.json"
    catalog = get_deployment("smollm2-135m", "cpu")
    fp32, fp8 = (dataclasses.replace(catalog, model=dataclasses.replace(
        catalog.model, dtype="fp32", kv_dtype=kv_dtype)) for kv_dtype in (None, "fp8"))
    # A file from before fp8 pools (no kv_dtype) stored K/V in its dtype.
    for recorded in ({}, {"kv_dtype": "fp32"}):
        write_profile(path, {"model": "smollm2-135m", "dtype": "fp32", **recorded,
                             "coefficients": COEFFICIENTS})  # fmt: skip
        assert load_profiled_cost_model(path, 16, fp32).coefficients == COEFFICIENTS
        with pytest.raises(ValueError, match=r"profile stored K/V in fp32, this run in fp8; set "
                                             r"model\.kv_dtype=null or profile it with `python -m "
                                             r"kvbench task=profile model=smollm2-135m "
                                             r"model\.dtype=fp32 model\.kv_dtype=fp8`$"):
            load_profiled_cost_model(path, 16, fp8)
    write_profile(path, {"model": "smollm2-135m", "dtype": "fp32", "kv_dtype": "fp8",
                         "coefficients": COEFFICIENTS})  # fmt: skip
    assert load_profiled_cost_model(path, 16, fp8).coefficients == COEFFICIENTS
    with pytest.raises(ValueError, match=r"stored K/V in fp8, this run in fp32; set "
                                         r"model\.kv_dtype=fp8 or .* model\.kv_dtype=null`$"):
        load_profiled_cost_model(path, 16, fp32)


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", r"not a profile file \(invalid JSON"),
    ("[1, 2]", r"not a profile file \(no mapping of coefficients\)"),
    ('{"coefficients": null}', r"not a profile file \(no mapping of coefficients\)"),
    (json.dumps({"coefficients": {**COEFFICIENTS, "fixed_s": None}}),
     r"profile coefficient fixed_s is None, not seconds"),
    (json.dumps({"coefficients": {**COEFFICIENTS, "per_seq_s": "4e-4"}}),
     r"profile coefficient per_seq_s is '4e-4', not seconds"),
    (json.dumps({"coefficients": {**COEFFICIENTS, "fixed_s": float("nan")}}),
     r"profile coefficient fixed_s is nan, not a finite number of seconds"),
    (json.dumps({"coefficients": {**COEFFICIENTS, "per_seq_s": float("inf")}}),
     r"profile coefficient per_seq_s is inf, not a finite number of seconds"),
    (json.dumps({"coefficients": {**COEFFICIENTS, "per_token_s": -3e-3}}),
     r"profile coefficient per_token_s is -0.003 s, below 0 \(a fit keeps every term but the "
     r"stairs >= 0\)"),
    (json.dumps({"coefficients": {k: v for k, v in COEFFICIENTS.items() if k != "fixed_s"}}),
     r"profile has no coefficient fixed_s"),
    (json.dumps({"coefficients": {**COEFFICIENTS, "wake_s": 0.01}}),
     r"profile has coefficient wake_s, which this kvbench does not price"),
])  # fmt: skip
def test_a_file_that_is_not_a_profile_is_refused_in_one_line(tmp_path, text, message):
    from kvbench.tasks.profile.profile_file import read_profile

    path = tmp_path / "profile.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as refused:
        read_profile(path)
    assert "\n" not in str(refused.value) and "python -m kvbench task=profile" in str(refused.value)
    path.write_text(json.dumps({"coefficients": COEFFICIENTS}))
    assert read_profile(path)["coefficients"] == COEFFICIENTS


def test_a_binary_file_given_as_a_profile_is_named_with_the_fix(tmp_path):
    from kvbench.tasks.profile.profile_file import read_profile

    path = tmp_path / "summary.parquet"
    path.write_bytes(b"PAR1\x15\x80\xea\x00")
    with pytest.raises(ValueError) as refused:
        read_profile(path)
    assert str(refused.value) == (
        f"{path}: not a profile file (not UTF-8 JSON text: a binary file, such as a parquet "
        "table?); give the .json file `python -m kvbench task=profile` writes")


def test_a_profile_with_negative_stairs_is_a_profile(tmp_path):
    from kvbench.tasks.profile.profile_file import read_profile

    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"coefficients": {**COEFFICIENTS, **STAIRS}}))
    assert read_profile(path)["coefficients"]["stair_4_tokens_s"] == -0.022


def test_a_profile_says_what_it_was_measured_on_that_differs_from_here():
    document = {"device": "AMD EPYC", "num_threads": 2, "decode_backend": None}
    present = {"device": "Intel Xeon", "num_threads": 2, "decode_backend": "sdpa"}
    # Threads agree; a backend the profile does not record is not compared.
    assert setup_differences(document, present) == ["device AMD EPYC (here Intel Xeon)"]
    assert setup_differences(document, {**present, "device": "AMD EPYC"}) == []


def test_the_code_digest_changes_with_any_kernel_or_executor_file(tmp_path):
    import kvbench.kernels

    import kvbench.executors
    from kvbench.tasks.profile.profile_file import code_digest

    folders = [tmp_path / "kernels", tmp_path / "executors"]
    for folder in folders:
        folder.mkdir()
        (folder / "a.py").write_text("x = 1\n")
    before = code_digest(folders)
    assert code_digest(folders) == before and len(before) == 12
    (folders[1] / "a.py").write_text("x = 2\n")
    edited = code_digest(folders)
    (folders[0] / "b.py").write_text("")
    added = code_digest(folders)
    assert len({before, edited, added}) == 3
    (folders[0] / "notes.txt").write_text("not code")
    assert code_digest(folders) == added
    installed = [Path(kvbench.kernels.__file__).parent, Path(kvbench.executors.__file__).parent]
    assert (installed[0] / "decode_torch.py").is_file()
    assert (installed[1] / "kv_memory.py").is_file()
    assert code_digest() == code_digest(installed)


def test_a_profile_of_other_kernel_or_executor_code_is_named_before_its_prices_are_used(
        tmp_path):  # fmt: skip
    from kvbench.tasks.profile.profile_file import checked_profile, code_digest

    deployment = get_deployment("smollm2-135m", "cpu")
    path = tmp_path / "profile.json"
    for recorded, expected in (("0123456789ab", [f"code_digest 0123456789ab (here "
                                                 f"{code_digest()})"]),
                               (code_digest(), [])):  # fmt: skip
        write_profile(path, {"model": "smollm2-135m", "code_digest": recorded,
                             "coefficients": COEFFICIENTS})  # fmt: skip
        _, differences = checked_profile(path, deployment, "sdpa", "aten")
        assert [d for d in differences if d.startswith("code_digest")] == expected


@pytest.mark.parametrize(("profile", "message"), [
    ({"model": "llama-3-8b"}, r"measured on model llama-3-8b, this run is model=smollm2-135m"),
    ({"model": "smollm2-135m", "grid": "malformed"}, r"its grid is malformed \(Value 'x'"),
])  # fmt: skip
def test_sim_to_real_refuses_a_profile_it_cannot_use_before_serving_anything(
        tmp_path, monkeypatch, profile, message):  # fmt: skip
    from kvbench.tasks.sim_to_real import run as sim_to_real

    path = tmp_path / "profile.json"
    if profile.get("grid") == "malformed":
        grid, _ = _cpu_grid()
        profile = profile | {"grid": dataclasses.asdict(grid) | {"repeats": "x"}}
    write_profile(path, profile | {"coefficients": COEFFICIENTS})
    cfg, deployment, raw = compose_config("experiment=sim_to_real", f"executor.profile={path}")

    forbid_model_load(monkeypatch, sim_to_real)
    with pytest.raises(ValueError, match=message):
        sim_to_real.run_sim_to_real(cfg, deployment, raw, tmp_path / "run")


def test_sim_to_real_warns_of_a_profile_measured_on_another_device(tmp_path, monkeypatch,
                                                                   capsys):
    from kvbench.tasks.sim_to_real import run as sim_to_real

    path = tmp_path / "profile.json"
    write_profile(path, {"model": "smollm2-135m", "dtype": "fp32", "device": "a CPU elsewhere",
                         "coefficients": COEFFICIENTS})  # fmt: skip
    cfg, deployment, _ = compose_config("experiment=sim_to_real", f"executor.profile={path}")
    document = sim_to_real._given_profile(cfg, deployment)
    assert document is not None and document["coefficients"] == COEFFICIENTS
    assert "measured on device a CPU elsewhere (here " in capsys.readouterr().out


def test_executor_profiled_simulates_with_the_profile(tmp_path, capsys):
    from kvbench.tasks.simulate.experiment import cost_model, run_experiment

    path = tmp_path / "profile.json"
    write_profile(path, {"model": "smollm2-135m", "coefficients": COEFFICIENTS})
    cfg, deployment, raw = compose_config(
        "executor=profiled", f"executor.profile={path}", "model=smollm2-135m", "hardware=cpu",
        "workload=fixed", "workload.num_requests=1", "workload.prompt_tokens=20",
        "workload.output_tokens=5", "allocators=[paged]", "progress=false", "plots=false",
        "request_rates=[1000]",
    )  # fmt: skip
    assert isinstance(cost_model(cfg, deployment), ProfiledCostModel)
    summary = run_experiment(cfg, deployment, raw, tmp_path / "run")
    # A profile that records no grid: what it spans is not known.
    assert np.isnan(summary["requests_beyond_profile_pct"].iloc[0])
    assert np.isnan(summary["steps_beyond_profile_pct"].iloc[0])
    assert (f"simulate: {path} records no profile grid: whether these requests and steps are "
            "larger than any it timed is not known") in capsys.readouterr().out.splitlines()
    # The prompt prefilled (and its first token out), then four decode steps at contexts 21-24,
    # each step's shape in its row.
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    assert steps["prefill_attention_pairs"].tolist() == [210, 0, 0, 0, 0]
    assert steps["decode_context_tokens"].tolist() == [0, 21, 22, 23, 24]
    prefill = IterationShape(20, 210, 0, 0, num_prefill_seqs=1)
    model = ProfiledCostModel(COEFFICIENTS, cfg.allocator.block_size)
    decode_s = sum(model.iteration_time_s(IterationShape(0, 0, 1, 20 + k)) for k in range(1, 5))
    expected_e2e_s = model.iteration_time_s(prefill) + decode_s
    assert summary["e2e_p50_s"].iloc[0] == pytest.approx(expected_e2e_s, rel=1e-3)


def test_executor_profiled_needs_a_profile():
    with pytest.raises(ConfigError, match=r"executor\.profile=FILE"):
        compose_config("executor=profiled")


def test_real_executor_refuses_a_model_it_cannot_run():
    with pytest.raises(ConfigError, match="this machine has weights for smollm2-135m only"):
        compose_config("executor=real", "model=opt-13b", "hardware=a100-40gb")


def test_real_executor_refuses_a_cpu_tier_it_has_no_memory_for():
    # A CPU-tier hit would load a prefix into fresh blocks the executor never wrote.
    real = ("executor=real", "model=smollm2-135m", "hardware=cpu", "allocators=[paged_prefix]")
    with pytest.raises(ConfigError, match=r"allocator\.cpu_cache_gib=0\.5: executor=real keeps "
                                          r"K/V in the device's pool only"):  # fmt: skip
        compose_config(*real, "allocator.cpu_cache_gib=0.5")
    cfg, _, _ = compose_config(*real[1:], "allocator.cpu_cache_gib=0.5")  # simulated: a tier
    assert cfg.allocator.cpu_cache_gib == 0.5


def test_the_decode_backend_is_one_the_kernels_have():
    from kvbench.kernels import DECODE_BACKENDS as KERNEL_DECODE_BACKENDS

    from kvbench.executors.names import DECODE_BACKENDS

    assert set(DECODE_BACKENDS) == set(KERNEL_DECODE_BACKENDS)
    with pytest.raises(ConfigError, match=r"executor\.decode_backend='cuda': allowed are triton"):
        compose_config("executor=real", "executor.decode_backend=cuda")


def test_spread_contexts_keep_their_mean():
    contexts = spread_contexts(5, 256)
    assert contexts == (128, 192, 256, 320, 384) and sum(contexts) / 5 == 256


@pytest.mark.parametrize("block_size", [1, 16])  # 1: a naive_oracle arena
def test_a_grid_point_times_on_a_real_model(block_size, kv_memories):
    from kvbench.tasks.equivalence.models import load_model
    from kvbench.tasks.profile.measure import time_iteration

    model = load_model("tiny-llama-gqa")
    point = IterationPoint(block_size, decode_contexts=(20, 40), prefill_prompts=(12,))
    shape, timing = time_iteration(model, point, repeats=2, decode_backend="sdpa")
    assert shape == IterationShape(12, 78, 2, 60, num_prefill_seqs=1) == point_shape(point)
    assert timing.median_s > 0 and timing.spread >= 0
    # The decode contexts were read from noise, as a served model's K/V, not from zeros (fp8
    # K/V cost more to read the more their bit patterns vary).
    (memory,) = kv_memories
    assert all((pool != 0).float().mean() > 0.99 for pool in (*memory.keys, *memory.values))


def test_a_wake_up_point_idles_before_every_timed_run_and_the_grid_has_them():
    from kvbench.tasks.equivalence.models import load_model
    from kvbench.tasks.profile.measure import time_iteration

    waits: list[float] = []
    point = IterationPoint(16, prefill_prompts=(12,), wait_s=0.5)
    shape, _ = time_iteration(load_model("tiny-llama-gqa"), point, repeats=2,
                              decode_backend="sdpa", sleep=waits.append)  # fmt: skip
    # Before each of the 2 timed runs, not before the untimed one (it only warms the point).
    assert waits == [0.5] * 2 and shape == IterationShape(12, 78, 0, 0, num_prefill_seqs=1)
    assert shape == point_shape(point)
    grid, token_bytes = _cpu_grid()
    assert [p.wait_s for p in iteration_grid(grid, token_bytes) if p.wait_s] == [
        0.1, 0.25, 0.5, 1.0, 2.0, 4.0]


def test_timed_runs_warm_up_untimed_first_unless_told_not_to():
    from kvbench.tasks.profile.measure import timed_runs

    calls = []
    durations_s = timed_runs(lambda: calls.append("run"), lambda: calls.append("prepare"), 2,
                             lambda: calls.append("idle"))  # fmt: skip
    assert calls == ["prepare", "run"] + ["prepare", "idle", "run"] * 2 and len(durations_s) == 2
    calls.clear()
    durations_s = timed_runs(lambda: calls.append("run"), lambda: calls.append("prepare"), 2,
                             lambda: calls.append("idle"), untimed_first=False)  # fmt: skip
    assert calls == ["prepare", "idle", "run"] * 2 and len(durations_s) == 2


def test_the_grid_is_timed_in_rounds_each_shuffled_and_tabled_in_its_own_order():
    from kvbench.tasks.profile.measure import in_rounds

    points = list(range(20))
    called = []
    results = in_rounds(points, lambda point: called.append(point) or (point, len(called)),
                        num_rounds=3)  # fmt: skip
    rounds = [called[:20], called[20:40], called[40:]]
    assert all(sorted(order) == points for order in rounds)  # every point once a round
    assert rounds[0] != points and len({tuple(order) for order in rounds}) == 3  # shuffled, anew
    # Per point, in the points' order, its results round by round (the calls' count rising).
    assert [[point for point, _ in values] for values in results] == [[p] * 3 for p in points]
    assert all(values == sorted(values) for values in results)
    again = []
    in_rounds(points, again.append, num_rounds=3)
    assert again == called  # the same orders every run


def test_a_slow_spell_shorter_than_a_round_is_dropped_by_the_median_over_rounds(monkeypatch):
    from kvbench.tasks.profile import measure

    # Every run takes 1 s but for 8 points' worth of runs in a row, slowed 1.5x: a spell of the
    # machine. Back to back, 3 repeats of a point share it; in rounds, it falls in one of them.
    clock = []

    def swap_runs(model, point, repeats, kv_dtype, untimed_first):
        clock.append((point, untimed_first))
        return [1.5 if 10 <= len(clock) < 18 else 1.0] * repeats

    def iteration_runs(model, point, repeats, decode_backend, kv_dtype, untimed_first):
        return swap_runs(model, point, repeats, kv_dtype, untimed_first)

    monkeypatch.setattr(measure, "iteration_runs", iteration_runs)
    monkeypatch.setattr(measure, "swap_runs", swap_runs)
    points = [IterationPoint(16, decode_contexts=(8 + i,)) for i in range(30)]
    swaps = [SwapPoint(16, 256), SwapPoint(16, 2048)]
    timed, swap_timings = measure.time_grid(None, points, swaps, 3, "sdpa")
    assert len(clock) == 3 * 32
    # An untimed run first in the first round only: its executor's warm-up covers the others.
    assert [untimed for _, untimed in clock] == [True] * 32 + [False] * 64
    assert {point for point, _ in clock[:32]} == {*points, *swaps}
    assert [shape for shape, _ in timed] == [point_shape(point) for point in points]
    assert all(timing.median_s == 1.0 for _, timing in timed)
    assert all(timing.median_s == 1.0 for timing in swap_timings)
    # The spell shows as the spread of the points it hit, 8 of them: (1.5 - 1) / 1.
    spreads = [timing.spread for _, timing in timed] + [timing.spread for timing in swap_timings]
    assert sorted(spreads)[-8:] == [0.5] * 8 and sorted(spreads)[:-8] == [0.0] * 24


def test_the_cpu_grid_spans_what_the_committed_profile_was_fitted_on_every_stair_and_larger():
    from kvbench.tasks.profile.grid import GIB, OUTPUT_TOKENS

    grid, token_bytes = _cpu_grid()
    points = iteration_grid(grid, token_bytes)
    # The committed profile's grid: batches to 32, every point kept (no pool cap).
    committed = iteration_grid(dataclasses.replace(
        grid, decode_batches=[1, 2, 3, 4, 6, 8, 16, 32], max_pool_gib=None), token_bytes)
    assert len(committed) == 94 and all(point in points for point in committed)
    uncapped = iteration_grid(dataclasses.replace(grid, max_pool_gib=None), token_bytes)
    added = [p for p in uncapped if p not in committed]
    # Every batch of 1-16 sequences, so that each stair's count is timed: 5, 7 and 9-15 added,
    # under each of 3 block sizes at 3 contexts, all within the cap.
    stairs = [p for p in added if len(p.decode_contexts) <= 16]
    assert sorted({len(p.decode_contexts) for p in stairs}) == [5, 7, *range(9, 16)]
    assert len(stairs) == 9 * 9 and all(p in points for p in stairs)
    assert {len(p.decode_contexts) for p in points if not p.prefill_prompts} >= set(range(1, 17))
    larger = [p for p in added if p not in stairs]
    assert len(larger) == 27 and {len(p.decode_contexts) for p in larger} == {64, 128, 256}
    # Timed where their pool fits 3.2 GiB: 17 of the 27.
    kept = [p.num_slots(OUTPUT_TOKENS) * token_bytes <= 3.2 * GIB for p in larger]
    assert [p in points for p in larger] == kept and sum(kept) == 17
    assert len(points) == 94 + 81 + 17
    decode = [p for p in points if p.decode_contexts and not p.prefill_prompts]
    assert max(max(p.decode_contexts) for p in decode) == 1152


def test_a_request_longer_than_any_sequence_the_grid_timed_is_beyond_it():
    grid, token_bytes = _cpu_grid()
    # Prompts of 16-256 tokens alone, 32 and 128 beside decodes; contexts to 3/2 x 768.
    assert longest_prompt_tokens(grid) == 256 and longest_sequence_tokens(grid) == 1152
    assert longest_prompt_tokens(dataclasses.replace(grid, mixed_prompts=[300])) == 300
    prompt_tokens = [256, 257, 100, 100, 1152]
    output_tokens = [896, 1, 1052, 1053, 0]
    assert beyond_grid(prompt_tokens, output_tokens, grid).tolist() == [
        False, True, False, True, True]  # fmt: skip
    shapes = grid_shapes(grid, token_bytes)
    assert len(shapes) == 192
    assert max(shape.num_prefill_tokens for shape in shapes) == 512  # two prompts of 256
    assert max(shape.num_decode_tokens for shape in shapes) == 256


def test_a_profile_records_its_grid_and_an_older_one_none():
    grid, _ = _cpu_grid()
    recorded = dataclasses.asdict(grid)
    assert recorded_grid({"grid": recorded}, "p.json") == grid
    assert recorded_grid({}, "p.json") is None  # a profile fitted on served runs: no grid
    # A grid of other keys (another version's) spans what this version cannot tell.
    older = {key: value for key, value in recorded.items() if key != "wake_waits_s"}
    assert recorded_grid({"grid": older}, "p.json") is None
    assert recorded_grid({"grid": recorded | {"new_key": 1}}, "p.json") is None
    with pytest.raises(ValueError, match=r"^p\.json: its grid is malformed \(Value 'many' of "
                       r"type 'str' could not be converted to Integer\); write the profile "
                       r"again with `python -m kvbench task=profile`$"):  # fmt: skip
        recorded_grid({"grid": recorded | {"prefill_prompts": [16, "many"]}}, "p.json")


@pytest.mark.parametrize(("prompt_tokens", "beyond_pct"), [(200, 0.0), (300, 100.0)])
def test_executor_profiled_names_requests_longer_than_its_profile_timed(
        tmp_path, capsys, prompt_tokens, beyond_pct):  # fmt: skip
    from kvbench.tasks.simulate.experiment import run_experiment
    from kvbench.tasks.simulate.run_outputs import deployment_lines

    grid, _ = _cpu_grid()
    path = tmp_path / "profile.json"
    write_profile(path, {"model": "smollm2-135m", "coefficients": COEFFICIENTS,
                         "grid": dataclasses.asdict(grid)})  # fmt: skip
    cfg, deployment, raw = compose_config(
        "executor=profiled", f"executor.profile={path}", "model=smollm2-135m", "hardware=cpu",
        "workload=fixed", "workload.num_requests=3", f"workload.prompt_tokens={prompt_tokens}",
        "workload.output_tokens=5", "allocators=[paged,naive_max]", "request_rates=[1,2]",
        "progress=false", "plots=false", "summary_table=false",
    )  # fmt: skip
    summary = run_experiment(cfg, deployment, raw, tmp_path / "run")
    assert summary["requests_beyond_profile_pct"].tolist() == [beyond_pct] * 4
    report_line = ("- requests longer than any sequence the profile timed, whose prices "
                   "extrapolate it (`requests_beyond_profile_pct`): fixed 100.0 %")  # fmt: skip
    assert (report_line in deployment_lines(deployment, summary)) == bool(beyond_pct)
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    if beyond_pct:  # once per workload, not per rate or allocator
        assert warnings == [
            f"simulate: warning: 3 of 3 requests of fixed are longer than any sequence {path} "
            "timed (prompts to 256 tokens, sequences to 1,152): their prices extrapolate the "
            "profile; profile a grid that spans them (profile_grid.prefill_prompts, "
            "profile_grid.decode_mean_contexts)"]  # fmt: skip
    else:
        assert warnings == []


@pytest.mark.parametrize("scheduler", ["vllm_v0", "vllm_v1"])
def test_executor_profiled_counts_steps_larger_than_its_profile_timed(tmp_path, capsys,
                                                                     monkeypatch, scheduler):
    from kvbench.engine import records
    from kvbench.tasks.simulate.experiment import run_experiment
    from kvbench.tasks.simulate.run_outputs import deployment_lines

    monkeypatch.setattr(records, "CHUNK_ROWS", 7)  # streamed runs hand out several chunks
    grid, token_bytes = _cpu_grid()
    grid = dataclasses.replace(grid, decode_batches=[1, 2, 3, 4, 6, 8, 16, 32])
    path = tmp_path / "profile.json"
    write_profile(path, {"model": "smollm2-135m", "coefficients": COEFFICIENTS,
                         "grid": dataclasses.asdict(grid)})  # fmt: skip
    # 48 requests at once: batches past the grid's 32 sequences; 3 of them apart: none.
    runs = {label: ("workload=fixed", f"workload.num_requests={num_requests}",
                    f"request_rates=[{rate}]") for label, num_requests, rate in
            (("burst", 48, 1000), ("trickle", 3, 0.5))}  # fmt: skip
    summaries = {}
    for label, workload in runs.items():
        for stream in ("false", "true"):
            cfg, deployment, raw = compose_config(
                "executor=profiled", f"executor.profile={path}", "model=smollm2-135m",
                "hardware=cpu", f"scheduler={scheduler}", *workload,
                "workload.prompt_tokens=40", "workload.output_tokens=30", "allocators=[paged]",
                f"engine.stream_tables={stream}", "progress=false", "plots=false",
                "summary_table=false",
            )  # fmt: skip
            out = tmp_path / f"{label}-{stream}"
            summaries[label, stream] = run_experiment(cfg, deployment, raw, out)
    steps = pd.read_parquet(tmp_path / "burst-false" / "steps.parquet")
    shapes = grid_shapes(grid, token_bytes)
    features = ("num_prefill_tokens", "prefill_attention_pairs", "num_decode_tokens",
                "decode_context_tokens")
    beyond = np.zeros(len(steps), dtype=bool)
    for name in features:
        beyond |= steps[name].to_numpy() > max(getattr(shape, name) for shape in shapes)
    burst_pct = summaries["burst", "false"]["steps_beyond_profile_pct"].iloc[0]
    assert 0 < burst_pct < 100
    assert burst_pct == pytest.approx(100 * beyond.mean())
    assert summaries["burst", "true"]["steps_beyond_profile_pct"].iloc[0] == burst_pct
    for stream in ("false", "true"):
        assert summaries["trickle", stream]["steps_beyond_profile_pct"].iloc[0] == 0
    # The requests are shorter than the grid's sequences: only their batches are beyond it.
    assert summaries["burst", "false"]["requests_beyond_profile_pct"].iloc[0] == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert warnings == [
        f"simulate: warning: {burst_pct:.1f} % of the steps of fixed (paged at 1000 req/s, the "
        f"most of its runs) are larger than every step {path} timed (prefills to 512 tokens and "
        "65,792 attention pairs, decode batches to 32 sequences and to 24,561 context tokens in "
        "all): their prices extrapolate the profile; profile a grid that spans them "
        "(profile_grid.prefill_prompts, profile_grid.prefill_counts, "
        "profile_grid.decode_batches, profile_grid.decode_mean_contexts)"] * 2  # fmt: skip
    assert (f"- steps larger than every step the profile timed, priced by extrapolating it "
            f"(`steps_beyond_profile_pct`): fixed {burst_pct:.1f} %"
            in deployment_lines(deployment, summaries["burst", "false"]))  # fmt: skip
    assert not any("steps larger" in line
                   for line in deployment_lines(deployment, summaries["trickle", "false"]))


def test_the_gpu_grid_spans_a_gpu_s_batches_within_its_pool_cap():
    from kvbench.tasks.profile.grid import GIB, OUTPUT_TOKENS, swap_grid

    # kernels/gpu_session.sh's profile of a random-weight Llama-3-8B on the H200.
    cfg, deployment, _ = compose_config(
        "task=profile", "model=llama-3-8b", "model.dtype=bf16", "hardware=h200-141gb",
        "executor.weights=random", "executor.decode_backend=triton", "executor.num_threads=null",
        "profile_grid=gpu", "profile_grid.repeats=2")  # fmt: skip
    grid, token_bytes = cfg.profile_grid, deployment.model.kv_bytes_per_token
    points = iteration_grid(grid, token_bytes)
    pools = [p.num_slots(OUTPUT_TOKENS) * token_bytes for p in points]
    assert max(pools) <= 40 * GIB
    # 256 sequences are timed, at fewer contexts where the pool passes the cap: all three
    # would take 64 GiB paged at 2,048 tokens and more in a contiguous arena of powers of two.
    def contexts_timed(block_size: int, num_seqs: int) -> int:
        return sum(1 for p in points if p.block_size == block_size and not p.prefill_prompts
                   and len(p.decode_contexts) == num_seqs)  # fmt: skip

    assert [contexts_timed(b, 256) for b in (1, 16, 64)] == [1, 2, 2]
    assert [contexts_timed(b, 32) for b in (1, 16, 64)] == [3, 3, 3]
    assert longest_sequence_tokens(grid) == 3072 <= cfg.model.max_model_len
    assert max(sum(p.prefill_prompts) for p in points) == 4 * 2048
    assert len(swap_grid(grid, token_bytes)) == 6


def test_a_grid_the_model_cannot_hold_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"longest sequence is 3072 tokens, past "
                                          r"model.max_model_len=2048.*decode_mean_contexts"):
        compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                       "model.max_model_len=2048", "profile_grid.decode_mean_contexts=[2048]")
    with pytest.raises(ConfigError, match=r"max_pool_gib=0.001 leaves no decode point .* "
                                          r"46080 bytes a token"):
        compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                       "model.dtype=fp32", "profile_grid.max_pool_gib=0.001")
    with pytest.raises(ConfigError, match=r"max_pool_gib=0.01 leaves no swap of the grid .* "
                                          r"lower profile_grid.swap_tokens"):
        compose_config("task=profile", "model=smollm2-135m", "hardware=cpu", "model.dtype=fp32",
                       "profile_grid.max_pool_gib=0.01", "profile_grid.swap_tokens=[1000000]")
    # Batches of one sequence hold their mean context, no more.
    cfg, _, _ = compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                               "model.max_model_len=2048", "profile_grid.decode_batches=[1]",
                               "profile_grid.decode_mean_contexts=[2048]")  # fmt: skip
    assert longest_sequence_tokens(cfg.profile_grid) == 2048
    with pytest.raises(ConfigError, match=r"profile_grid.decode_batches=\[\]"):
        compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                       "profile_grid.decode_batches=[]")
    # Contexts spread from half their mean, each a token before its new one: 4 is the least.
    with pytest.raises(ConfigError, match=r"profile_grid\.decode_mean_contexts=\[64, 3\]: a "
                                          r"mean context must be >= 4 tokens"):  # fmt: skip
        compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                       "profile_grid.decode_mean_contexts=[64,3]")
    with pytest.raises(ConfigError, match=r"profile_grid\.mixed_mean_context=2: a mean"):
        compose_config("task=profile", "model=smollm2-135m", "hardware=cpu",
                       "profile_grid.mixed_mean_context=2")
    assert min(spread_contexts(8, 4)) == 2


TINY_GRID = (
    "profile_grid.block_sizes=[1,16]", "profile_grid.decode_batches=[1,2,4]",
    "profile_grid.decode_mean_contexts=[16,48]", "profile_grid.prefill_block_sizes=[16]",
    "profile_grid.prefill_prompts=[8,24]", "profile_grid.prefill_counts=[1,2]",
    "profile_grid.mixed_decodes=2", "profile_grid.mixed_mean_context=16",
    "profile_grid.mixed_prompts=[8]", "profile_grid.wake_waits_s=[0.01,0.04]",
    "profile_grid.swap_tokens=[32,64]", "profile_grid.repeats=1",
)  # fmt: skip


@pytest.mark.parametrize(("kv_dtype", "name"), [("null", "fp32_torch"), ("fp8", "fp32_kvfp8")])
def test_task_profile_times_its_grid_and_writes_a_profile_the_simulator_reads(
        tmp_path, kv_memories, kv_dtype, name):  # fmt: skip
    from kvbench.tasks.profile.profile_file import code_digest, read_profile
    from kvbench.tasks.profile.run import run_profile

    cfg, deployment, raw = compose_config(
        "task=profile", "model=smollm2-135m", "model.dtype=fp32", "hardware=cpu",
        # 2 of SmolLM2's 30 layers: what the task times and writes does not need all of them.
        "model.num_layers=2", "executor.weights=random", "executor.num_threads=1", "plots=false",
        "summary_table=false", f"model.kv_dtype={kv_dtype}", *TINY_GRID)  # fmt: skip
    table = run_profile(cfg, deployment, raw, tmp_path)
    # 2 x 3 x 2 decode + 2 x 2 prefill + 1 mixed + 2 wake-ups, 2 x 2 swaps.
    assert (table["kind"] == "iteration").sum() == 19 and (table["kind"] == "swap").sum() == 4
    stored = torch.float8_e4m3fn if kv_dtype == "fp8" else torch.float32
    assert [memory.keys[0].dtype for memory in kv_memories] == [stored] * 23
    (path,) = tmp_path.glob(f"profile_cpu_smollm2-135m_{name}*.json")
    profile = read_profile(path)
    assert profile["kv_dtype"] == ("fp8" if kv_dtype == "fp8" else "fp32")
    assert profile["code_digest"] == code_digest()
    assert profile["grid"]["decode_batches"] == [1, 2, 4] and profile["repeats"] == 1
    assert profile["fit"]["num_iteration_points"] == 19
    # The grid it records gives the shapes it timed, in its table's order.
    timed = table[table["kind"] == "iteration"]
    assert [(shape.num_prefill_tokens, shape.num_decode_tokens, shape.decode_context_tokens,
             shape.prefill_attention_pairs) for shape in
            grid_shapes(recorded_grid(profile, path), deployment.model.kv_bytes_per_token)] == list(
        timed[["num_prefill_tokens", "num_decode_tokens", "decode_context_tokens",
               "prefill_attention_pairs"]].itertuples(index=False, name=None))  # fmt: skip
    model = load_profiled_cost_model(path, 16, deployment)
    assert model.iteration_time_s(IterationShape(0, 0, 2, 64)) > 0
    report = (tmp_path / "report.md").read_text()
    assert "decode batches of 1-4 sequences" in report
    # The line to copy names the file where it is (the run folder), not its bare name.
    assert f"use it: executor=profiled executor.profile={path}" in report
