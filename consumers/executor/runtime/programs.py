"""Programs in the languages besides Python: built once per job, run once per ``run_program(stdin)``.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's bundle,
runtime/importer.py). The candidate (runtime/candidate.py) calls :func:`build` with the completion's
program before anything else of the job runs in its process: the compiler runs as the candidate's
uid, in a process group of its own, with the candidate's limits (address space, file size) and a
wall-clock bound of its own (``compile_timeout_s``), with no descriptor but its output's and no
network (the container has none). Its output is read back capped, and what reaches the verdict is
its first lines, scrubbed of the build directory's path (:func:`scrub`): the compiler's errors, as
the observation the next turn can fix. :func:`run_built` runs what was built with ``stdin`` on a
real descriptor 0 and its descriptor 1 captured, as :func:`candidate.run_program_here` runs a
Python program.

Each language is a :class:`Toolchain`: where the source goes, how it is compiled, how it runs. Java's
source file is named after its public class and it runs the class that declares ``main``; a Go
program without a package clause gets ``package main``; Rust is edition 2021. The JVM's flags keep
its reservations (heap, class space, code cache) inside an address-space limit of 768 MiB.
"""

import os
import re
import signal
import sys
import time

PYTHON = "python"
ADDRESS_SPACE_MB = 1024  # the least address space of a job in another language (the JVM's reservations fit)
BUILD_DIR = "/work/.build"  # under /work, which PID 1 wipes after every job
# The type of the job's ``syntax`` message when its program did not build, and when its compiler
# could not be run at all (the machinery's: outcome infra, consumers/executor/rewards.py)
COMPILE_ERROR = "CompileError"
COMPILER_UNAVAILABLE = "CompilerUnavailable"
MESSAGE_LINES = 30  # of the compiler's output, at most, in the verdict
MESSAGE_CHARS = 2000
OUTPUT_CAP = 256 << 10  # what is read back of the compiler's output
_JVM = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:CompressedClassSpaceSize=64m",
        "-XX:ReservedCodeCacheSize=48m", "-XX:MaxMetaspaceSize=128m", "-Xshare:auto")
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work", "TMPDIR": "/work",
    "NO_COLOR": "1", "TERM": "dumb",
    # glibc's malloc reserves 64 MiB of address space per thread's arena: rustc's and the JVM's threads
    # would spend the job's address-space limit on reservations (rustc -O ran out of memory at 1 GiB)
    "MALLOC_ARENA_MAX": "2",
    # Go: no module, no cgo (no C compiler behind a Go build), its caches in the build directory
    "GO111MODULE": "off", "CGO_ENABLED": "0", "GOCACHE": BUILD_DIR + "/.gocache", "GOPATH": BUILD_DIR + "/go",
    "GOTELEMETRY": "off", "GOFLAGS": "-buildvcs=false",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_JAVA_PUBLIC = re.compile(r"\bpublic\s+(?:(?:final|abstract|strictfp|sealed)\s+)*(?:class|record|enum|interface)\s+"
                          r"([A-Za-z_$][\w$]*)")
_JAVA_CLASS = re.compile(r"\b(?:class|record|enum|interface)\s+([A-Za-z_$][\w$]*)")
_JAVA_MAIN = re.compile(r"\bstatic\s+(?:public\s+|final\s+)*void\s+main\s*\(|\bpublic\s+static\s+void\s+main\s*\(")
_JAVA_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"", re.S)
_GO_PACKAGE = re.compile(r"^\s*package\s+\w+", re.M)


class CompileFailed(Exception):
    """The program did not build: its compiler's first errors (scrubbed), or why it was stopped."""


class Toolchain:
    """How one language's program is built and run: :meth:`plan` gives the sources to write (name ->
    text), the compiler's argv and the program's argv, all in the build directory; ``{source}`` and
    ``{main}`` in an argv are the plan's names (:meth:`names`, worked out once per program)."""

    def __init__(self, source, compile_argv, run_argv):
        self.source, self.compile_argv, self.run_argv = source, compile_argv, run_argv

    def plan(self, code):
        names = self.names(code)
        return ({names["source"]: self.text(code)}, [part.format(**names) for part in self.compile_argv],
                [part.format(**names) for part in self.run_argv])

    def names(self, code):
        return {"source": self.source}

    def text(self, code):
        return code


class JavaToolchain(Toolchain):
    """Java: the file named after the public class (javac's rule), the class declaring ``main`` run."""

    def names(self, code):
        public, main = java_classes(code)
        return {"source": f"{public or main}.java", "main": main}


class GoToolchain(Toolchain):
    """Go: a program without a package clause is ``package main``."""

    def text(self, code):
        return code if _GO_PACKAGE.search(code) else "package main\n\n" + code


def java_classes(code):
    """(the public top-level type's name or "", the name of the class that declares ``main``,
    "Main" when none can be told), read from the source without comments and strings."""
    text = _JAVA_COMMENTS.sub(lambda m: " " * len(m.group()), code)
    public = _JAVA_PUBLIC.search(text)
    main = "Main"
    at = _JAVA_MAIN.search(text)
    if at is not None:
        declared = [m for m in _JAVA_CLASS.finditer(text, 0, at.start())]
        if declared:
            main = declared[-1].group(1)
    elif public is not None:
        main = public.group(1)
    return (public.group(1) if public else ""), main


TOOLCHAINS = {
    "c": Toolchain("main.c", ("gcc", "-std=gnu17", "-O2", "-pipe", "-fdiagnostics-color=never", "-o", "main",
                              "main.c", "-lm"), ("./main",)),
    "cpp": Toolchain("main.cpp", ("g++", "-std=gnu++17", "-O2", "-pipe", "-fdiagnostics-color=never", "-o", "main",
                                  "main.cpp"), ("./main",)),
    "java": JavaToolchain("", ("javac", *(f"-J{flag}" for flag in _JVM), "-encoding", "UTF-8", "-d", ".",
                               "{source}"), ("java", *_JVM, "-cp", ".", "{main}")),
    "javascript": Toolchain("main.js", ("node", "--check", "main.js"), ("node", "main.js")),
    "go": GoToolchain("main.go", ("go", "build", "-o", "main", "main.go"), ("./main",)),
    "rust": Toolchain("main.rs", ("rustc", "--edition", "2021", "-O", "--color", "never", "-o", "main", "main.rs"),
                      ("./main",)),
}


class Built:
    """A program built: its argv and directory."""

    def __init__(self, argv, cwd):
        self.argv, self.cwd = argv, cwd


def build(language, code, timeout_s):
    """Write the program and compile it; the :class:`Built` program, or :class:`CompileFailed`
    (its message the compiler's first errors). OSError: the machinery could not run the compiler."""
    files, argv, run_argv = TOOLCHAINS[language].plan(code)
    os.makedirs(BUILD_DIR, mode=0o700, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(BUILD_DIR, name), "w", encoding="utf-8", errors="surrogateescape") as out:
            out.write(text)
    status, output = run_bounded(argv, BUILD_DIR, timeout_s)
    if status is None:
        raise CompileFailed(f"the compiler ran past {timeout_s:g} s" + (f"\n{scrub(output)}" if output else ""))
    if status != 0:
        raise CompileFailed(scrub(output) or f"the compiler exited with status {status}")
    return Built(run_argv, BUILD_DIR)


def run_bounded(argv, cwd, timeout_s):
    """Run ``argv`` in ``cwd`` with /dev/null as input, its output (both streams) in an in-memory
    file, in a process group of its own; (exit status, or None past ``timeout_s``; its output)."""
    sink = os.memfd_create("compiler")
    try:
        pid = os.fork()
        if pid == 0:
            _exec_child(argv, cwd, os.open(os.devnull, os.O_RDONLY), sink, sink)
        deadline = time.monotonic() + timeout_s
        status, pause = None, 0.002
        while True:
            done, wait = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(wait)
                break
            if time.monotonic() >= deadline:
                _kill_group(pid)
                os.waitpid(pid, 0)
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        _kill_group(pid)  # what it left behind (a compiler's helpers) goes with it
        size = min(os.fstat(sink).st_size, OUTPUT_CAP)
        output = os.pread(sink, size, 0).decode("utf-8", "replace")
    finally:
        os.close(sink)
    return status, output


def run_built(built, stdin, out_cap):
    """Run a built program with ``stdin`` on descriptor 0; (stdout text, exit status), as
    candidate.run_program_here gives for a Python program. OSError past ``out_cap`` bytes."""
    return run_forked(lambda source, sink: _exec_child(built.argv, built.cwd, source, sink, 2), stdin, out_cap,
                      group=True)


def run_forked(child, stdin, out_cap, group=False):
    """Fork ``child(stdin_fd, stdout_fd)`` (it never returns) with ``stdin`` in an in-memory file
    and its standard output captured in another; (stdout text, exit status); OSError past
    ``out_cap`` bytes. ``group``: the child leads a process group, ended with it."""
    data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
    source = os.memfd_create("stdin")
    sink = os.memfd_create("stdout")
    try:
        os.write(source, data)
        os.lseek(source, 0, os.SEEK_SET)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        pid = os.fork()
        if pid == 0:
            child(source, sink)  # never returns
        _, wait = os.waitpid(pid, 0)
        status = os.waitstatus_to_exitcode(wait)
        if group:
            _kill_group(pid)  # what the program left running goes with it
        size = os.fstat(sink).st_size
        if size > out_cap:
            raise OSError(f"the program printed {size} bytes (at most {out_cap})")
        output = os.pread(sink, size, 0)
    finally:
        os.close(source)
        os.close(sink)
    return output.decode("utf-8", "replace"), status


def _exec_child(argv, cwd, stdin, stdout, stderr):
    """In a fresh fork: a process group of its own, the three descriptors and no other, then exec."""
    try:
        os.setpgid(0, 0)
        os.chdir(cwd)
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        if stderr != 2:
            os.dup2(stderr, 2)
        os.closerange(3, 65536)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.execvpe(argv[0], argv, ENV)
    except BaseException as exc:
        try:
            os.write(2, f"cannot run {argv[0]}: {type(exc).__name__}: {exc}\n".encode())
        except BaseException:
            pass
    os._exit(127)


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def scrub(text):
    """The compiler's first lines, as a reader needs them: no colour codes, the build directory's
    path left out, at most MESSAGE_LINES lines and MESSAGE_CHARS characters."""
    text = _ANSI.sub("", text).replace(BUILD_DIR + "/", "").replace(BUILD_DIR, ".")
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    kept = "\n".join(lines[:MESSAGE_LINES])
    if len(lines) > MESSAGE_LINES:
        kept += f"\n[... {len(lines) - MESSAGE_LINES} more lines]"
    return kept[:MESSAGE_CHARS]
