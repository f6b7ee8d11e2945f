"""Real-looking secrets of every family a prompt may carry, generated (seeded) in each family's
published format, each embedded in a sentence as a user would paste it. Used by the redaction
tests and ``benchmarks/secret_redaction.py``. None of these is a live credential."""

from __future__ import annotations

import base64
import random
import string
from collections.abc import Callable
from typing import Any

LOWER, UPPER, DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits
ALNUM = LOWER + UPPER + DIGITS
B64 = ALNUM + "+/"


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _pem(rng: random.Random) -> str:
    body = base64.b64encode(rng.randbytes(600)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{lines}\n-----END RSA PRIVATE KEY-----"


#: family -> (secret maker, sentence with ``{}`` where it goes)
FAMILIES: dict[str, tuple[Callable[[random.Random], str], str]] = {
    "openai": (lambda r: "sk-proj-" + _r(r, ALNUM + "_-", 48), "my key is {} please debug"),
    "anthropic": (
        lambda r: "sk-ant-api03-" + _r(r, ALNUM + "_-", 93) + "AA",
        "ANTHROPIC_API_KEY={}",
    ),
    "google-api": (lambda r: "AIza" + _r(r, ALNUM + "_-", 35), "maps key: {}"),
    "google-oauth": (
        lambda r: "ya29." + _r(r, ALNUM + "_-", 60),
        "Authorization token {} expired?",
    ),
    "aws-key-id": (lambda r: "AKIA" + _r(r, UPPER + DIGITS, 16), "aws_access_key_id = {}"),
    "aws-secret": (lambda r: _r(r, B64, 40), "aws_secret_access_key = {}"),
    "github-classic": (lambda r: "ghp_" + _r(r, ALNUM, 36), "git clone with token {}"),
    "github-fine-grained": (
        lambda r: "github_pat_" + _r(r, ALNUM, 22) + "_" + _r(r, ALNUM, 59),
        "GH_TOKEN={} in CI",
    ),
    "huggingface": (lambda r: "hf_" + _r(r, LOWER + UPPER, 34), "use token {} for the hub"),
    "stripe": (lambda r: "sk_live_" + _r(r, ALNUM, 24), "stripe secret {} in prod"),
    "azure-ad": (
        lambda r: _r(r, ALNUM, 3) + r.choice("78") + "Q~" + _r(r, ALNUM + "_.~-", 31),
        "azure client_secret={}",
    ),
    "slack": (
        lambda r: "xoxb-" + _r(r, DIGITS, 12) + "-" + _r(r, DIGITS, 12) + "-" + _r(r, ALNUM, 24),
        "slack bot {}",
    ),
    "jwt": (
        lambda r: (
            "eyJhbGciOiJIUzI1NiJ9."
            + base64.urlsafe_b64encode(f'{{"sub":"{_r(r, DIGITS, 8)}"}}'.encode())
            .decode()
            .rstrip("=")
            + "."
            + _r(r, ALNUM + "_-", 43)
        ),
        "session cookie {}",
    ),
    "pem-private-key": (_pem, "here is the deploy key:\n{}\nuse it"),
    "password-in-text": (
        lambda r: (
            _r(r, UPPER, 2)
            + _r(r, LOWER, 4)
            + _r(r, DIGITS, 3)
            + r.choice("!#%&*")
            + _r(r, LOWER, 3)
        ),
        "the database password is: {}",
    ),
    "url-credentials": (
        lambda r: f"{_r(r, LOWER, 6)}:{_r(r, ALNUM, 14)}",
        "connect to postgres://{}@db.internal:5432/app",
    ),
}


def _putty(rng: random.Random) -> str:
    pub = base64.b64encode(rng.randbytes(51)).decode()
    priv = base64.b64encode(rng.randbytes(36)).decode()
    return (
        "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n"
        f"Comment: eddsa-key-2024{_r(rng, DIGITS, 4)}\nPublic-Lines: 2\n{pub[:64]}\n{pub[64:]}\n"
        f"Private-Lines: 1\n{priv}\nPrivate-MAC: {_r(rng, '0123456789abcdef', 64)}"
    )


def _password(rng: random.Random) -> str:
    return _r(rng, UPPER, 2) + _r(rng, LOWER, 5) + _r(rng, DIGITS, 3) + rng.choice("!#%&*@^")


#: secrets in the places scanners' rule sets look for them but a keyword match does not: inside
#: code calls, key files, CSV exports, connection strings, shell commands, headers, JSON, .env
#: and compose files (family -> (secret maker, text with ``{}`` where it goes))
IN_CONTEXT: dict[str, tuple[Callable[[random.Random], str], str]] = {
    "discord-bot-in-code": (
        lambda r: (
            r.choice("MNO")
            + _r(r, ALNUM, 25)
            + "."
            + _r(r, ALNUM + "_-", 6)
            + "."
            + _r(r, ALNUM + "_-", 38)
        ),
        'import discord\nclient = discord.Client()\nclient.run("{}")',
    ),
    "telegram-bot-in-code": (
        lambda r: _r(r, DIGITS, 10) + ":AA" + _r(r, ALNUM + "_-", 33),
        'bot = telebot.TeleBot("{}")\nbot.infinity_polling()',
    ),
    "putty-private-key": (_putty, "my key file, why does pageant refuse it?\n{}\n"),
    "aws-console-csv": (
        lambda r: _r(r, ALNUM + "/+", 40),
        "User name,Password,Access key ID,Secret access key,Console login link\n"
        "deploy,,AKIA"
        + "QWERTYUIOPASDFGH"
        + ",{},https://123456789012.signin.aws.amazon.com/console",
    ),
    "redis-url-no-user": (_password, "REDIS_URL=redis://:{}@cache.internal:6379/0"),
    "json-password": (_password, '{{"username": "svc-app", "password": "{}", "port": 5432}}'),
    "env-db-password": (_password, "DB_HOST=db.internal\nDB_USER=app\nDB_PASSWORD={}\n"),
    "compose-mysql-root": (
        _password,
        "services:\n  db:\n    image: mysql:8\n    environment:\n      - MYSQL_ROOT_PASSWORD={}\n",
    ),
    "passphrase": (
        lambda r: "-".join(_r(r, LOWER, 5) for _ in range(3)) + _r(r, DIGITS, 2),
        "the key's passphrase: {}",
    ),
    "curl-user-password": (_password, "curl -u admin:{} https://jenkins.internal/api/json"),
    "authorization-basic": (
        lambda r: base64.b64encode(f"admin:{_password(r)}".encode()).decode(),
        'curl -H "Authorization: Basic {}" https://registry.internal/v2/',
    ),
}
FAMILIES.update(IN_CONTEXT)

#: benign look-alikes: text that names passwords, keys and tokens, or has their shape, and holds
#: no secret (code that calls a password function, references to the environment, prose, hashes,
#: ids, URLs without credentials); ``{}`` takes a random identifier
BENIGN = (
    "password = get_password_from_vault({})",
    "pw = settings.db_password  # {}",
    'password = os.environ["DB_PASSWORD_{}"]',
    "DB_PASSWORD=${{DB_PASSWORD_{}}}",
    "    password: ${{MYSQL_PASSWORD}}  # {}",
    "def reset_password(user_{}): ...",
    "if not password: raise ValueError('password required for {}')",
    "The password policy requires 12 characters ({}).",
    "Forgot your password? Contact {} at the help desk.",
    "passphrase = prompt_for_passphrase({})",
    'secret = client.get_secret_value(SecretId="{}")',
    'WWW-Authenticate: Basic realm="{}"',
    "a basic understanding of {} is assumed",
    "commit {} (sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709)",
    "request id {}: 3f2b8c1e-4d5a-4e6f-9a7b-8c9d0e1f2a3b",
    "redis://cache.internal:6379/{}",
    "postgres://app@db.internal:5432/{}",
    "curl -u $USER:$TOKEN https://{}.internal/api",
    "see https://github.com/org/{}/blob/main/README.md",
    "token_count = count_tokens(text_{})",
    "api_key_name = '{}'",
    "Set AWS_SECRET_ACCESS_KEY in your environment, never in {}.",
    "the secret to {} is patience",
    "{}: the password field is hashed with argon2id",
    "user,email,role\n{},a@example.com,admin",
    "version 1.2.3-{}",
)


def benign(n: int = 200, seed: int = 0) -> list[str]:
    """``n`` benign look-alikes (each template in turn, with a random identifier)."""
    rng = random.Random(seed)
    return [BENIGN[k % len(BENIGN)].format(_r(rng, LOWER, 6) + str(k)) for k in range(n)]


def corpus(n: int = 50, seed: int = 0) -> list[tuple[str, str, str]]:
    """(family, secret, text) for ``n`` secrets of every family."""
    rng = random.Random(seed)
    out = []
    for family, (make, sentence) in FAMILIES.items():
        for _ in range(n):
            secret = make(rng)
            out.append((family, secret, sentence.format(secret)))
    return out


def leaked(secret: str, family: str, stored: str) -> bool:
    """Whether the stored text still holds the secret (for URL credentials: its password)."""
    needle = secret.split(":", 1)[1] if family == "url-credentials" else secret
    if family == "pem-private-key":
        needle = secret.splitlines()[1]
    if family == "putty-private-key":
        needle = secret.split("Private-Lines: 1\n", 1)[1].split("\n", 1)[0]
    return needle in stored


def rule_examples(per_rule: int = 10) -> list[tuple[str, str]]:
    """(rule id, example) for every rule of the vendored gitleaks set: strings its regular
    expression generates (hypothesis, derandomized: the same every run), kept when the rule
    itself reports them (the secret passes the rule's entropy floor and allowlists)."""
    from context_ceiling.sidecar.capture.secret_rules import default_rules

    rules = default_rules()
    out: list[tuple[str, str]] = []
    for rule in rules.rules:
        out += [(rule.id, text) for text in _examples(rules, rule, per_rule)]
    return out


def _examples(rules: Any, rule: Any, per_rule: int) -> list[str]:
    import warnings

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    got: list[str] = []

    @settings(
        max_examples=per_rule * 5,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(st.from_regex(rule.regex, fullmatch=True))
    def collect(text: str) -> None:
        if len(got) < per_rule and any(rid == rule.id for rid, _ in rules.find(text)):
            got.append(text)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return got


#: detect-secrets detectors whose finding is no credential to redact: a public IP address, and
#: a private key's header line (the key's body is what is redacted: the corpus' PEM families)
SCANNER_SKIPS = ("Public IP (ipv4)", "Private Key")


def scanner_examples(per_pattern: int = 8) -> list[tuple[str, str, str]]:
    """(secret type, text, secret) from the installed detect-secrets package, not from our
    vendored copy of it: strings each regex detector's own expressions generate (hypothesis,
    derandomized), kept when that detector reports them with a secret of 3 bits of entropy or
    more (below that, a generated string is a run of one character, no key). An oracle
    independent of the rules the redaction applies; empty when detect-secrets is absent."""
    import importlib
    import inspect
    import pkgutil

    try:
        import detect_secrets.plugins as plugins
        from detect_secrets.plugins.base import RegexBasedDetector
    except ImportError:
        return []
    out: list[tuple[str, str, str]] = []
    for info in pkgutil.iter_modules(plugins.__path__):
        module = importlib.import_module(f"detect_secrets.plugins.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                not issubclass(cls, RegexBasedDetector)
                or inspect.isabstract(cls)
                or cls.__module__ != module.__name__
            ):
                continue
            detector = cls()
            if detector.secret_type in SCANNER_SKIPS:
                continue
            for pattern in detector.denylist:
                out += _scanner_pattern(detector, pattern, per_pattern)
    return out


def _scanner_pattern(detector: Any, pattern: Any, per_pattern: int) -> list[tuple[str, str, str]]:
    import warnings

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from context_ceiling.sidecar.capture.secret_rules import entropy

    got: list[tuple[str, str, str]] = []

    @settings(
        max_examples=per_pattern * 25,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(st.from_regex(pattern, fullmatch=True, alphabet=st.characters(codec="ascii")))
    def collect(text: str) -> None:
        if len(got) >= per_pattern:
            return
        for found in detector.analyze_line(filename="c.py", line=text, line_number=1):
            value = found.secret_value or ""
            if entropy(value) >= 3.0:
                got.append((detector.secret_type, text, value))
                return

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return got
