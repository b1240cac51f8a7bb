"""``rollstream image base|build``: the images of the compose deployment (compose/, docs/compose.md).

* ``base [--offline]``: the base image every project image builds FROM (``BASE_IMAGE``).
  ``--offline``: debootstrap + ``docker import`` (:func:`rollstream.consumers.executor.image.build_base_image`),
  no registry needed; without it, the registry's ``python:3.11-slim`` tagged as the base.
* ``build [--offline] [--base IMAGE]``: the stage image (``rollstream:latest``) and, for the
  no-registry override (docker-compose.local.yml), ``rollstream-redis:latest`` and
  ``rollstream-prometheus:latest``, all FROM ``--base`` (default: python:3.11-slim, or with
  ``--offline`` the local base, made first when missing). Before the stage build it fills
  ``compose/local/`` (never committed) with what only this host has: the CPU torch wheel the
  host's pip resolves (when the installed torch is a CPU build) and pip's CA bundle (``PIP_CERT``,
  ``SSL_CERT_FILE`` or pip's ``global.cert``), which the Dockerfile uses in its build stages only.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rollstream.consumers.executor.image import BASE_TAG, DEFAULT_MIRROR, build_base_image
from rollstream.errors import SandboxError

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]  # the source checkout (compose/ is not installed)
LOCAL = ROOT / "compose" / "local"
PUBLIC_BASE = "python:3.11-slim"
STAGE_TAG = "rollstream:latest"
REDIS_TAG = "rollstream-redis:latest"
PROMETHEUS_TAG = "rollstream-prometheus:latest"


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False).returncode == 0


def host_cpu_torch_wheel(dest: Path = LOCAL) -> Path | None:
    """The CPU torch wheel of the installed torch version, put into ``dest`` by the host's pip
    (which resolves it from its own sources: a local wheel directory, a mirror, the cache).
    None when the installed torch is not a CPU build: the image then takes torch from the
    PyTorch CPU index, never PyPI's CUDA build."""
    found = sorted(dest.glob("torch-*.whl"))
    if found:
        return found[-1]
    try:
        import torch
    except ImportError:
        return None
    if "+cpu" not in torch.__version__:
        return None
    version = torch.__version__.split("+")[0]
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", f"torch=={version}", "--no-deps",
                           "--only-binary", ":all:", "-d", str(dest)], capture_output=True, text=True,
                          check=False)
    found = sorted(dest.glob("torch-*+cpu-*.whl"))
    if done.returncode != 0 or not found:
        for stray in dest.glob("torch-*.whl"):  # never the CUDA build by accident
            if "+cpu" not in stray.name:
                stray.unlink()
        log.warning("no CPU torch wheel from the host's pip (%s); the image takes torch from the CPU index",
                    (done.stderr or "").strip()[-300:])
        return None
    return found[-1]


def host_pip_cert() -> str | None:
    """The CA bundle the host's pip uses: ``$PIP_CERT``, ``$SSL_CERT_FILE``, else ``cert`` in pip's
    configuration files; None when there is none."""
    for name in ("PIP_CERT", "SSL_CERT_FILE"):  # an entry point's helper: the environment is read here
        if os.environ.get(name):
            return os.environ[name]
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".cert") and value.strip("'\""):
            return value.strip("'\"")
    return None


def stage_pip_cert(cert: str | None, dest: Path = LOCAL) -> Path | None:
    """Copy pip's CA bundle to ``dest/pip-cert.pem`` (only the build stages see it); None: none."""
    target = dest / "pip-cert.pem"
    if not cert or not Path(cert).is_file():
        target.unlink(missing_ok=True)
        return None
    dest.mkdir(parents=True, exist_ok=True)
    if not target.exists() or target.read_bytes() != Path(cert).read_bytes():
        shutil.copyfile(cert, target)
    return target


def docker_build(tag: str, context: Path, base: str, dockerfile: Path | None = None) -> float:
    """``docker build`` (classic builder or BuildKit, whichever the client uses); returns seconds."""
    cmd = ["docker", "build", "--build-arg", f"BASE_IMAGE={base}", "-t", tag]
    if dockerfile is not None:
        cmd += ["-f", str(dockerfile)]
    started = time.monotonic()
    log.info("building %s FROM %s", tag, base)
    done = subprocess.run([*cmd, str(context)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(f"docker build of {tag} failed (exit {done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")
    return time.monotonic() - started


def build_compose_images(*, offline: bool, base: str | None = None, pip_cert: str | None = None,
                         mirror: str = DEFAULT_MIRROR, root: Path = ROOT) -> dict[str, float]:
    """Build every image the compose files of the checkout at ``root`` build; returns the seconds
    each build took (the base only when it was missing and made)."""
    base = base or (BASE_TAG if offline else PUBLIC_BASE)
    compose, local = root / "compose", root / "compose" / "local"
    seconds: dict[str, float] = {}
    if offline and not image_exists(base):
        started = time.monotonic()
        build_base_image(base, offline=True, mirror=mirror)
        seconds[base] = time.monotonic() - started
    wheel = host_cpu_torch_wheel(local)
    log.info("torch for the stage image: %s", wheel.name if wheel else "the PyTorch CPU index")
    stage_pip_cert(pip_cert, local)
    seconds[STAGE_TAG] = docker_build(STAGE_TAG, root, base, compose / "Dockerfile")
    seconds[REDIS_TAG] = docker_build(REDIS_TAG, compose / "redis", base)
    seconds[PROMETHEUS_TAG] = docker_build(PROMETHEUS_TAG, compose / "prometheus", base)
    return seconds


def register(name: str, parser: argparse.ArgumentParser) -> Any:
    add_arguments(parser)
    return lambda args, config: image_main(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["base", "build"],
                        help="base: the base image; build: the stage, redis and prometheus images")
    parser.add_argument("--offline", action="store_true",
                        help="no registry: debootstrap + docker import for the base (root, a Debian mirror)")
    parser.add_argument("--tag", default=BASE_TAG, help=f"base: the tag to make (default {BASE_TAG})")
    parser.add_argument("--base", default=None,
                        help=f"build: BASE_IMAGE (default {PUBLIC_BASE}; with --offline {BASE_TAG})")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror for debootstrap")


def image_main(args: argparse.Namespace) -> int:
    if args.action == "base":
        started = time.monotonic()
        image_id = build_base_image(args.tag, offline=args.offline, mirror=args.mirror)
        print(f"built base image {args.tag} ({image_id[:19]}) in {time.monotonic() - started:.0f} s")
        return 0
    seconds = build_compose_images(offline=args.offline, base=args.base, pip_cert=host_pip_cert(),
                                   mirror=args.mirror)
    for tag, took in seconds.items():
        print(f"built {tag} in {took:.0f} s")
    return 0
