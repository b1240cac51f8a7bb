"""An episode's files, and the sandbox's writable directory between jobs.

A module of the runtime (its bundle in the sandbox, runtime/importer.py; standard library only). After a turn
that is not the last, the runner collects the regular files the job left in ``/work``, once
every process of the job is gone; before the next turn's code runs, it restores them into the
empty ``/work`` (paths checked: relative, normalised, no ``..``, created here, never through a
link). Between jobs ``/work`` is wiped, permissions the code removed restored first.
"""

import binascii
import os

from rollstream.consumers.executor.runtime.zygotes import JOB_IDS

WORK = "/work"

WORKSPACE_FILES = 256  # an episode's workspace: at most this many files ...
WORKSPACE_DEPTH = 8  # ... this deep ...
WORKSPACE_SCAN = 4096  # ... found among this many entries


def restore_workspace(files, budget):
    """Write an episode's files (``[[relative path, base64]]``, collected after its last turn)
    into the empty ``/work`` before the job is forked. Paths are checked: relative, normalised,
    no ``..``, created here (never through a link). Returns the problem, or None."""
    if not isinstance(files, list) or len(files) > WORKSPACE_FILES:
        return f"workspace: not a list of at most {WORKSPACE_FILES} files"
    for item in files:
        try:
            path, encoded = item
            data = binascii.a2b_base64(encoded)
        except (TypeError, ValueError, binascii.Error):
            return "workspace: bad entry"
        parts = path.split("/") if isinstance(path, str) else []
        if (not parts or len(parts) > WORKSPACE_DEPTH or "\0" in path
                or any(p in ("", ".", "..") or len(p) > 255 for p in parts)):
            return "workspace: bad path"
        budget -= len(data)
        if budget < 0:
            return "workspace: over its size"
        try:
            directory = WORK
            for part in parts[:-1]:
                directory = os.path.join(directory, part)
                try:
                    os.mkdir(directory, 0o700)
                    if os.getuid() == 0:  # a separated runner: the candidate's, as if it made it
                        os.chown(directory, *JOB_IDS, follow_symlinks=False)
                except FileExistsError:
                    if os.path.islink(directory) or not os.path.isdir(directory):
                        return "workspace: bad path"
            fd = os.open(os.path.join(WORK, *parts), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                if os.getuid() == 0:  # a separated runner: the files are the candidate's, as it wrote them
                    os.fchown(fd, *JOB_IDS)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except OSError as exc:
            return f"workspace: {type(exc).__name__}"
    return None


def collect_workspace(budget):
    """The regular files the job left in ``/work`` (``[[relative path, base64]]``), for the next
    turn of its episode, and whether any had to be left out (links, devices, FIFOs are never
    followed or read; past ``budget`` bytes or the file counts, files are left out)."""
    found, truncated, seen = [], False, 0
    stack = [("", WORK, 0)]
    while stack:
        relative, directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            seen += 1
            if seen > WORKSPACE_SCAN:
                return found, True
            name = f"{relative}/{entry.name}" if relative else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 < WORKSPACE_DEPTH:
                        stack.append((name, entry.path, depth + 1))
                    else:
                        truncated = True
                    continue
                if not entry.is_file(follow_symlinks=False):
                    truncated = True  # links, FIFOs, sockets: not carried
                    continue
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                truncated = True
                continue
            try:
                size = os.fstat(fd).st_size
                if len(found) >= WORKSPACE_FILES or size > budget:
                    truncated = True
                    continue
                data = os.read(fd, size + 1)
            except OSError:
                truncated = True
                continue
            finally:
                os.close(fd)
            if len(data) > budget:
                truncated = True
                continue
            budget -= len(data)
            found.append([name, binascii.b2a_base64(data, newline=False).decode()])
    return found, truncated


def wipe(directory):
    """Remove everything under ``directory`` (iteratively: a deep tree must not overflow the
    runner's stack), first restoring permissions the code may have removed."""
    stack, dirs = [directory], []
    while stack:
        path = stack.pop()
        if path != directory:
            dirs.append(path)
            try:
                os.chmod(path, 0o700, follow_symlinks=False)
            except OSError:
                pass
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        try:
                            os.unlink(entry.path)
                        except OSError:
                            pass
        except OSError:
            pass
    for path in reversed(dirs):
        try:
            os.rmdir(path)
        except OSError:
            pass
