"""The documentation stays true: the README is a front page, the docs site builds strictly, every
config, ceilings document and Python example in README and docs works as written, the generated
references are current, the changelog names the package's version, the licence ships, and no
page, comment or benchmark file narrates how the project was built."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from context_ceiling.ceilings.document import parse_document
from context_ceiling.sidecar.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _blocks(lang: str) -> list[tuple[Path, str]]:
    out = []
    for path in DOC_FILES:
        text = path.read_text()
        out += [(path, m.group(1)) for m in re.finditer(rf"```{lang}\n(.*?)```", text, re.S)]
    return out


BLOB = "https://github.com/context-ceiling/context-ceiling/blob/main/"
RAW = "https://raw.githubusercontent.com/context-ceiling/context-ceiling/main/"


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12_800, "the README is a front page: move detail into docs/"
    first_block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands[:2] == ["make demo", "make test"]
    for needed in ("git clone ", "pip install '.[sweep]'", "## Quick start", "base_url", "models:"):
        assert needed in readme
    # a package index shows the README away from the repository: every link into it is absolute
    assert re.findall(r"\]\(((?!http|#)[^)]+)", readme) == [], "a relative link in the README"
    for prefix in (BLOB, RAW):
        for link in re.findall(re.escape(prefix) + r"([^)#]+)", readme):
            assert (ROOT / link).exists(), f"README links to a missing file: {link}"


@pytest.mark.e2e
def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a missing anchor, a page left out of the nav or a
    snippet that names no file fails the build."""
    mkdocs = shutil.which("mkdocs") or str(ROOT / ".venv/bin/mkdocs")
    r = subprocess.run(
        [mkdocs, "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "NO_MKDOCS_2_WARNING": "1",
            "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        },
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "input_budget" in api and "Fit an OpenAI chat" in api  # rendered from the docstrings


def test_every_sidecar_config_in_the_docs_loads(tmp_path: Path) -> None:
    """Every YAML block whose keys are sidecar settings is a config the sidecar accepts as
    written (a fragment, such as one ``enforcement:`` section, on top of one upstream); every
    ceilings document parses."""
    fields = set(Settings.model_fields)
    configs = documents = 0
    for path, block in _blocks("ya?ml"):
        data = yaml.safe_load(block)
        if not isinstance(data, dict):
            continue
        if set(data) <= fields:
            p = tmp_path / "sidecar.yaml"
            base = "" if "upstreams" in data else 'upstreams: {openai: {base_url: "http://x/v1"}}\n'
            p.write_text(base + block)
            load_settings(p)
            configs += 1
        elif {"version", "entries"} <= set(data):
            parse_document(block, str(path))
            documents += 1
    assert configs >= 4 and documents >= 1


@pytest.mark.e2e
def test_the_smallest_config_starts(tmp_path: Path) -> None:
    """The README's quick-start config passes ``ceiling serve --check``."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(# sidecar.yaml\n.*?)```", readme, re.S)
    assert block is not None
    (tmp_path / "sidecar.yaml").write_text(block.group(1))
    r = subprocess.run(
        [sys.executable, "-m", "context_ceiling.cli", "serve", "-c", "sidecar.yaml", "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.startswith("config ok: 1 models"), r.stderr


def test_the_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python blocks of README and docs run as written (SDK clients are built, never
    called: nothing leaves the machine)."""
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GOOGLE_API_KEY", "AZURE_OPENAI_API_KEY"):
        monkeypatch.setenv(var, "sk-test-not-a-key")
    ran = 0
    for path in [ROOT / "README.md", ROOT / "docs" / "reference" / "api.md"]:
        for m in re.finditer(r"```python\n(.*?)```", path.read_text(), re.S):
            exec(compile(m.group(1), str(path), "exec"), {})
            ran += 1
    assert ran >= 2


@pytest.mark.parametrize(
    "module", ["devtools.cli_docs", "devtools.config_docs", "devtools.http_api_docs"]
)
def test_generated_references_are_current(module: str) -> None:
    import importlib

    gen = importlib.import_module(module)
    assert gen.PAGE.read_text() == gen.render(), f"stale: run python -m {module}"


def test_the_config_reference_covers_every_setting() -> None:
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    for name in Settings.model_fields:
        assert f"| `{name}` |" in page
    for key in ("counting.bpe", "limits.max_header_bytes", "models[].window", "enforcement.mode"):
        assert f"| `{key}` |" in page


def _version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'^version = "([^"]+)"', text, re.M)
    assert found is not None
    return found.group(1)


def test_the_changelog_names_the_packages_version() -> None:
    log = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in log
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", log, re.M)
    assert versions, "CHANGELOG.md: no released version heading (## [X.Y.Z] - YYYY-MM-DD)"
    assert versions[0] == _version(), "CHANGELOG.md's latest version must equal pyproject's"
    import context_ceiling

    assert context_ceiling.__version__ == _version()


@pytest.mark.e2e
def test_the_licence_ships_in_wheel_and_sdist(tmp_path: Path) -> None:
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    code = (
        "import setuptools.build_meta as b, sys; d = sys.argv[1]; "  # setuptools rewrites argv
        "w = b.build_wheel(d); s = b.build_sdist(d); print('BUILT', w, s)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    built = [line for line in r.stdout.splitlines() if line.startswith("BUILT ")]
    assert built, r.stdout[-2000:]
    wheel_name, sdist_name = built[-1].split()[1:]
    with zipfile.ZipFile(tmp_path / wheel_name) as whl:
        names = whl.namelist()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names[-10:]
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(meta).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Project-URL: Documentation" in metadata and "Classifier: Typing :: Typed" in metadata
    with tarfile.open(tmp_path / sdist_name) as sdist:
        assert any(n.endswith("/LICENSE") for n in sdist.getnames())


#: words that mark narration of how the project was built (by whom, in which round of work)
NARRATION = re.compile(
    r"\bsessions? \d+|\bsession-\d+|\bround of work|\brounds of work|\bthis round\b|"
    r"\btried before and\b|\breverted\b|\bfor a later pass\b|\bnoticed on the way\b|"
    r"\bthe first release\b|\bperformance pass|\bthe performance issue\b|\bthe issue's\b",
    re.I,
)


def _product_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "Makefile", ROOT / "Dockerfile"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    for folder, patterns in (
        ("src", ("*.py",)),
        ("benchmarks", ("*.py", "*.md")),
        ("devtools", ("*.py",)),
        ("testkit", ("*.py",)),
        ("dashboards", ("*.py", "*.md")),
        ("helm", ("*.yaml", "*.tpl", "*.md", "*.txt")),
        ("scripts", ("*.py", "*.sh")),
    ):
        for pattern in patterns:
            files += sorted((ROOT / folder).rglob(pattern))
    return files


def test_no_page_or_comment_narrates_how_the_product_was_built() -> None:
    found = []
    for path in _product_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if NARRATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "narration in the product:\n" + "\n".join(found)
    runs = [p.name for p in (ROOT / "benchmarks" / "runs").glob("*.md")]
    assert runs and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}-[0-9a-f]{7,40}\.md", n) for n in runs)


def test_the_narration_check_can_fail() -> None:
    assert NARRATION.search("measured in session 11, before the aiohttp transport")
    assert NARRATION.search("Tried before and reverted: a regex")
    assert not NARRATION.search("every process is started in its own session")
