"""Build the sandbox image: `rollstream sandbox build [--offline]`.

Consumes: a Debian mirror (offline build) or a registry (Docker build); produces a local image
tag (default ``rollstream-sandbox:latest``) holding Debian bookworm with the full ``python3``
(stdlib included: ``json``, ``ctypes``, ...), Debian's ``python3-pytest`` (the judge runs pytest
files with it: label ``rollstream.sandbox.pytest``) and an empty ``/work`` mount point.

* ``offline=True``: ``debootstrap --variant=minbase --include=python3,python3-pytest bookworm`` into a
  temporary directory, trim docs/caches, then ``docker import`` the tree. Needs root and a
  Debian mirror (or proxy), but no container registry: this is what CI and air-gapped hosts use.
* ``offline=False``: ``docker build`` of ``compose/sandbox/Dockerfile`` (pulls ``debian:bookworm-slim``).

``languages`` (``rollstream sandbox build --languages c,cpp,...``; :func:`build_plan`) adds Debian's
compilers of those languages (:data:`LANGUAGES`) to the same tree, on the debootstrap path only
(there is no Dockerfile for it): a second image, tagged by :func:`image_tag`
(``rollstream-sandbox-polyglot:latest`` for all six, ``rollstream-sandbox-c-cpp:latest`` for a
subset), with today's hardening (user 65534, ``/work``, no runner) and the compilers' versions as
labels (``rollstream.sandbox.languages``, ``rollstream.sandbox.compiler.<language>``, asked of
each compiler in the built tree). The Python image (no languages, the default) is built exactly as
before.

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
from dataclasses import dataclass
from pathlib import Path

from rollstream.errors import ConfigError, SandboxError

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


LANGUAGES_LABEL = "rollstream.sandbox.languages"
"""The languages an image runs, comma-separated, ``python`` first (a language image only)."""
COMPILER_LABEL = "rollstream.sandbox.compiler."
"""``COMPILER_LABEL + language``: the first line its compiler (interpreter) printed for its version."""
PYTHON = "python"
IMAGE_REPOSITORY = DEFAULT_TAG.split(":")[0]
POLYGLOT_TAG = f"{IMAGE_REPOSITORY}-polyglot:latest"


@dataclass(frozen=True)
class Language:
    """What a language adds to the sandbox image: Debian's packages and how to ask its version."""

    name: str
    packages: tuple[str, ...]
    version: tuple[str, ...]  # run in the built tree; the first line it prints is the label's value


# The languages an image can carry besides Python, in canonical order (tags, labels, the docs).
LANGUAGES: dict[str, Language] = {
    lang.name: lang for lang in (
        Language("c", ("gcc", "libc6-dev"), ("gcc", "--version")),
        Language("cpp", ("g++",), ("g++", "--version")),  # g++ 12: -std=c++17 (and 20)
        Language("java", ("openjdk-17-jdk-headless",), ("javac", "-version")),
        Language("javascript", ("nodejs",), ("node", "--version")),
        Language("go", ("golang-go",), ("go", "version")),
        Language("rust", ("rustc",), ("rustc", "--version")),
    )
}
_PYTHON_VERSION = ("python3", "--version")
# Removed from a language image's tree besides _TRIM: what no compile or run reads (jlink's modules,
# Go's own test suite and its packages' test data).
_LANGUAGE_TRIM = ("usr/lib/jvm/java-17-openjdk-amd64/jmods", "usr/share/go-1.19/test")
_LANGUAGE_TRIM_DIRS = ("usr/share/go-1.19/src", "testdata")  # under the first, every directory named so


@dataclass(frozen=True)
class BuildPlan:
    """What one ``rollstream sandbox build`` makes: the tag, the packages, how to label it."""

    languages: tuple[str, ...]  # besides Python, canonical order; () is today's Python image
    tag: str
    packages: tuple[str, ...]
    versions: dict[str, tuple[str, ...]]  # language -> the command whose first line is its label

    def changes(self, versions: dict[str, str]) -> tuple[str, ...]:
        """The ``docker import --change`` settings, given each language's version line."""
        if not self.languages:
            return _IMAGE_CHANGES
        labels = [f"LABEL {LANGUAGES_LABEL}={','.join((PYTHON, *self.languages))}"]
        labels += [f"LABEL {COMPILER_LABEL}{name}={_quoted(versions[name])}" for name in self.versions]
        return (*_IMAGE_CHANGES[:-1], *labels, _IMAGE_CHANGES[-1])


def parse_languages(text: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``"c,cpp"`` (or a list) as the languages besides Python, in canonical order, once each.

    ``python`` may be named (it is always there); an unknown name is a ConfigError listing the
    known ones."""
    names = text.split(",") if isinstance(text, str) else list(text or ())
    chosen = set()
    for raw in names:
        name = raw.strip().lower()
        if not name or name == PYTHON:
            continue
        if name not in LANGUAGES:
            raise ConfigError(f"unknown language {raw.strip()!r} for the sandbox image; known: "
                              + ", ".join((PYTHON, *LANGUAGES)))
        chosen.add(name)
    return tuple(name for name in LANGUAGES if name in chosen)


def image_tag(languages: tuple[str, ...]) -> str:
    """The tag a language set is built as unless ``--tag`` says otherwise: ``rollstream-sandbox:latest``
    for Python alone, ``rollstream-sandbox-polyglot:latest`` for every language, else the languages
    joined in canonical order (``rollstream-sandbox-c-cpp:latest``)."""
    if not languages:
        return DEFAULT_TAG
    if set(languages) == set(LANGUAGES):
        return POLYGLOT_TAG
    return f"{IMAGE_REPOSITORY}-{'-'.join(parse_languages(languages))}:latest"


def build_plan(languages: str | list[str] | tuple[str, ...] | None = None, tag: str | None = None) -> BuildPlan:
    """The plan for an image with ``languages`` besides Python (None: today's Python image)."""
    chosen = parse_languages(languages)
    packages = list(SANDBOX_PACKAGES)
    for name in chosen:
        packages += [p for p in LANGUAGES[name].packages if p not in packages]
    versions = {PYTHON: _PYTHON_VERSION, **{name: LANGUAGES[name].version for name in chosen}} if chosen else {}
    return BuildPlan(chosen, tag or image_tag(chosen), tuple(packages), versions)


def _quoted(value: str) -> str:
    """A label value as a Dockerfile string (the compilers' version lines have spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


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


def build_image(offline: bool, tag: str | None = None, *, mirror: str = DEFAULT_MIRROR,
                languages: str | list[str] | tuple[str, ...] | None = None) -> str:
    """Build the sandbox image and return its id. Raises SandboxError naming the failed step.

    With ``languages`` (besides Python) the image is always built offline (debootstrap + docker
    import), tagged ``tag`` or :func:`image_tag`'s name for the set (never the Python image's unless
    ``tag`` says so); without, ``tag`` or ``DEFAULT_TAG``."""
    plan = build_plan(languages, tag)
    if plan.languages:
        return _build_languages(plan, mirror)
    if offline:
        return _build_offline(plan.tag, mirror)
    return _build_dockerfile(plan.tag)


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


def _build_languages(plan: BuildPlan, mirror: str) -> str:
    with _debootstrap(plan.packages, mirror, "the language sandbox build") as root:
        (root / "work").mkdir(mode=0o755, exist_ok=True)
        os.chown(root / "work", SANDBOX_UID, SANDBOX_UID)
        for rel in _LANGUAGE_TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        under, name = _LANGUAGE_TRIM_DIRS
        for found in sorted((root / under).rglob(name)) if (root / under).is_dir() else ():
            shutil.rmtree(found, ignore_errors=True)
        _run(["chroot", str(root), "python3", "-c", "import json, ctypes, sys, pytest"], "python check")
        with _proc_mounted(root):  # the JDK's launchers find their libraries through /proc/self/exe
            versions = {name: _version(root, name, command) for name, command in plan.versions.items()}
        log.info("sandbox image %s: %s", plan.tag, versions)
        return _import(root, plan.tag, plan.changes(versions))


@contextmanager
def _proc_mounted(root: Path) -> Iterator[None]:
    _run(["mount", "-t", "proc", "proc", str(root / "proc")], "mount /proc in the tree")
    try:
        yield
    finally:
        _run(["umount", str(root / "proc")], "umount /proc in the tree")


def _version(root: Path, name: str, command: tuple[str, ...]) -> str:
    """The first line ``command`` prints (stdout, else stderr) run in the tree at ``root``."""
    done = _run(["chroot", str(root), *command], f"{name} version check")
    lines = (done.stdout or done.stderr).decode(errors="replace").strip().splitlines()
    if not lines:
        raise SandboxError(f"{name} version check: {' '.join(command)} printed nothing")
    return lines[0].strip()[:200]


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
