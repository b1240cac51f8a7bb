"""An episode's workspace through the real sandbox: the files a job leaves in /work come back
(regular files only, within the caps) and are restored before the next turn's code runs; a
workspace entry with a path outside /work is refused; other jobs in the same container never see
the files."""

from __future__ import annotations

import pytest

from rollstream.consumers.executor.jobs import WORKSPACE_BYTES, Job
from rollstream.consumers.executor.pool import DockerSandboxPool

pytestmark = pytest.mark.sandbox
LEAVE = (
    "import os\n"
    "os.makedirs('/work/notes/deep', exist_ok=True)\n"
    "open('/work/notes/deep/a.txt', 'w').write('turn one')\n"
    "open('/work/b.bin', 'wb').write(bytes(range(256)))\n"
    "os.symlink('/etc/passwd', '/work/link')\n"
    "os.mkfifo('/work/fifo')\n"
    f"open('/work/huge', 'wb').write(b'x' * ({WORKSPACE_BYTES} + 1))\n"
)


def verdicts(result) -> list[bool]:
    return [bool(e.get("ok")) for e in result.events if e.get("e") == "test"]


async def test_files_come_back_and_are_restored_for_the_next_turn_only(pool: DockerSandboxPool) -> None:
    first = await pool.execute(Job(job_id="t1", code=LEAVE, collect_files=True))
    files = dict(first.files)
    assert files == {"notes/deep/a.txt": b"turn one", "b.bin": bytes(range(256))}  # no link, FIFO or huge file
    assert first.files_truncated
    look = ("import os\n"
            "seen = (open('/work/notes/deep/a.txt').read(), open('/work/b.bin', 'rb').read() == bytes(range(256)),\n"
            "        sorted(os.listdir('/work')))\n")
    second = await pool.execute(Job(job_id="t2", code=look, files=first.files,
                                    tests=["assert seen == ('turn one', True, ['b.bin', 'notes']), seen"]))
    assert verdicts(second) == [True] and second.files == []  # nothing collected unless asked
    other = await pool.execute(Job(job_id="o", code="import os\nseen = os.listdir('/work')",
                                   tests=["assert seen == [], seen"]))
    assert verdicts(other) == [True]  # another episode's job starts with an empty /work
    assert first.sandbox_id == second.sandbox_id == other.sandbox_id


async def test_a_workspace_path_outside_work_is_refused(pool: DockerSandboxPool) -> None:
    for path in ("../etc/evil", "/etc/evil", "a/../../evil", "a//b", "."):
        result = await pool.execute(Job(job_id="bad", code="import os\nseen = os.listdir('/work')",
                                        files=[(path, b"x"), ("ok.txt", b"y")], tests=["assert 'evil' not in seen"]))
        assert verdicts(result) == [True], path
    huge = await pool.execute(Job(job_id="huge", code="import os\nseen = os.listdir('/work')",
                                  files=[("big", b"x" * (WORKSPACE_BYTES + 1))], tests=["assert seen == [], seen"]))
    assert verdicts(huge) == [True]  # over the cap: not written
