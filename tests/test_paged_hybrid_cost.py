"""The roofline's window term: a sliding-window layer reads (and attends to) at most its window."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from kvbench.core.catalog import get_deployment
from kvbench.engine import RooflineCostModel
from kvbench.engine.cost_model import IterationShape, iteration_shape
from kvbench.engine.roofline import windowed_prefill_pairs

NUM_SEQS = 10


def _model(model: str) -> RooflineCostModel:
    return RooflineCostModel(get_deployment(model, "h200-141gb"))


def _without_windows(cost_model: RooflineCostModel):  # type: ignore[no-untyped-def]
    """The same terms with every layer full attention (what kvbench charged before)."""
    return dataclasses.replace(cost_model.terms, window_tokens=None, sliding_layer_fraction=0.0)


def test_gemma_3_terms_by_hand() -> None:
    terms = _model("gemma-3-27b").terms
    assert terms.window_tokens == 1024
    assert terms.sliding_layer_fraction == 52 / 62


def test_past_the_window_only_the_full_layers_read_more() -> None:
    # Gemma-3-27B, 10 sequences all longer than the window, decode-only and bandwidth-bound:
    # from 60,000 to 120,000 summed context, only the 10 full layers of 62 read the extra
    # 60,000 tokens; the 52 sliding ones read 10 x 1,024 tokens in both.
    cost_model = _model("gemma-3-27b")
    terms = cost_model.terms
    short = cost_model.iteration_time_s(IterationShape(0, 0, NUM_SEQS, 60_000))
    long = cost_model.iteration_time_s(IterationShape(0, 0, NUM_SEQS, 120_000))
    extra_bytes = 10 / 62 * 60_000 * terms.kv_bytes_per_token
    assert long - short == pytest.approx(extra_bytes / terms.bytes_per_s, rel=1e-9)
    # Uniformly charged, every layer would read them: 6.2 times as much.
    full_time_fn = _without_windows(cost_model).time_fn(NUM_SEQS)
    assert full_time_fn(120_000) - full_time_fn(60_000) == pytest.approx(
        60_000 * terms.kv_bytes_per_token / terms.bytes_per_s, rel=1e-9
    )


def test_within_the_window_nothing_changes() -> None:
    # 10 sequences of at most 1,024 tokens: no layer's window cuts anything.
    cost_model = _model("gemma-3-27b")
    shape = IterationShape(3000, 3000 * 3001 // 2 // 3, NUM_SEQS, NUM_SEQS * 1000)
    unwindowed = _without_windows(cost_model).time_fn(3000 + NUM_SEQS, NUM_SEQS)
    assert cost_model.iteration_time_s(shape) == pytest.approx(
        unwindowed(shape.decode_context_tokens, shape.prefill_attention_pairs), rel=1e-12
    )


def test_a_long_prefill_attends_to_at_most_the_window_per_token_in_sliding_layers() -> None:
    # Mistral-7B-v0.1 (every layer slides over 4,096): an 8,000-token prefill is compute-bound.
    # Causally its tokens attend to 8,000 x 8,001 / 2 = 32,004,000 pairs; windowed, tokens
    # 0-4,095 to 4,096 x 4,097 / 2 = 8,390,656 and the other 3,904 to 4,096 each: 24,381,440.
    cost_model = _model("mistral-7b-v0.1")
    terms = cost_model.terms
    assert terms.sliding_layer_fraction == 1.0
    pairs = 8000 * 8001 // 2
    assert windowed_prefill_pairs(((8000, 0),), 4096) == 24_381_440
    shape = IterationShape(8000, pairs, 0, 0, prefill_spans=((8000, 0),))
    windowed = cost_model.iteration_time_s(shape)
    unwindowed = _without_windows(cost_model).time_fn(8000, 0)(0, pairs)
    saved_flops = terms.attention_flops_per_pair * (pairs - 24_381_440)
    assert unwindowed - windowed == pytest.approx(saved_flops / terms.flops_per_s, rel=1e-9)


def test_windowed_prefill_pairs_by_hand() -> None:
    # Window 3, a sequence of 6 tokens whose first 2 are cached: tokens 2-5 attend to 3 each.
    assert windowed_prefill_pairs(((6, 2),), 3) == 12
    # Shorter than the window: causal pairs, 3 x 4 / 2; and the sum over sequences.
    assert windowed_prefill_pairs(((3, 0), (6, 2)), 8) == 6 + (21 - 3)
    # The engine's shapes carry the spans.
    seqs = [SimpleNamespace(num_kv_tokens=6, num_reused_tokens=2),
            SimpleNamespace(num_kv_tokens=3, num_reused_tokens=0)]  # fmt: skip
    assert iteration_shape(seqs, 0, 0).prefill_spans == ((6, 2), (3, 0))  # type: ignore[arg-type]


def test_a_prompt_cached_whole_still_computes_its_last_token() -> None:
    # 32 tokens, two full blocks of 16 both cached: its last token is fed for its logits and
    # attends to all 32, as the real executor runs it; alone, the iteration is not free.
    from kvbench.core.request import Request
    from kvbench.engine.records import RequestRecord
    from kvbench.engine.sequence import Sequence

    def prompt(num_tokens: int, num_cached_tokens: int) -> Sequence:
        record = RequestRecord(0, 0.0, num_tokens, 4, 4)
        return Sequence(request=Request(0, 0.0, num_tokens, 4), record=record, seq_id=0,
                        num_cached_tokens=num_cached_tokens)  # fmt: skip

    shape = iteration_shape([prompt(32, 32)], 0, 0)
    assert (shape.num_prefill_tokens, shape.prefill_attention_pairs) == (1, 32)
    assert shape.prefill_spans == ((32, 31),)
    assert _model("llama-2-13b").iteration_time_s(shape) > 0
    assert iteration_shape([prompt(40, 32)], 0, 0).num_prefill_tokens == 8


def test_full_attention_models_keep_the_formula_float_for_float() -> None:
    cost_model = _model("llama-2-13b")
    assert cost_model.terms.window_tokens is None
    for shape in [IterationShape(0, 0, 7, 9_001), IterationShape(500, 125_250, 3, 4_000)]:
        num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
        old = cost_model.terms.time_fn(num_tokens)  # the num_decode_tokens it ignores
        assert cost_model.iteration_time_s(shape) == old(
            shape.decode_context_tokens, shape.prefill_attention_pairs
        )
    decode_time_s = cost_model.decode_time_fn(7)
    assert decode_time_s(9_001) == cost_model.iteration_time_s(IterationShape(0, 0, 7, 9_001))


def test_the_fast_paths_decode_time_is_the_iterations_for_a_hybrid_model() -> None:
    cost_model = _model("gpt-oss-20b")
    for context in (100, 1_280, 50_000):
        assert cost_model.decode_time_fn(NUM_SEQS)(context) == cost_model.iteration_time_s(
            IterationShape(0, 0, NUM_SEQS, context)
        )
