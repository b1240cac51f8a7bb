"""Build the sandbox image: `rollstream sandbox build [--offline]`.

Consumes: a Debian mirror (offline build) or a registry (Docker build); produces a local image
tag (default ``rollstream-sandbox:latest``) holding Debian bookworm with the full ``python3``
(stdlib included: ``json``, ``ctypes``, ...), Debian's ``python3-pytest`` (the judge runs pytest
files with it: label ``rollstream.sandbox.pytest``) and an empty ``/work`` mount point.

* ``offline=True``: ``debootstrap --variant=minbase --include=python3,python3-pytest bookworm`` into a
  temporary directory, trim docs/caches, then ``docker import`` the tree. Needs root and a
  Debian mirror (or proxy), but no container registry: this is what CI and air-gapped hosts use.
* ``offline=False``: ``docker build`` of ``compose/sandbox/Dockerfile`` (pulls ``debian:bookworm-slim``).

The image carries no runner: the executor passes the runner's source on the command line when it
starts a container, so an image never goes stale when the runner changes.

:func:`build_base_image` makes, on the same debootstrap + ``docker import`` path, the base the compose
images build FROM where no registry is reachable (``BASE_IMAGE``, default ``python:3.11-slim``; see
compose/ and docs/compose.md): Debian bookworm with python3 (3.11), its venv module, apt and the CA
certificates, running as root.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollstream.errors import SandboxError

log = logging.getLogger(__name__)

DEFAULT_TAG = "rollstream-sandbox:latest"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
SANDBOX_UID = 65534  # "nobody" in Debian; the runner and the code it runs use it
DOCKERFILE_DIR = Path(__file__).resolve().parents[1] / "compose" / "sandbox"
SANDBOX_PACKAGES = ("python3", "python3-pytest")
PYTEST_LABEL = "rollstream.sandbox.pytest"
"""An image with pytest for the judge's pytest files (images built before it lack the label)."""

# Removed from the offline tree: not needed to run python, and smaller images start faster.
_TRIM = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "var/log",
)

# Same settings as compose/sandbox/Dockerfile, applied by `docker import --change`.
_IMAGE_CHANGES = (
    f"USER {SANDBOX_UID}:{SANDBOX_UID}",
    "WORKDIR /work",
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "LABEL rollstream.sandbox.image=1",
    f"LABEL {PYTEST_LABEL}=1",
    'CMD ["python3"]',
)


BASE_TAG = "rollstream-base:bookworm"
# What the compose images need from their base: python3 (3.11 in bookworm) with venv (the stage
# image installs into /opt/venv, on python:3.11-slim as here), and CA certificates for pip.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
_BASE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV DEBIAN_FRONTEND=noninteractive",
    "LABEL rollstream.base.image=1",
    'CMD ["python3"]',
)


def build_image(offline: bool, tag: str = DEFAULT_TAG, *, mirror: str = DEFAULT_MIRROR) -> str:
    """Build the sandbox image and return its id. Raises SandboxError naming the failed step."""
    if offline:
        return _build_offline(tag, mirror)
    return _build_dockerfile(tag)


def _run(cmd: list[str], step: str, **kwargs) -> subprocess.CompletedProcess:
    log.info("image build: %s: %s", step, " ".join(cmd[:4]))
    try:
        return subprocess.run(cmd, check=True, capture_output=True, **kwargs)
    except FileNotFoundError as exc:
        raise SandboxError(f"{step}: {cmd[0]} is not installed") from exc
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or b"")[-2000:].decode(errors="replace")
        raise SandboxError(f"{step} failed (exit {exc.returncode}): {tail}") from exc


def build_base_image(tag: str = BASE_TAG, *, offline: bool = True, mirror: str = DEFAULT_MIRROR) -> str:
    """Build the base image of the compose images and return its id.

    ``offline=True``: debootstrap + ``docker import`` (no registry). ``offline=False``: tag the
    registry's ``python:3.11-slim`` as ``tag`` (pulls it). Raises SandboxError naming the failed step.
    """
    if not offline:
        _run(["docker", "pull", "python:3.11-slim"], "docker pull")
        _run(["docker", "tag", "python:3.11-slim", tag], "docker tag")
        done = _run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], "docker image inspect")
        return done.stdout.decode().strip()
    with _debootstrap(BASE_PACKAGES, mirror, "the offline base image build") as root:
        # apt works in images built FROM this one (the lists are trimmed: they run apt-get update).
        (root / "etc/apt/sources.list").write_text(f"deb {mirror} {SUITE} main\n")
        check = _run(
            ["chroot", str(root), "python3", "-c", "import venv, ensurepip, ssl, sys; print(sys.version)"],
            "python check",
        )
        log.info("base image python: %s", check.stdout.decode().strip())
        return _import(root, tag, _BASE_CHANGES)


def _build_offline(tag: str, mirror: str) -> str:
    with _debootstrap(SANDBOX_PACKAGES, mirror, "the offline sandbox build") as root:
        (root / "work").mkdir(mode=0o755, exist_ok=True)
        os.chown(root / "work", SANDBOX_UID, SANDBOX_UID)
        check = _run(
            ["chroot", str(root), "python3", "-c", "import json, ctypes, sys, pytest; print(sys.version, pytest.__version__)"],
            "python check",
        )
        log.info("sandbox image python: %s", check.stdout.decode().strip())
        return _import(root, tag, _IMAGE_CHANGES)


@contextmanager
def _debootstrap(packages: tuple[str, ...], mirror: str, what: str) -> Iterator[Path]:
    """A trimmed Debian ``SUITE`` minbase tree with ``packages``, in a temporary directory."""
    if os.geteuid() != 0:
        raise SandboxError(f"{what} runs debootstrap, which needs root")
    if shutil.which("debootstrap") is None:
        raise SandboxError(f"{what} needs debootstrap (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="rollstream-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(root), mirror],
            "debootstrap",
        )
        for rel in _TRIM:
            target = root / rel
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir(mode=0o755)
        yield root


def _import(root: Path, tag: str, image_changes: tuple[str, ...]) -> str:
    """``docker import`` the tree at ``root`` as ``tag`` with ``image_changes``; returns the image id."""
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    changes = [arg for change in image_changes for arg in ("--change", change)]
    try:
        done = _run(["docker", "import", *changes, "-", tag], "docker import", stdin=tar.stdout)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    if tar.returncode != 0:
        raise SandboxError(f"tar of the rootfs failed (exit {tar.returncode})")
    return done.stdout.decode().strip()


def _build_dockerfile(tag: str) -> str:
    if not (DOCKERFILE_DIR / "Dockerfile").is_file():
        raise SandboxError(
            f"{DOCKERFILE_DIR / 'Dockerfile'} is missing (the Docker build needs a source checkout)"
        )
    _run(["docker", "build", "-t", tag, str(DOCKERFILE_DIR)], "docker build")
    done = _run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], "docker image inspect")
    return done.stdout.decode().strip()
