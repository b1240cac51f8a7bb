"""The runner's wait for a job's processes to be gone (consumers/executor/runtime/cleanup.py
``_settle``), on scripted views of /proc: zombies that reach PID 1 after a round of reaping are
reaped before the container is called clean (under gVisor a fork bomb's orphans did, about one
run in eight, and the next job found them), a live leftover is a survivor at once, and zombies
that stay are never taken for clean. The sandbox tier runs the real thing
(tests/consumers/executor/test_hostile.py)."""

from __future__ import annotations

import pytest

from rollstream.consumers.executor.runtime import cleanup

pytestmark = pytest.mark.unit

ZYGOTES = {2: 10, 3: 11}  # pid -> the read end of its pipe (unused here)


class Host:
    def __init__(self, ahead=None):
        self.zygotes = dict(ZYGOTES)
        self.ahead = dict(ahead or {})
        self.threads = 0


def scripted(monkeypatch, views):
    """Each scan of /proc returns the next view (the last one repeats); counts the reaps."""
    seen = {"reaps": 0, "scans": 0}

    def reap():
        seen["reaps"] += 1

    def states():
        view = views[min(seen["scans"], len(views) - 1)]
        seen["scans"] += 1
        return {pid: state.encode() for pid, state in view.items()}

    monkeypatch.setattr(cleanup, "_reap", reap)
    monkeypatch.setattr(cleanup, "_states", states)
    return seen


def test_zombies_handed_to_init_after_a_reap_are_waited_for(monkeypatch):
    # what a fork bomb left under runsc: its killed processes' children reach PID 1 as zombies
    # only once their parents have finished exiting, after the first round of reaping
    zombies = {str(pid): "Z" for pid in range(33, 97)}
    seen = scripted(monkeypatch, [{"2": "S", "3": "S", **zombies}, {"2": "S", "3": "S", "40": "Z"}, {"2": "S", "3": "S"}])
    assert cleanup._settle(Host(), 1.0) == (0, True)
    assert seen["reaps"] == seen["scans"] == 3  # reaped until nothing was left


def test_a_live_leftover_is_a_survivor_at_once(monkeypatch):
    seen = scripted(monkeypatch, [{"2": "S", "3": "S", "40": "Z", "41": "R", "42": "S"}])
    assert cleanup._settle(Host(), 1.0) == (2, False)
    assert seen["scans"] == 1


def test_zombies_that_stay_are_never_clean(monkeypatch):
    scripted(monkeypatch, [{"2": "S", "3": "S", "40": "Z"}])
    assert cleanup._settle(Host(), 0.01) == (0, False)
    scripted(monkeypatch, [{"2": "S", "3": "S", "40": "Z"}])
    assert cleanup._settle(Host(), 0) == (0, False)  # no wait at all: still not clean


def test_the_zygotes_and_their_children_forked_ahead_are_not_leftovers(monkeypatch):
    scripted(monkeypatch, [{"2": "S", "3": "S", "20": "S", "21": "S"}])
    host = Host({b"C": "20", b"J": "21"})
    assert cleanup._settle(host, 1.0) == (0, True)
    assert host.ahead == {b"C": "20", b"J": "21"}


def test_a_child_forked_ahead_that_died_is_forgotten_and_waited_for(monkeypatch):
    seen = scripted(monkeypatch, [{"2": "S", "3": "S", "20": "Z", "21": "S"}, {"2": "S", "3": "S", "21": "S"}])
    host = Host({b"C": "20", b"J": "21"})
    assert cleanup._settle(host, 1.0) == (0, True)
    assert host.ahead == {b"J": "21"} and seen["scans"] == 2  # its zygote reaps it and forks anew
