"""Every process a run started ends with the run, where the run shares a process with the next
(the persistent host): the host becomes the subreaper of its descendants (``adopt_orphans``), so
that a daemon that forks twice or leaves its session stays below it, and after each candidate it
kills and reaps all of them (``end_strays``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans of this process's descendants come to it, not to init


def end_strays(me: int | None = None) -> int:
    """Every process below this one killed and reaped (the host is their subreaper, so that a
    daemon that forked twice or left its session is still below it); how many there were. A run's
    processes end with the run, as a process run's end with its sandbox: none plants files in a
    later run's directory."""
    me = me or os.getpid()
    ended = 0
    for _ in range(1000):  # a fork bomb forks while it is killed: each round takes what is there
        below = descendants(me)
        if not below:
            break
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended += len(below)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.001)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return ended


def descendants(root: int) -> list[int]:
    """The processes below ``root`` (children, theirs, ...), zombies left out."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rpartition(")")[2].split()
                if fields[0] != "Z":  # a zombie is dead already: reaped below
                    parents[int(entry)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def adopt_orphans() -> None:
    """This process made the subreaper of its descendants: their orphans come to it, not to init."""
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
