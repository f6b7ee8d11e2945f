"""Text tokenizers, offline.

The one place that turns text into token counts. The sidecar and the sweep both count through
these classes, so a ceiling measured by the sweep and enforced by the sidecar use the same ruler.

tiktoken normally downloads its vocabularies on first use; we ship the official files inside the
package (``ceiling/data``), verify their sha256 and hand tiktoken the ranks directly, so counting
never touches the network.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import tiktoken
import tiktoken_ext.openai_public as _openai_public  # type: ignore[import-untyped]

from context_ceiling.core.errors import UserError

DATA_DIR = Path(__file__).with_name("data")

#: sha256 of the official vocabulary files (the same values tiktoken pins).
ENCODING_SHA256: dict[str, str] = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

_ctor_lock = threading.Lock()


class TokenizerError(UserError, ValueError):
    """A tokenizer could not be loaded; the message says which and why."""


def _read_ranks(name: str) -> dict[bytes, int]:
    path = DATA_DIR / f"{name}.tiktoken"
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != ENCODING_SHA256[name]:
        raise TokenizerError(f"{path}: sha256 {digest} does not match the official {name} file")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@cache
def load_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding ``name`` built from the packaged vocabulary.

    The pattern and special tokens come from tiktoken's own constructor so they can never drift
    from upstream; only its download step is replaced by the packaged file.
    """
    if name not in ENCODING_SHA256:
        raise TokenizerError(
            f"unknown tiktoken encoding {name!r}; shipped: {', '.join(sorted(ENCODING_SHA256))}"
        )
    ranks = _read_ranks(name)
    ctor: Callable[[], dict[str, Any]] = getattr(_openai_public, name)
    with _ctor_lock:
        original = _openai_public.load_tiktoken_bpe
        _openai_public.load_tiktoken_bpe = lambda *_a, **_k: ranks
        try:
            spec = ctor()
        finally:
            _openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**spec)


class TextCounter(Protocol):
    """Counts the tokens of a piece of text for one model family."""

    #: short, bounded description used in logs ("tiktoken:o200k_base", ...)
    name: str

    def count(self, text: str) -> int: ...


class TiktokenCounter:
    """A tiktoken BPE; special-token text in user content is counted as ordinary text."""

    #: texts shorter than this are remembered: roles, names, separators between documents recur
    #: on every request, and a dict lookup is ~25x cheaper than a call into the BPE
    SHORT = 24

    def __init__(self, encoding: str) -> None:
        self.encoding = load_encoding(encoding)
        self.name = f"tiktoken:{encoding}"
        self._encode = self.encoding.encode_ordinary
        self._short: dict[str, int] = {}

    def count(self, text: str) -> int:
        if len(text) >= self.SHORT:
            return len(self._encode(text))
        n = self._short.get(text)
        if n is None:
            n = len(self._encode(text)) if text else 0
            if len(self._short) < 65536:  # bounded: short texts come from clients too
                self._short[text] = n
        return n


class HuggingFaceCounter:
    """A Hugging Face ``tokenizer.json`` (open models), loaded from a local path only."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ModuleNotFoundError as exc:
            raise TokenizerError(
                f"{path}: a huggingface tokenizer needs the hf extra: "
                "pip install 'context-ceiling[hf]'"
            ) from exc

        p = Path(path)
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # the library raises bare Exception subclasses
            raise TokenizerError(f"{p}: cannot load tokenizer.json: {exc}") from exc
        self.name = f"huggingface:{p.name}"

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tok.encode(text, add_special_tokens=False).ids)


class CalibratedCounter:
    """A stand-in BPE scaled by a measured factor, for models with no public tokenizer.

    Claude's tokenizer is not published. Counting with a known BPE and multiplying by a factor
    fitted against the provider's reported usage keeps the estimate honest; the sidecar's
    ``llm_context_token_estimate_error_ratio`` shows when the factor needs refitting.
    """

    def __init__(self, base: TextCounter, factor: float) -> None:
        if factor <= 0:
            raise TokenizerError(f"calibration factor must be > 0, got {factor}")
        self._base = base
        self.factor = factor
        self.name = f"calibrated:{base.name}x{factor:g}"

    def count(self, text: str) -> int:
        n = self._base.count(text)
        return round(n * self.factor) if n else 0


class CountCache:
    """Remembers the token counts of long texts already counted, least recently used first out.

    Real traffic repeats itself: the system prompt and tool schemas ride on every request, an
    agent resends its whole history each turn, popular documents are retrieved again and again.
    Counting is most of what the sidecar spends per request, and a dictionary lookup of a text
    (hash + compare) is ~30x cheaper than encoding it. Only texts of at least ``min_chars`` are
    kept (shorter ones encode faster than they hash), the total is bounded by ``max_bytes`` of
    memory held by the texts (``sys.getsizeof``: 1, 2 or 4 bytes a character, so non-Latin text
    is not kept at 4x the budget), and it lives in process memory only: nothing is logged or
    written. A lock guards the table (the sidecar also counts on worker threads); the counting
    itself runs outside it.
    """

    def __init__(self, max_bytes: int, min_chars: int = 512) -> None:
        self.max_bytes = max_bytes
        self.min_chars = min_chars
        self._lru: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._lru)

    def wrap(self, counter: TextCounter) -> TextCounter:
        return _CachedCounter(counter, self)

    def count(self, counter: TextCounter, text: str) -> int:
        if len(text) < self.min_chars:
            return counter.count(text)
        key = (counter.name, text)
        with self._lock:
            n = self._lru.get(key)
            if n is not None:
                self._lru.move_to_end(key)
                self.hits += 1
                return n
        n = counter.count(text)
        size = sys.getsizeof(text)  # bytes the string holds (1, 2 or 4 per character), O(1)
        with self._lock:
            self.misses += 1
            if size <= self.max_bytes and key not in self._lru:
                self._lru[key] = n
                self.bytes += size
                while self.bytes > self.max_bytes:
                    (_, old), _ = self._lru.popitem(last=False)
                    self.bytes -= sys.getsizeof(old)
        return n


class RequestMemo:
    """Remembers, for one request only, the counts of the long texts counted for it.

    Trimming counts the fitted body again (the honest ``after``), and a fitted body is mostly the
    texts already counted: the chunks and turns it kept. Without this the recount re-encodes them,
    so enforcing cost up to 1.85x observing at 64k tokens; with it only the texts the trimmer
    rewrote are encoded again. Unlike :class:`CountCache` it is always on (also with the count
    cache off), holds only references to strings the request holds anyway, and dies with the
    request.
    """

    __slots__ = ("_seen", "inner", "min_chars", "name")

    def __init__(self, inner: TextCounter, min_chars: int = 256) -> None:
        self.inner, self.name, self.min_chars = inner, inner.name, min_chars
        self._seen: dict[str, int] = {}

    def count(self, text: str) -> int:
        if len(text) < self.min_chars:
            return self.inner.count(text)
        n = self._seen.get(text)
        if n is None:
            n = self._seen[text] = self.inner.count(text)
        return n


class _CachedCounter:
    __slots__ = ("cache", "inner", "name")

    def __init__(self, inner: TextCounter, cache: CountCache) -> None:
        self.inner, self.cache, self.name = inner, cache, inner.name

    def count(self, text: str) -> int:
        return self.cache.count(self.inner, text)
