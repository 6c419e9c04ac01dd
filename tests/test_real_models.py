"""The models executor=real and task=profile load: random weights of a catalog entry's shape (a
GPU's way to time a model no machine here has the weights of), local Hugging Face folders, and
the device they live on; the errors that name the fix when a choice cannot run."""

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import compose_config

from kvbench.config import ConfigError
from kvbench.core.catalog import model_names
from kvbench.core.packaged_conf import read_option
from kvbench.executors.forward import model_kv_shape
from kvbench.executors.names import resolve_device
from kvbench.tasks.equivalence.models import (
    catalog_llama_config,
    load_model,
    load_model_dir,
    random_model,
)
from kvbench.tasks.equivalence.names import TINY_GQA
from kvbench.tasks.simulate.real_runner import load_real_model

RANDOM_WEIGHT_MODELS = [name for name in model_names()
                        if read_option("model", name).get("vocab_size") is not None]  # fmt: skip
# A catalog entry's shape at a size a test builds in milliseconds.
TINY_ENTRY = {"name": "tiny", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
              "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 16,
              "max_model_len": 256, "tied_embeddings": False}  # fmt: skip


def test_the_llama_family_entries_give_a_random_weight_shape():
    assert {"llama-3-8b", "llama-2-7b", "llama-3-70b", "qwen2.5-72b", "smollm2-135m"} <= set(
        RANDOM_WEIGHT_MODELS
    )


@pytest.mark.parametrize("name", RANDOM_WEIGHT_MODELS)
def test_a_random_weight_model_has_the_catalog_entry_s_parameters_and_kv(name):
    # Built on the meta device: shapes only, so a 405B model costs nothing. The catalog's
    # num_parameters (from the model cards) must come out of the shape within 1 %.
    entry = read_option("model", name)
    model = random_model(catalog_llama_config(entry), torch.bfloat16, "meta")
    num_parameters = sum(p.numel() for p in model.parameters())
    assert num_parameters == pytest.approx(float(entry["num_parameters"]), rel=0.01)
    assert model_kv_shape(model) == (entry["num_layers"], entry["num_kv_heads"], entry["head_dim"])


def test_random_weights_are_the_seed_s():
    config = catalog_llama_config(TINY_ENTRY)
    first, again = (random_model(config, torch.float32, "cpu", seed=3) for _ in range(2))
    other = random_model(config, torch.float32, "cpu", seed=4)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(first.state_dict()[weight], again.state_dict()[weight])
    assert not torch.equal(first.state_dict()[weight], other.state_dict()[weight])


def test_a_shape_without_vocabulary_is_refused_by_name():
    with pytest.raises(ValueError, match=r"needs model\.vocab_size and model\.intermediate_size"):
        catalog_llama_config({**TINY_ENTRY, "vocab_size": None, "intermediate_size": None})


def test_the_config_loads_random_weights_of_the_catalog_shape():
    cfg, _, _ = compose_config("executor=real", "executor.weights=random", "model=smollm2-135m",
                               "model.dtype=bf16", "executor.device=cpu")  # fmt: skip
    model = load_real_model(cfg)
    assert model.dtype == torch.bfloat16 and model.device.type == "cpu"
    assert model_kv_shape(model) == (30, 3, 64)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # tied embeddings


def test_a_local_folder_loads_and_a_shape_off_the_catalog_is_refused(tmp_path):
    tiny = load_model(TINY_GQA)
    tiny.save_pretrained(tmp_path)
    loaded = load_model_dir(tmp_path, torch.float32, "cpu")
    weight = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(loaded.state_dict()[weight], tiny.state_dict()[weight])
    cfg, _, _ = compose_config("executor=real", f"executor.model_dir={tmp_path}",
                               "model=llama-3-8b", "model.dtype=fp32")  # fmt: skip
    with pytest.raises(ValueError, match=r"\(2, 2, 16\), model=llama-3-8b says \(32, 8, 128\)"):
        load_real_model(cfg)
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_model_dir(tmp_path / "absent", torch.float32, "cpu")


@pytest.mark.parametrize("broken", ["config that is not JSON", "config without weights"])
def test_a_folder_transformers_cannot_load_is_one_line_with_the_fix(tmp_path, broken):
    config = ("{" if broken == "config that is not JSON"
              else load_model(TINY_GQA).config.to_json_string())  # fmt: skip
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(OSError) as refused:
        load_model_dir(tmp_path, torch.float32, "cpu")
    message = str(refused.value)
    assert message.startswith(f"executor.model_dir={tmp_path}: transformers cannot load a model "
                              "there (")
    assert message.endswith("); give a Hugging Face folder (config.json, *.safetensors)")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=llama-3-8b"], "executor.model_dir=PATH.*executor.weights=random"),
        (["model=opt-13b", "executor.weights=random"], "needs model.vocab_size"),
        (["model=mistral-7b-v0.1", "executor.weights=random"], "sliding and mixture-of-experts"),
        (["model=mixtral-8x7b", "executor.weights=random"], "num_active_parameters="),
        (["executor.weights=random", "executor.model_dir=/x"], "drop one of the two"),
        (["executor.weights=trained"], "allowed are pretrained, random"),
        (["executor.device=tpu"], "allowed are auto, cpu, cuda"),
        (["executor.linear_backend=mkl"], "allowed are aten, onednn"),
    ],
)
def test_a_model_the_executor_cannot_load_is_refused_with_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        compose_config("executor=real", *overrides)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals without a GPU")
def test_cuda_or_triton_without_a_gpu_is_refused_and_auto_takes_the_cpu(monkeypatch):
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match=r"sees no GPU: use executor\.device=cpu"):
        compose_config("executor=real", "executor.device=cuda")
    smollm2 = ("executor=real", "model=smollm2-135m", "executor.decode_backend=triton")
    compose_config(*smollm2)  # TRITON_INTERPRET=1 in the tests without a GPU (conftest)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="compiles for a GPU and the model is on the CPU"):
        compose_config(*smollm2)


# Three fixed requests served by random SmolLM2 weights on the CPU from a 0.005 GiB pool.
TINY_SERVE = (
    "executor=real", "executor.weights=random", "model=smollm2-135m", "model.dtype=fp32",
    "model.max_model_len=64", "hardware=cpu", "hardware.kv_cache_gib=0.005",
    "workload=fixed", "workload.num_requests=3", "workload.prompt_tokens=12",
    "workload.output_tokens=4", "request_rates=[50]", "allocators=[paged]",
    "progress=false", "plots=false", "summary_table=false",
)  # fmt: skip


@pytest.mark.parametrize("linear_backend", ["aten", "onednn"])
def test_a_random_weight_model_serves_through_the_app(tmp_path, linear_backend):
    from kvbench.tasks.simulate.experiment import run_experiment

    cfg, deployment, raw = compose_config(*TINY_SERVE, f"executor.linear_backend={linear_backend}")
    summary = run_experiment(cfg, deployment, raw, tmp_path)
    assert summary["num_finished"].tolist() == [3]
    assert summary["peak_device_bytes"].isna().all()  # a CPU run: no device memory to report
    assert summary["kv_pool_bytes"].tolist() == [116 // 16 * 16 * 46_080]


def test_fp8_kv_holds_four_times_the_tokens_in_the_same_bytes(tmp_path):
    # model.kv_dtype=fp8 counts 1 byte per K/V element into the allocator's slots; the pools
    # must really be fp8, not the model's fp32 at four times the budget.
    from kvbench.tasks.simulate.experiment import run_experiment

    cfg, deployment, raw = compose_config(*TINY_SERVE, "model.kv_dtype=fp8")
    summary = run_experiment(cfg, deployment, raw, tmp_path)
    assert summary["num_finished"].tolist() == [3]
    fp8_bytes_per_slot = 46_080 // 4  # 2 x 30 layers x 3 KV heads x 64 x 1 byte
    assert summary["kv_pool_bytes"].tolist() == [466 // 16 * 16 * fp8_bytes_per_slot]
    assert summary["kv_pool_bytes"].iloc[0] <= 0.005 * 2**30


@pytest.mark.parametrize(("overrides", "expected"), [
    (("executor=real", "model.kv_dtype=bf16"),
     "model.kv_dtype='bf16' with model.dtype='fp32': executor=real stores K/V in the model's "
     "dtype; set model.kv_dtype=null"),
    (("task=sim_to_vllm", "model.kv_dtype=bf16"),
     r"model.kv_dtype='bf16' with model.dtype='fp32': task=sim_to_vllm stores K/V in the model's "
     r"dtype; set model.kv_dtype=null"),
    (("task=kernel_overhead", "executor=real", "model.kv_dtype=fp8"),
     r"task=kernel_overhead stores K/V in the model's dtype \(fp8: executor=real and task=profile"
     r"\|profile_check\|sim_to_real\|sim_to_vllm\|paper_executed only\)"),
])  # fmt: skip
def test_kv_dtypes_a_real_model_cannot_store_are_refused(overrides, expected):
    with pytest.raises(ConfigError, match=expected) as error:
        compose_config("model=smollm2-135m", "model.dtype=fp32", "hardware=cpu", *overrides)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("task", ["profile", "profile_check", "sim_to_real", "paper_executed"])
def test_on_a_gpu_fp8_k_v_through_triton_needs_compute_capability_8_9(task, monkeypatch):
    overrides = ("model=smollm2-135m", "model.dtype=fp32", "hardware=cpu", f"task={task}",
                 "executor.profile=profile.json", "model.kv_dtype=fp8", "executor.device=cuda",
                 "executor.decode_backend=triton")  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ConfigError, match=r"model.kv_dtype=fp8 with executor.decode_backend="
                                          r"triton: Triton reads .* NVIDIA A100-SXM4-80GB is "
                                          r"8.0; set executor.decode_backend=sdpa or"):  # fmt: skip
        compose_config(*overrides)
    cfg, _, _ = compose_config(*overrides, "executor.decode_backend=sdpa")  # any GPU
    assert cfg.model.kv_dtype == "fp8"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # H100
    cfg, _, _ = compose_config(*overrides)
    assert (cfg.model.kv_dtype, cfg.executor.decode_backend) == ("fp8", "triton")


def test_the_gpu_session_s_sim_to_real_composes_with_its_186_slot_pool():
    # kernels/gpu_session.sh's settings for the H200: sim_to_real's requests and pool in slots
    # (naive_max reserves 64 of 186 per request), on a random-weight Llama-3-8B.
    cfg, deployment, _ = compose_config(
        "experiment=sim_to_real", "model=llama-3-8b", "model.dtype=bf16", "hardware=h200-141gb",
        "executor.weights=random", "executor.decode_backend=triton",
        "executor.num_threads=null", "hardware.kv_cache_gib=0.02271",
        "workload_request_rates.alpaca=[1.0,16.0]", "sim_to_real.repeat_replays=false",
    )  # fmt: skip
    assert (cfg.model.name, cfg.model.max_model_len, cfg.executor.kind) == ("llama-3-8b", 64,
                                                                            "real")
    assert not cfg.sim_to_real.repeat_replays
    assert deployment.kv_bytes_per_token == 131_072
    assert deployment.num_kv_slots == 186


def test_the_gpu_session_s_dry_run_says_to_prepare_first(tmp_path):
    # A checkout without .gpu/: the dry run stops before any step, naming the command that
    # copies the traces its sim_to_real step reads.
    (tmp_path / "kernels").mkdir()
    script = Path(__file__).resolve().parents[1] / "kernels" / "gpu_session.sh"
    shutil.copy(script, tmp_path / "kernels" / "gpu_session.sh")
    done = subprocess.run(["bash", "kernels/gpu_session.sh", "dry-run", str(tmp_path / "runs")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert ".gpu/traces/alpaca_5000_gpt2bpe_lengths.csv is missing: run 'bash " in done.stderr
    assert "gpu_session.sh prepare' here first" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("gpu_name", "hardware", "warned"), [
    ("NVIDIA H100 80GB HBM3", "h100-80gb", False),  # nvidia-smi's names of the lent kinds
    ("NVIDIA H200", "h200-141gb", False),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb", False),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb", False),
    ("NVIDIA GeForce RTX 4090", "h100-80gb", True),  # not in the catalog: said so
])  # fmt: skip
def test_the_gpu_session_labels_its_runs_with_the_catalog_name_of_the_gpu_it_finds(
        gpu_name, hardware, warned):  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["bash", "kernels/gpu_session.sh", "hardware-of", gpu_name], cwd=root,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout == f"{hardware}\n"
    assert (root / "conf" / "hardware" / f"{hardware}.yaml").exists()
    assert ("is not in conf/hardware" in done.stderr) == warned


def test_the_random_weights_tool_gives_a_ratio_per_point_and_round():
    from kvbench.tools import random_weights

    tiny = load_model(TINY_GQA)
    measured = random_weights.ratios(tiny, load_model(TINY_GQA, seed=1), num_rounds=2, repeats=1)
    assert set(measured) == set(random_weights.POINTS)
    assert all(len(values) == 2 and min(values) > 0 for values in measured.values())
