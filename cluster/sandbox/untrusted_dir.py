"""A directory that candidate code may write to, and the worker's only way into it.

The worker runs outside the sandbox, maybe as root; a candidate may leave anything in its scratch
directory for the worker's next visit (the next run's capture files, the outputs it collects, a
reference it hands to a host): a symbolic link to the virtual environment, a FIFO that blocks a
read, a folder where a file was. So the worker never opens a path in there by name with links
followed. ``UntrustedDir`` holds the directory open by a descriptor (opened refusing a link, below
a parent the candidate cannot write) and reaches every file from it one name at a time with
``O_NOFOLLOW``: a link anywhere on the way is an error (``Refused``), never a write or a read of
what it points to. A file the worker writes is made afresh (``O_EXCL``), never written through
what was there; a file it reads must be a regular file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import BinaryIO

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFDIR: "a folder"}


class Refused(OSError):
    """A name in the directory that the worker will not go through: not what it expects there."""


def kind_of(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "a regular file")


class UntrustedDir:
    """``path`` (a directory the candidate may write to, whose parent it may not), held open."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, _DIR)
        except OSError as exc:
            raise Refused(exc.errno, f"{self.path}: not a directory of its own (a link or gone): "
                                     f"{exc.strerror}") from None

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> UntrustedDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- files -----------------------------------------------------------------------------------
    def read(self, rel: str, limit: int | None = None) -> bytes:
        """The content of the regular file ``rel`` (its last ``limit`` bytes); ``Refused`` for a
        link, a FIFO or anything else on the way, ``FileNotFoundError`` where there is nothing."""
        with self.open_read(rel) as fh:
            if limit is None:
                return fh.read()
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            return fh.read(limit)

    def open_read(self, rel: str) -> BinaryIO:
        """The regular file ``rel``, open for reading (the caller closes it)."""
        with self._parent(rel) as (parent, name):
            # O_NONBLOCK: a FIFO left where a file was would block the open; refused below.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise Refused(0, f"{rel}: {kind_of(mode)}, not a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def write(self, rel: str, content: bytes, mode: int = 0o644) -> None:
        """``rel`` made afresh with ``content`` (folders on the way made as needed); whatever the
        name held before is removed, never written through."""
        with self._parent(rel, make=True) as (parent, name), self._open_fresh(parent, name, mode) as fh:
            fh.write(content)

    def capture(self, name: str) -> BinaryIO:
        """A fresh file ``name`` open for writing and reading (a command's stdout): the worker's
        own, made new. What the name holds must be the regular file it was, or nothing: anything
        else (a link the last command left) is ``Refused``, the sign of a candidate that tampered."""
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode
            if not stat.S_ISREG(mode):
                raise Refused(0, f"{name}: {kind_of(mode)} where warpfleet's own file was (left by the candidate)")
        return self._open_fresh(self.fd, name, 0o644, rw=True)

    def remove(self, rel: str) -> None:
        """``rel`` gone, if it is not a folder; nothing where it is not there."""
        with contextlib.suppress(FileNotFoundError), self._parent(rel) as (parent, name):
            os.unlink(name, dir_fd=parent)

    # -- the whole tree ----------------------------------------------------------------------------
    def clear(self, keep: Collection[str] = ()) -> None:
        """Everything in the directory removed but the names ``keep``: links themselves, never what
        they point to (each folder removed through descriptors, ``shutil.rmtree``'s own defence)."""
        listing_fd = os.dup(self.fd)
        try:
            with os.scandir(listing_fd) as listing:
                names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
        finally:
            os.close(listing_fd)
        for name, folder in names:
            if name in keep:
                continue
            with contextlib.suppress(OSError):
                if folder:
                    shutil.rmtree(name, dir_fd=self.fd)
                else:
                    os.unlink(name, dir_fd=self.fd)

    def usage(self, max_bytes: int | None = None, max_entries: int | None = None) -> tuple[int, int]:
        """(bytes, entries) under the directory, links not followed, entries that vanish skipped;
        the count stops early once past ``max_bytes`` or ``max_entries`` (enough to say "over")."""
        total = entries = 0
        for parent, entry in self._walk():
            entries += 1
            with contextlib.suppress(OSError):
                if not entry.is_dir(follow_symlinks=False):
                    total += os.stat(entry.name, dir_fd=parent, follow_symlinks=False).st_size
            if (max_bytes is not None and total > max_bytes) or (max_entries is not None and entries > max_entries):
                break
        return total, entries

    def hand_over(self, uid: int, gid: int | None = None) -> None:
        """The directory and everything in it made ``uid``'s (links themselves, never their targets)."""
        gid = uid if gid is None else gid
        os.fchown(self.fd, uid, gid)
        for parent, entry in self._walk():
            with contextlib.suppress(FileNotFoundError):
                os.chown(entry.name, uid, gid, dir_fd=parent, follow_symlinks=False)

    def _walk(self) -> Iterator[tuple[int, os.DirEntry[str]]]:
        """(descriptor of its folder, entry) for everything below, each folder entered by descriptor
        with O_NOFOLLOW; a folder that cannot be entered (gone, replaced) is skipped."""
        pending = [os.dup(self.fd)]
        try:
            while pending:
                fd = pending.pop()
                try:
                    with os.scandir(fd) as listing:
                        for entry in listing:
                            yield fd, entry
                            if entry.is_dir(follow_symlinks=False):
                                with contextlib.suppress(OSError):
                                    pending.append(os.open(entry.name, _DIR, dir_fd=fd))
                except OSError:
                    pass
                finally:
                    os.close(fd)
        finally:
            for fd in pending:
                os.close(fd)

    # -- one name at a time ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _parent(self, rel: str, make: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of ``rel``'s folder, its last name), every folder on the way entered with
        O_NOFOLLOW (made first where ``make``)."""
        parts = [p for p in Path(rel).parts if p not in ("", ".")]
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise Refused(0, f"{rel}: not a name inside the directory")
        fd = os.dup(self.fd)
        try:
            for part in parts[:-1]:
                if make:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                try:
                    inner = os.open(part, _DIR, dir_fd=fd)
                except OSError as exc:
                    raise Refused(exc.errno, f"{rel}: {part} is not a folder (a link?)") from None
                os.close(fd)
                fd = inner
            yield fd, parts[-1]
        finally:
            os.close(fd)

    @staticmethod
    def _open_fresh(parent: int, name: str, mode: int, rw: bool = False) -> BinaryIO:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)  # a link goes, not what it points to
        flags = (os.O_RDWR if rw else os.O_WRONLY) | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, mode, dir_fd=parent)
        except FileExistsError:  # made again between the unlink and the open: someone is racing us
            raise Refused(0, f"{name}: made again while warpfleet made it (a candidate's process racing)") from None
        os.fchmod(fd, mode)  # as asked, whatever the umask
        return os.fdopen(fd, "w+b" if rw else "wb")

