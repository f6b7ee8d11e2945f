"""The image, built and run: the repository's Dockerfile built with buildah (no daemon) on a Debian
base made with mmdebstrap (no registry: ``scripts/image.sh``), then run as deployed, non-root
with a read-only root filesystem and a writable /tmp only: health, one proxied request with the
official SDK, metrics; the sidecar image carries no sweep or Hugging Face dependencies.

buildah cannot run a container with a read-only root (``podman run`` cannot set rlimits in this
sandbox), so the run is what a runtime does, by hand: the image's filesystem mounted read-only in
a private mount namespace, tmpfs on /tmp, the config bind-mounted read-only where the chart
mounts it, and ``chroot --userspec`` to the image's user. ``buildah run`` checks the image's own
user and entrypoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from context_ceiling import __version__
from testkit import REPO
from testkit.doubles.hosted_provider import HostedProviderDouble
from testkit.serving import free_port, serve, wait_healthy

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(
        not (shutil.which("buildah") and shutil.which("mmdebstrap") and shutil.which("unshare")),
        reason="needs buildah and mmdebstrap (Debian packages; `make tools` installs them)",
    ),
]

IMAGE = "localhost/context-ceiling:test"
BUILDAH = ["buildah", "--storage-driver", "vfs"]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=900)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def container() -> Iterator[tuple[str, Path, dict[str, str]]]:
    """(container id, its filesystem mounted on the host, the image's environment)."""
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "image.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "IMAGE": IMAGE, "PYTHON": sys.executable},
    )
    assert r.returncode == 0 and r.stdout.strip() == IMAGE, r.stderr
    ctr = _run(*BUILDAH, "from", "--pull=never", IMAGE).stdout.strip()
    try:
        rootfs = Path(_run(*BUILDAH, "mount", ctr).stdout.strip())
        config = json.loads(_run(*BUILDAH, "inspect", "--type", "image", IMAGE).stdout)
        env = dict(e.split("=", 1) for e in config["OCIv1"]["config"]["Env"])
        yield ctr, rootfs, env
    finally:
        _run(*BUILDAH, "umount", ctr, check=False)
        _run(*BUILDAH, "rm", ctr, check=False)


def test_image_user_entrypoint_and_contents(container: tuple[str, Path, dict[str, str]]) -> None:
    ctr, rootfs, _ = container
    config = json.loads(_run(*BUILDAH, "inspect", "--type", "image", IMAGE).stdout)["OCIv1"]
    assert config["config"]["User"] == "10001:10001"  # numeric: runAsNonRoot can verify it
    assert config["config"]["Entrypoint"] == ["ceiling"]
    r = _run(*BUILDAH, "run", "--isolation", "chroot", ctr, "--", "ceiling", "--version")
    assert r.stdout.strip() == f"ceiling {__version__}"
    r = _run(*BUILDAH, "run", "--isolation", "chroot", ctr, "--", "id", "-u")
    assert r.stdout.strip() == "10001"
    # the sidecar image carries only the sidecar: no sweep or Hugging Face dependencies
    site = next((rootfs / "opt" / "ceiling" / "lib").glob("python3*/site-packages"))
    present = {p.name.lower() for p in site.iterdir()}
    for absent in ("matplotlib", "numpy", "rich", "tokenizers"):
        assert absent not in present, absent
    assert "tiktoken" in present and "uvicorn" in present
    # what the answer signals and the context's price need
    assert "jsonschema" in present and "genai_prices" in present
    # and says so in one line when asked for the sweep
    r = _run(
        *BUILDAH,
        "run",
        "--isolation",
        "chroot",
        ctr,
        "--",
        "ceiling",
        "sweep",
        "report",
        "x",
        check=False,
    )
    assert r.returncode == 2 and "context-ceiling[sweep]" in r.stderr, r.stderr


def test_serves_non_root_on_a_read_only_root(
    container: tuple[str, Path, dict[str, str]], tmp_path: Path
) -> None:
    _, rootfs, env = container
    double = HostedProviderDouble()
    with serve(double.app()) as durl:
        port = free_port()
        cfg = tmp_path / "config"
        cfg.mkdir()
        (cfg / "sidecar.yaml").write_text(
            yaml.safe_dump(
                {
                    "listen": {"host": "127.0.0.1", "port": port},
                    "upstreams": {"openai": {"base_url": durl + "/v1"}},
                    "models": [{"match": "gpt-4o", "window": 128000}],
                    "enforcement": {"mode": "observe"},
                }
            )
        )
        cfg.chmod(0o755)
        (cfg / "sidecar.yaml").chmod(0o644)
        script = f"""
set -e
R={rootfs}
mount --bind "$R" "$R"
mount -o remount,ro,bind "$R"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount --bind {cfg} "$R/etc/context-ceiling/config"
mount -o remount,ro,bind "$R/etc/context-ceiling/config"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
if chroot "$R" touch /probe 2>/dev/null; then echo "root filesystem is writable" >&2; exit 9; fi
exec env -i {" ".join(f"{k}={v}" for k, v in env.items())} \\
  chroot --userspec=10001:10001 "$R" ceiling serve --config /etc/context-ceiling/config/sidecar.yaml
"""
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, timeout=60)
            assert httpx.get(url + "/readyz").status_code == 200
            client = openai.OpenAI(base_url=url + "/v1", api_key="sk-image-test", max_retries=0)
            out = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
            )
            assert out.choices[0].message.content
            metrics = httpx.get(url + "/metrics").text
            assert (
                'llm_context_requests_total{api="openai_chat",model="gpt-4o",outcome="ok",workload="default"} 1.0'
                in metrics
            )
            assert "process_resident_memory_bytes" in metrics
            # the serving process runs as the image's user, not root
            pids = _run("pgrep", "-f", "ceiling serve --config /etc/context-ceiling").stdout.split()
            uids = {
                line.split()[1]
                for pid in pids
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("Uid:")
            }
            assert uids == {"10001"}, uids
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out_text, err_text = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out_text, err_text = proc.communicate()
        assert "root filesystem is writable" not in err_text
        # its log: one JSON format, the startup line first among its own
        lines = [json.loads(x) for x in out_text.splitlines() if x.strip()]
        started = [x for x in lines if x["message"] == "sidecar started"]
        assert started, out_text + err_text
        assert started[0]["bpe"] == "riptoken"  # the image always has the fast extra
