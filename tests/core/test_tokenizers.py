"""The shipped tokenizer data is the official data, loads offline, and counts like tiktoken."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken

from context_ceiling.core.tokenizers import (
    DATA_DIR,
    ENCODING_SHA256,
    CalibratedCounter,
    HuggingFaceCounter,
    TiktokenCounter,
    TokenizerError,
    load_encoding,
)

SAMPLES = [
    "",
    "hello world",
    "Der Vertrag endet am 31.12.2027; Kündigungsfrist: 90 Tage.",
    "def f(x):\n    return x ** 2  # 平方\n",
    "emoji 🚀🔥 and <|endoftext|> in user text",
    "   leading spaces and\t\ttabs\n\n\nnewlines",
    "x" * 5000,
]


def _official(name: str, tmp_path: Path) -> tiktoken.Encoding:
    """tiktoken's own loader, fed the shipped file through its cache (hash checked by tiktoken)."""
    url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(
        (DATA_DIR / f"{name}.tiktoken").read_bytes()
    )
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        import tiktoken.registry

        tiktoken.registry.ENCODINGS.pop(name, None)
        return tiktoken.get_encoding(name)
    finally:
        del os.environ["TIKTOKEN_CACHE_DIR"]


@pytest.mark.parametrize("name", sorted(ENCODING_SHA256))
def test_shipped_vocabulary_is_the_official_file(name: str) -> None:
    data = (DATA_DIR / f"{name}.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == ENCODING_SHA256[name]


@pytest.mark.parametrize("name", sorted(ENCODING_SHA256))
def test_counts_agree_with_tiktoken(name: str, tmp_path: Path) -> None:
    official = _official(name, tmp_path)
    ours = TiktokenCounter(name)
    for text in SAMPLES:
        assert ours.count(text) == len(official.encode_ordinary(text)), text[:40]
    assert load_encoding(name).special_tokens_set == official.special_tokens_set


@pytest.mark.e2e
def test_loading_needs_no_network(tmp_path: Path) -> None:
    # A fresh interpreter with every proxy pointing nowhere still loads and counts.
    env = os.environ | {
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty"),
    }
    code = "from context_ceiling.core.tokenizers import TiktokenCounter as T; print(T('o200k_base').count('hello world'))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "2"
    assert not (tmp_path / "empty").exists()


def test_unknown_encoding_is_a_clear_error() -> None:
    with pytest.raises(TokenizerError, match="unknown tiktoken encoding 'p99k'"):
        load_encoding("p99k")


def test_huggingface_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["the service contract renews every year", "the renewal fee is 120 euros"] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = HuggingFaceCounter(path)
    text = "the contract renewal fee"
    assert counter.count(text) == len(Tokenizer.from_file(str(path)).encode(text).ids)
    assert counter.count("") == 0
    json.loads(path.read_text())  # it is a real tokenizer.json


def test_huggingface_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"nope\.json"):
        HuggingFaceCounter(tmp_path / "nope.json")


def test_calibrated_scales_the_base_count() -> None:
    base = TiktokenCounter("cl100k_base")
    text = "A fairly ordinary sentence about service level agreements and renewal dates."
    assert CalibratedCounter(base, 1.2).count(text) == round(base.count(text) * 1.2)
    with pytest.raises(TokenizerError):
        CalibratedCounter(base, 0)
