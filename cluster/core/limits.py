"""What one untrusted command may take: the limits a target sets and the sandbox applies."""

from __future__ import annotations

import resource
from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """What one untrusted command may take; None is unlimited.

    ``memory_mb`` caps the address space (RLIMIT_AS); it is off by default because CUDA programs
    reserve far more virtual memory than they use. ``file_mb`` caps any one file the command writes
    (RLIMIT_FSIZE), its stdout and stderr files included. ``disk_mb`` caps the total size of the
    command's directory, and ``files`` the number of files and folders in it (an inode bomb of
    empty files takes no disk): watched while it runs (``sandbox.LimitWatch``) and measured once
    after, so a fast writer may overshoot by what it writes between two looks before it is
    killed. ``cpu_s`` caps CPU seconds (RLIMIT_CPU).
    """

    memory_mb: int | None = None
    file_mb: int | None = None
    disk_mb: int | None = None
    cpu_s: int | None = None
    files: int | None = None

    def rlimits(self) -> list[tuple[int, int, int]]:
        """(resource, soft, hard) for the child; never above the worker's own hard limits."""
        wanted = [(resource.RLIMIT_CORE, 0, 0)]  # crashing candidates must not write core dumps
        for res, mb in ((resource.RLIMIT_AS, self.memory_mb), (resource.RLIMIT_FSIZE, self.file_mb)):
            if mb is not None:
                wanted.append((res, mb * MB, mb * MB))
        if self.cpu_s is not None:  # the soft limit sends SIGXCPU, which says why; the hard one kills
            wanted.append((resource.RLIMIT_CPU, self.cpu_s, self.cpu_s + 1))
        out = []
        for res, soft, hard in wanted:
            ceiling = resource.getrlimit(res)[1]
            if ceiling != resource.RLIM_INFINITY:
                soft, hard = min(soft, ceiling), min(hard, ceiling)
            out.append((res, soft, hard))
        return out

    def amount(self, kind: str) -> str:
        """The limit that a ``ProcessResult.limit_exceeded`` kind names, with its unit: "64 MB"."""
        value, unit = {"memory": (self.memory_mb, "MB"), "file size": (self.file_mb, "MB"),
                       "disk": (self.disk_mb, "MB"), "cpu time": (self.cpu_s, "s"),
                       "files": (self.files, "files")}[kind]
        return f"{value} {unit}"
