"""The runner's seccomp filter (consumers/executor/runtime/cleanup.py ``seccomp_program``), run
through a small classic-BPF interpreter: which calls it allows, refuses (and with what errno)
and kills, on each architecture it knows. The sandbox tier checks the installed filter itself
(tests/consumers/executor/test_hostile.py)."""

from __future__ import annotations

import struct

import pytest

from rollstream.consumers.executor.runtime.cleanup import (
    CLONE_NAMESPACES,
    ENOSPC,
    ENOSYS,
    EPERM,
    SECCOMP_ARCHES,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    seccomp_program,
)

pytestmark = pytest.mark.unit

X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003


def run(program: list[tuple[int, int, int, int]], arch: int, nr: int, arg0: int = 0) -> int:
    """What the filter returns for one call (struct seccomp_data: nr, arch, ip, args[6])."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # ret k
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("arch", sorted(SECCOMP_ARCHES))
def test_the_filter_refuses_ipc_objects_and_namespaces_and_allows_the_rest(arch: int):
    calls = SECCOMP_ARCHES[arch][1]
    program = seccomp_program(arch, calls)
    assert len(program) < 64
    for nr in calls["ipc"]:
        assert run(program, arch, nr) == SECCOMP_RET_ERRNO | ENOSPC
    for nr in calls["namespaces"]:
        assert run(program, arch, nr) == SECCOMP_RET_ERRNO | EPERM
    assert run(program, arch, calls["clone3"]) == SECCOMP_RET_ERRNO | ENOSYS  # the C library falls back to clone
    fork_flags = 0x01200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD: what fork() passes
    thread_flags = 0x003D0F00  # what pthread_create passes
    assert run(program, arch, calls["clone"], fork_flags) == SECCOMP_RET_ALLOW
    assert run(program, arch, calls["clone"], thread_flags) == SECCOMP_RET_ALLOW
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x20000):  # NEWUSER, NEWPID, NEWNET, NEWNS
        assert flag & CLONE_NAMESPACES
        assert run(program, arch, calls["clone"], fork_flags | flag) == SECCOMP_RET_ERRNO | EPERM
    for nr in (0, 1, 3, 9, 57, 59, 61, 231):  # read, write, close, mmap, fork, execve, wait4, exit_group (x86_64)
        if nr not in (*calls["ipc"], *calls["namespaces"], calls["clone"], calls["clone3"]):
            assert run(program, arch, nr) == SECCOMP_RET_ALLOW
    assert run(program, I386, 117) == SECCOMP_RET_KILL_PROCESS  # i386's ipc(2): another ABI ends the process
    if arch == X86_64:
        assert run(program, arch, 0x40000000 | 29) == SECCOMP_RET_KILL_PROCESS  # x32's shmget
