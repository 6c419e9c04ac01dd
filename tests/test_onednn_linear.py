"""executor.linear_backend=onednn (``kvbench.executors.onednn_linear``): every linear layer runs
through oneDNN on a prepacked weight, the model computes what it did up to float rounding, and
the plain weights it no longer reads are not kept twice."""

from __future__ import annotations

import copy

import pytest
import torch

from kvbench.executors.names import onednn_problem
from kvbench.executors.onednn_linear import use_onednn_linears
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import TINY_GQA


def test_the_model_computes_the_same_logits_through_onednn():
    stock = load_model(TINY_GQA)
    onednn = copy.deepcopy(stock)
    num_layers = stock.config.num_hidden_layers
    # q, k, v, o, gate, up, down per layer, and the LM head.
    assert use_onednn_linears(onednn) == 7 * num_layers + 1
    token_ids = torch.randint(0, stock.config.vocab_size, (3, 9), generator=torch.Generator()
                              .manual_seed(0))  # fmt: skip  # [3, 9]
    with torch.inference_mode():
        expected = stock(token_ids).logits  # [3, 9, vocab]
        got = onednn(token_ids).logits  # [3, 9, vocab]
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("tied", [False, True])
def test_plain_weights_are_dropped_unless_another_module_shares_them(tied):
    model = load_model(TINY_GQA)
    if tied:  # the LM head reads the embedding table, as SmolLM2's does
        model.lm_head.weight = model.model.embed_tokens.weight
    use_onednn_linears(model)
    projection = model.model.layers[0].self_attn.q_proj.weight
    assert projection.device.type == "meta" and projection.shape[1] == model.config.hidden_size
    assert model.lm_head.weight.device.type == ("cpu" if tied else "meta")
    assert model.model.embed_tokens.weight.device.type == "cpu"


@pytest.mark.parametrize(("backend", "device", "problem"), [
    ("aten", "cuda", None),
    ("onednn", "cpu", None),
    ("onednn", "cuda", "executor.linear_backend=onednn prepacks weights for the CPU and the "
                       "model is on cuda: use executor.linear_backend=aten there"),
])  # fmt: skip
def test_onednn_runs_on_the_cpu_only(backend, device, problem):
    assert onednn_problem(backend, device) == problem


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_half_precision_this_cpu_s_onednn_lacks_is_refused_by_name(dtype, monkeypatch):
    check = f"_is_mkldnn_{dtype}_supported"  # torch's own check of the CPU's instructions
    monkeypatch.setattr(torch.ops.mkldnn, check, lambda: False)
    assert onednn_problem("onednn", "cpu", dtype) == (
        f"executor.linear_backend=onednn with model.dtype={dtype}: this CPU's oneDNN has no "
        f"{dtype} matmul; use executor.linear_backend=aten or model.dtype=fp32")
    monkeypatch.setattr(torch.ops.mkldnn, check, lambda: True)
    assert onednn_problem("onednn", "cpu", dtype) is None
