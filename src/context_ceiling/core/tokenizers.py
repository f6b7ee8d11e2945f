"""Text tokenizers, offline.

The one place that turns text into token counts. The sidecar and the sweep both count through
these classes, so a ceiling measured by the sweep and enforced by the sidecar use the same ruler.

tiktoken normally downloads its vocabularies on first use; we ship the official files inside the
package (``core/data``), verify their sha256 and hand tiktoken the ranks directly, so counting
never touches the network.

The same vocabularies can also drive a faster reimplementation of tiktoken's encoder:
``riptoken`` (the ``fast`` extra) or ``gigatoken`` (the ``gigatoken`` extra, faster again,
through a bounded cache of pieces it has encoded; docs/counting.md has the measured figures). Either is used only where it agrees with
tiktoken token for token on the packaged check text (``data/bpe_check.txt``, many scripts and
edge cases), and tiktoken stays the fallback: without them, when they disagree, and for text they
cannot take (lone surrogates, which tiktoken repairs itself). ``tests/core/test_bpe_engines.py``
proves identical counts on a large multilingual corpus, for each.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Protocol

import tiktoken
import tiktoken_ext.openai_public as _openai_public  # type: ignore[import-untyped]

from context_ceiling.core.errors import UserError

DATA_DIR = Path(__file__).with_name("data")
CHECK_TEXT = DATA_DIR / "bpe_check.txt"

log = logging.getLogger(__name__)

#: which implementation encodes a tiktoken encoding (``counting.bpe``): ``auto`` takes
#: gigatoken, else riptoken, where it is installed and agrees with tiktoken on the check text,
#: else tiktoken
Bpe = Literal["auto", "tiktoken", "riptoken", "gigatoken"]
#: the faster encoders, in the order ``auto`` tries them
FastBpe = Literal["gigatoken", "riptoken"]
FAST_BPES: tuple[FastBpe, ...] = ("gigatoken", "riptoken")
#: the extra that installs each
_EXTRA = {"gigatoken": "gigatoken", "riptoken": "fast"}
#: the distributions each may be installed as (for the version its messages name)
_DISTS = {"gigatoken": ("gigatoken-cachefix", "gigatoken"), "riptoken": ("riptoken",)}
#: gigatoken's cache of encoded pieces, per encoding: when full it is wiped back to its
#: vocabulary seed and refilled (the counts never change). Its own default is 512 MiB a worker;
#: a sidecar holds two encodings. Measured here: the seed is ~25-30 MiB, and 4 million random
#: words left the process 27-30 MiB above its loaded size with this budget.
GIGATOKEN_CACHE_BYTES = 32 << 20
#: gigatoken's name for the split pattern of each shipped encoding (its .tiktoken loader takes
#: the pattern by name; the check text proves it is tiktoken's)
_GIGATOKEN_PRETOKENIZER = {"o200k_base": "o200k", "cl100k_base": "gpt4"}

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
def encoding_spec(name: str) -> dict[str, Any]:
    """The constructor arguments of encoding ``name`` (ranks, pattern, special tokens), from the
    packaged vocabulary. The pattern and special tokens come from tiktoken's own constructor so
    they can never drift from upstream; only its download step is replaced by the packaged
    file."""
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
            return ctor()
        finally:
            _openai_public.load_tiktoken_bpe = original


@cache
def load_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding ``name`` built from the packaged vocabulary."""
    return tiktoken.Encoding(**encoding_spec(name))


class _Unsuitable(Exception):
    """An installed fast encoder that must not be used; the message says why."""


def _version(engine: FastBpe) -> str:
    for dist in _DISTS[engine]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "?"


def _riptoken(name: str) -> tuple[Callable[[str], Sequence[int]], str]:
    import riptoken

    spec = encoding_spec(name)
    core = riptoken.CoreBPE(spec["mergeable_ranks"], spec["special_tokens"], spec["pat_str"])
    encode: Callable[[str], Sequence[int]] = core.encode_ordinary
    return encode, f"riptoken {_version('riptoken')}"


def _gigatoken(name: str) -> tuple[Callable[[str], Sequence[int]], str]:
    """gigatoken's encoder on the packaged vocabulary (whose sha256 ``encoding_spec`` checked),
    without special tokens: every text is ordinary text, as ``encode_ordinary`` has it.

    One encoder object is not safe to call from two threads at once (it raises "Already
    borrowed"), and it holds the GIL while it encodes, so a lock costs no parallelism: counting
    threads take turns."""
    import gigatoken.gigatoken_rs as gt

    version = f"gigatoken {_version('gigatoken')}"
    if not hasattr(gt, "set_max_cache_bytes"):
        raise _Unsuitable(
            f"{version} has no bound on its piece cache (it grows with every new piece); "
            "install gigatoken-cachefix>=0.10.1 (pip install 'context-ceiling[gigatoken]')"
        )
    encoding_spec(name)  # the packaged file's checksum, before anything reads it
    with _ctor_lock:  # the budget is process-wide and applies to encoders built after it
        gt.set_max_cache_bytes(GIGATOKEN_CACHE_BYTES)
        tok = gt.BPETokenizer.from_tiktoken(
            str(DATA_DIR / f"{name}.tiktoken"), _GIGATOKEN_PRETOKENIZER[name], None
        )
    lock = threading.Lock()

    def encode(text: str) -> Sequence[int]:
        with lock:
            # a numpy array of the ids: its length and items are all a count needs
            return tok.encode(text)  # type: ignore[return-value]

    return encode, version


_BUILDERS: dict[FastBpe, Callable[[str], tuple[Callable[[str], Sequence[int]], str]]] = {
    "gigatoken": _gigatoken,
    "riptoken": _riptoken,
}


@cache
def fast_encoder(
    name: str, engine: FastBpe = "riptoken"
) -> tuple[Callable[[str], Sequence[int]] | None, str]:
    """``engine``'s encoder for encoding ``name`` (its tokens for a text, as tiktoken's
    ``encode_ordinary``), built from the same vocabulary, and why not when it is None: it is not
    installed, or it splits the check text into other tokens than tiktoken does (a newer
    release, another regex engine: then it is never used)."""
    try:
        encode, version = _BUILDERS[engine](name)
        text = CHECK_TEXT.read_text(encoding="utf-8")
        same = list(encode(text)) == load_encoding(name).encode_ordinary(text)
    except ImportError:
        return None, f"{engine} is not installed (pip install 'context-ceiling[{_EXTRA[engine]}]')"
    except _Unsuitable as exc:
        log.warning(f"{engine} not used", extra={"fields": {"reason": str(exc)}})
        return None, str(exc)
    except Exception as exc:  # a broken build of a vendor extension: not ours to crash on
        why = f"{engine} {_version(engine)} failed on {name}: {exc}"
        log.warning(f"{engine} failed: not used", extra={"fields": {"reason": why}})
        return None, why
    if not same:
        why = f"{version} splits the check text into other {name} tokens than tiktoken does"
        # once per encoding (this is cached), not once per counter built on it
        log.warning(
            f"{engine} disagrees with tiktoken: not used", extra={"fields": {"reason": why}}
        )
        return None, why
    return encode, ""


class TextCounter(Protocol):
    """Counts the tokens of a piece of text for one model family."""

    #: short, bounded description used in logs ("tiktoken:o200k_base", ...)
    name: str

    def count(self, text: str) -> int: ...


class TiktokenCounter:
    """A tiktoken BPE; special-token text in user content is counted as ordinary text.

    ``bpe`` picks the implementation (the counts are the same; see the module docstring):
    ``engine`` says which one counts, for the startup line and ``serve --check``."""

    #: texts shorter than this are remembered: roles, names, separators between documents recur
    #: on every request, and a dict lookup is ~25x cheaper than a call into the BPE
    SHORT = 24

    def __init__(self, encoding: str, bpe: Bpe = "auto") -> None:
        self.encoding = load_encoding(encoding)
        self.name = f"tiktoken:{encoding}"
        slow = self.encoding.encode_ordinary
        self.engine: str = "tiktoken"
        self._encode: Callable[[str], Sequence[int]] = slow
        engines = FAST_BPES if bpe == "auto" else () if bpe == "tiktoken" else (bpe,)
        for engine in engines:
            fast, why = fast_encoder(encoding, engine)
            if fast is not None:
                self.engine, self._encode = engine, _with_fallback(fast, slow, engine)
                break
            if bpe == engine:
                raise TokenizerError(f"counting.bpe is {engine}, but {why}")
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


def bpe_engine(counter: TextCounter) -> str | None:
    """Which implementation a counter's tiktoken encoding runs on (None: not a tiktoken one),
    through the count cache's and the calibration's wrappers."""
    inner: object = counter
    while not isinstance(inner, TiktokenCounter):
        inner = getattr(inner, "inner", None) or getattr(inner, "_base", None)
        if inner is None:
            return None
    return inner.engine


#: riptoken 0.2.4 merges a pre-tokenized piece of 500 bytes or more differently from tiktoken
#: (another merge algorithm for long pieces; ties in runs of one character, and the count of a
#: long run of letters, come out otherwise): such texts go to tiktoken. A piece never spans more
#: than one character, a run of non-whitespace and a run of whitespace (the patterns' classes;
#: o200k's punctuation piece may end in a run of newlines and slashes), so runs under LONG_RUN
#: bytes bound every piece under 500 bytes. Checked on the UTF-8 bytes with C-speed translations
#: and substring searches: a regular expression here costs more than the fast encoder saves.
LONG_RUN = 248
_WS_BYTES = b" \t\n\x0b\x0c\r"
_CLASS = bytes(0 if c in _WS_BYTES else 1 for c in range(256))
_TAIL = bytes(0 if c in b"\r\n/" else 1 for c in range(256))
#: non-ASCII bytes as whitespace too: a long run of these may hold Unicode whitespace (no-break
#: and ideographic spaces) that the patterns split on but the ASCII classes above cannot see
_WS_OR_WIDE = bytes(0 if c in _WS_BYTES or c >= 0x80 else 1 for c in range(256))
_RUN_OF_1 = b"\x01" * LONG_RUN
_RUN_OF_0 = b"\x00" * LONG_RUN
_MAX_CHAR_BYTES = 4


def pieces_are_short(text: str) -> bool:
    """Whether every piece the encodings' split patterns can cut from ``text`` is under 500
    bytes (conservative: False may also mean "could not tell cheaply")."""
    if len(text) * _MAX_CHAR_BYTES < 2 * LONG_RUN:
        return True
    raw = text.encode("utf-8")  # lone surrogates raise UnicodeEncodeError: the caller's fallback
    classes = raw.translate(_CLASS)
    if _RUN_OF_1 in classes or _RUN_OF_0 in classes or _RUN_OF_0 in raw.translate(_TAIL):
        return False
    return text.isascii() or _RUN_OF_0 not in raw.translate(_WS_OR_WIDE)


def _with_fallback(
    fast: Callable[[str], Sequence[int]], slow: Callable[[str], list[int]], engine: FastBpe
) -> Callable[[str], Sequence[int]]:
    """``fast`` where it counts what tiktoken counts, ``slow`` elsewhere: riptoken only on texts
    whose pieces are short (see LONG_RUN); neither takes lone surrogates (riptoken raises
    UnicodeEncodeError, gigatoken TypeError), which tiktoken repairs as it always has."""
    guarded = engine == "riptoken"

    def encode(text: str) -> Sequence[int]:
        try:
            if not guarded or pieces_are_short(text):
                return fast(text)
        except (UnicodeEncodeError, TypeError):
            pass
        return slow(text)

    return encode


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
    """Remembers the token counts of long texts, and the counted parts of whole messages, least
    recently used first out.

    Real traffic repeats itself: the system prompt and tool schemas ride on every request, an
    agent resends its whole history each turn, popular documents are retrieved again and again.
    Counting is most of what the sidecar spends per request, and a dictionary lookup of a text
    (hash + compare) is ~30x cheaper than encoding it. Only texts of at least ``min_chars`` are
    kept (shorter ones encode faster than they hash).

    Whole messages (:meth:`recall`, :meth:`keep`): an agent's resent history would still cost a
    walk over every message and block, a shape check and a hash of every text each turn, growing
    with the history. The counters keep each message's counted parts under its serialised bytes
    and the context its count depends on, so a message seen before costs one lookup (see
    ``context_ceiling.core.counting``).

    The total is bounded by ``max_bytes``: a text is charged the memory it holds
    (``sys.getsizeof``: 1, 2 or 4 bytes a character, so non-Latin text is not kept at 4x the
    budget), a message its bytes and its parts. It lives in process memory only: nothing is
    logged or written. A lock guards the table (the sidecar also counts on worker threads); the
    counting itself runs outside it.
    """

    def __init__(self, max_bytes: int, min_chars: int = 512) -> None:
        self.max_bytes = max_bytes
        self.min_chars = min_chars
        #: key -> (what is remembered, the bytes it is charged)
        self._lru: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
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
        n = self.recall(key)
        if n is None:
            n = counter.count(text)
            # bytes the string holds (1, 2 or 4 per character), O(1)
            self.keep(key, n, sys.getsizeof(text))
        return int(n)

    def recall(self, key: Hashable) -> Any:
        """What :meth:`keep` stored under ``key`` (a hit), or None (a miss)."""
        with self._lock:
            got = self._lru.get(key)
            if got is None:
                self.misses += 1
                return None
            self._lru.move_to_end(key)
            self.hits += 1
            return got[0]

    def keep(self, key: Hashable, value: Any, size: int) -> None:
        """Remember ``value`` under ``key`` (replacing what was there), charged ``size`` bytes;
        the least recently used entries go as needed."""
        with self._lock:
            held = self._lru.pop(key, None)
            if held is not None:
                self.bytes -= held[1]
            if size > self.max_bytes:
                return
            self._lru[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, old) = self._lru.popitem(last=False)
                self.bytes -= old


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
