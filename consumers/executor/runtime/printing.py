"""What the candidate prints: the completion's prints captured while it serves, and its
exceptions printed as the interpreter would.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). Once the candidate serves
(runtime/candidate.py), ``sys.stdout`` and ``sys.stderr`` are :data:`CAPTURED_OUT` and
:data:`CAPTURED_ERR`: what a request prints travels with its reply, within :data:`PRINT_CAP`,
and the judge prints it where the tests' own prints go. :func:`print_exception` prints a
traceback without the runtime's own frames, for the completion's errors (here, in a program run
by ``run_program``, in the in-process trust and in PID 1's warm-up).
"""

import sys

from rollstream.consumers.executor.runtime.codec import clip_text

# What one call may print: it travels with the reply, within the frame's bytes, and the judge prints it where the
# tests' own prints go (their redirect_stdout, or the job's output, which the supervisor caps), so the job's
# output cap is not this one's: a call printing 150 KB into the tests' StringIO is honest.
PRINT_CAP = 8 << 20


class PrintCapture:
    """``sys.stdout``/``sys.stderr`` while the candidate serves: what a call prints travels with
    its reply and is printed by the judge, where the tests' ``redirect_stdout`` sees it."""

    def __init__(self):
        self.parts, self.size = [], 0

    def write(self, text):
        text = str(text)
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def drain(self):
        text = "".join(self.parts)
        self.parts.clear()
        self.size = 0
        return text


CAPTURED_OUT, CAPTURED_ERR = PrintCapture(), PrintCapture()


def line_of(exc):
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<completion>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def print_exception(exc):
    """Print like the interpreter would (no source lines: the code is not a file), skipping the
    runtime's own frames. By hand: the traceback module pulls a dozen modules in."""
    try:
        if isinstance(exc, SyntaxError):
            lines = [f'  File "{exc.filename}", line {exc.lineno}\n']
            if exc.text:
                lines.append(f"    {exc.text.strip()}\n")
            lines.append(f"{type(exc).__name__}: {exc.msg}\n")
        else:
            frames, tb = [], exc.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                if code.co_filename.rpartition("/")[0] != RUNTIME_FILES:
                    frames.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}\n')
                tb = tb.tb_next
            if len(frames) > 40:
                frames = frames[:20] + [f"  [... {len(frames) - 40} more frames ...]\n"] + frames[-20:]
            text = clip_text(exc, 2000)
            lines = ["Traceback (most recent call last):\n", *frames,
                     f"{type(exc).__name__}: {text}\n" if text else f"{type(exc).__name__}\n"]
        sys.stderr.write("".join(lines))
        sys.stderr.flush()
    except BaseException:
        pass


# The runtime's own files (their frames are left out of what print_exception prints): this
# package's directory on the host, <runner>/ in the container (runtime/importer.py).
RUNTIME_FILES = print_exception.__code__.co_filename.rpartition("/")[0]
