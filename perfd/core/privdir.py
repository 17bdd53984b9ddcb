"""Directories only this user may use: the capture store, the spool, the agent's and the aggregator's
state, the hook's socket folder. A daemon that often runs as root must never be led by another user
into writing, reading or deleting files it did not make.

:func:`open_private_dir` walks the path from ``/`` one component at a time with ``openat`` and
``O_NOFOLLOW`` (no name is looked up twice, so nothing can be swapped between a check and a use):

- every ancestor must be owned by root or by us, and not writable by group or others unless it has
  the sticky bit (``/tmp``): another user who may rename entries in an ancestor could swap our
  directory for theirs;
- a symbolic link among the ancestors is followed only when it is owned by root or by us (``/var/run``
  → ``/run``); the last component is never a link;
- missing components are made with ``mkdirat`` mode 0700 (race-free: ``EEXIST`` means someone else
  made it, and it is then checked like any other);
- the directory itself must be owned by us; a mode wider than 0700 is narrowed (it is ours).

What is refused raises :class:`UnsafeDirError` with one sentence for a person. The caller gets an
open descriptor: deleting and listing relative to it never leaves the directory it checked.

A folder a person names for files (``perfd launch --log``, ``--run-dir``) is opened the same way by
:func:`open_safe_dir`, the folder itself held to root's or ours (and sticky when others may write in
it), or to ours alone; :func:`open_own_file` then makes or reuses a file in it without following a
link, nor reusing a file that is not this user's own regular file with one link.

Default locations (:func:`user_dir`) are per user, never a shared ``/tmp`` name: ``$XDG_STATE_HOME``,
``/var/lib/perfd`` for root where it exists, or ``~/.local/state`` (from the password database, not
``$HOME``, which ``sudo`` may keep), then ``<tmp>/perfd-<uid>`` when the home is unusable;
:func:`runtime_dir` gives sockets ``/run/perfd`` (root) or ``$XDG_RUNTIME_DIR/perfd``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

VAR_LIB = "/var/lib/perfd"  # root's state folder on hosts that have one (the systemd unit makes it)
MAX_LINK_HOPS = 40  # as the kernel's own limit on symbolic links in one lookup
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafeDirError(OSError):
    """A directory perfd will not use: another user's, a symbolic link, or under a folder others
    may rename things in."""

    def __str__(self) -> str:
        return str(self.strerror)


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _check_ancestor(st: os.stat_result, where: str) -> None:
    if not _trusted_owner(st.st_uid):
        raise UnsafeDirError(errno.EPERM, f"{where} belongs to uid {st.st_uid}, neither root nor this "
                                          f"user (uid {os.geteuid()}): another user could swap what is in it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirError(errno.EPERM, f"{where} is writable by other users without the sticky bit "
                                          f"(mode {stat.S_IMODE(st.st_mode):04o})")


def open_private_dir(path: str | os.PathLike[str], create: bool = True) -> int:
    """An open descriptor (``O_DIRECTORY``) of ``path``, checked and made as the module says."""
    return _open_dir(path, create, PRIVATE)


# What the folder itself must be (its ancestors are checked the same way for all three):
PRIVATE = "private"  # ours; a mode wider than 0700 narrowed
OWN = "own"  # ours, writable by nobody else (left as it is: a folder a person named, e.g. a run dir)
SHARED = "shared"  # root's or ours, writable by others only with the sticky bit (/tmp): files in it
#                   are made with open_own_file, which another user's planted name cannot fool


def open_safe_dir(path: str | os.PathLike[str], create: bool = True, what: str = SHARED) -> int:
    """An open descriptor of ``path`` for files a person asked perfd to write there (a log, a run
    folder), walked as :func:`open_private_dir` walks, the folder itself checked as ``what`` says
    (:data:`OWN` or :data:`SHARED`). Missing folders are made 0700."""
    return _open_dir(path, create, what)


def _open_dir(path: str | os.PathLike[str], create: bool, what: str) -> int:
    target = os.path.abspath(os.fspath(path))
    parts = [p for p in Path(target).parts[1:] if p not in ("", ".")]
    fd = os.open("/", _DIR_FLAGS)
    where = "/"
    hops = 0
    try:
        _check_ancestor(os.fstat(fd), where)
        i = 0
        while i < len(parts):
            name, last = parts[i], i == len(parts) - 1
            if name == "..":
                raise UnsafeDirError(errno.EINVAL, f"{target}: '..' after a symbolic link is not followed")
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile: checked below like any
                    os.mkdir(name, 0o700, dir_fd=fd)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            here = os.path.join(where, name)
            if stat.S_ISLNK(st.st_mode):
                if last:
                    raise UnsafeDirError(errno.ELOOP, f"{here} is a symbolic link: name the directory itself")
                if not _trusted_owner(st.st_uid):
                    raise UnsafeDirError(errno.EPERM, f"{here} is a symbolic link of uid {st.st_uid}")
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise UnsafeDirError(errno.ELOOP, f"{target}: too many symbolic links")
                link = os.readlink(name, dir_fd=fd)
                rest = os.path.normpath(os.path.join(where, link, *parts[i + 1:]))
                parts = [p for p in Path(rest).parts[1:] if p not in ("", ".")]
                os.close(fd)
                fd = os.open("/", _DIR_FLAGS)
                where, i = "/", 0
                continue
            nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)  # a link swapped in since the stat: ELOOP
            os.close(fd)
            fd, where = nfd, here
            st = os.fstat(fd)
            if last and what != SHARED:
                if st.st_uid != os.geteuid():
                    raise UnsafeDirError(errno.EPERM, f"{here} belongs to uid {st.st_uid}, not to this user "
                                                      f"(uid {os.geteuid()}): refusing to use it")
                if what == PRIVATE and stat.S_IMODE(st.st_mode) & 0o077:
                    os.fchmod(fd, 0o700)  # ours: narrowing it harms nobody
                if what == OWN and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    # Other users could plant names in it (the manifest's temporary file among them).
                    raise UnsafeDirError(errno.EPERM, f"{here} is writable by other users (mode "
                                                      f"{stat.S_IMODE(st.st_mode):04o}): name a folder "
                                                      "of your own (chmod go-w)")
            else:
                _check_ancestor(st, here)
            i += 1
        if not parts:
            raise UnsafeDirError(errno.EPERM, "/ cannot be a private directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


def private_dir(path: str | os.PathLike[str], create: bool = True) -> Path:
    """:func:`open_private_dir`, closed again; returns the absolute path."""
    os.close(open_private_dir(path, create))
    return Path(os.path.abspath(os.fspath(path)))


@contextlib.contextmanager
def opened_private_dir(path: str | os.PathLike[str]) -> Iterator[int]:
    fd = open_private_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)


class UnsafeFileError(UnsafeDirError):
    """A file perfd will not write: a link, not a regular file, another user's, or with other names
    (hard links) elsewhere."""


def open_own_file(dir_fd: int, name: str, where: str, mode: int = 0o666) -> int:
    """``name`` under ``dir_fd`` opened for writing, never through a link: made anew (``O_EXCL``,
    ``mode`` less the umask), or, when a file is there already, reused only if it is a regular file
    of this user with no other name (a hard link another user made to one of ours would otherwise
    have us overwrite it). Not truncated here: the caller truncates once every file it needs passed.
    ``where``: the path, for the message of :class:`UnsafeFileError`."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
    except FileExistsError:
        fd = _reuse_own_file(dir_fd, name, where, flags)
    os.set_blocking(fd, True)
    return fd


def _reuse_own_file(dir_fd: int, name: str, where: str, flags: int) -> int:
    try:  # O_NONBLOCK: a FIFO put there must not hold us until a reader comes
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(errno.ELOOP, f"{where} is a symbolic link: refusing to write "
                                               "through it (remove it, or name another file)") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise UnsafeFileError(exc.errno, f"{where} is not a regular file") from None
        raise
    st = os.fstat(fd)  # the file opened, not a name looked up again
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    elif st.st_nlink != 1:
        problem = f"has {st.st_nlink} hard links: it is also another file"
    if problem is not None:
        os.close(fd)
        raise UnsafeFileError(errno.EPERM, f"{where} {problem}: refusing to overwrite it "
                                           "(remove it, or name another file)")
    return fd


def rmtree_at(parent_fd: int, name: str, depth: int = 64) -> int:
    """Delete ``name`` under ``parent_fd`` and return the bytes freed, never following a link: a
    link is removed as a link, a folder is opened ``O_NOFOLLOW`` and emptied through its descriptor."""
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    if depth <= 0:
        raise OSError(errno.ELOOP, f"{name}: folders nested too deep to delete")
    freed = 0
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        for entry in list(os.scandir(fd)):
            freed += rmtree_at(fd, entry.name, depth - 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
    return freed


def _home() -> Path | None:
    try:
        import pwd

        home = pwd.getpwuid(os.geteuid()).pw_dir
    except (ImportError, KeyError):
        return None
    if not home or home == "/" or not os.path.isdir(home):
        return None
    return Path(home)


def user_dir(*parts: str) -> Path:
    """A per-user default location for perfd's files: ``$XDG_STATE_HOME/perfd/...``; for root
    ``/var/lib/perfd/...`` when that folder exists and is writable (systemd's ``StateDirectory=perfd``,
    where ``ProtectSystem=strict`` leaves the home read-only); ``~/.local/state/perfd/...``; else
    ``<tmp>/perfd-<uid>/...`` (not created here)."""
    xdg = os.environ.get("XDG_STATE_HOME")
    home = _home()
    if xdg and os.path.isabs(xdg):
        base = Path(xdg) / "perfd"
    elif os.geteuid() == 0 and os.path.isdir(VAR_LIB) and os.access(VAR_LIB, os.W_OK):
        base = Path(VAR_LIB)
    elif home is not None and os.access(home, os.W_OK):
        base = home / ".local" / "state" / "perfd"
    else:
        base = Path(tempfile.gettempdir()) / f"perfd-{os.geteuid()}"
    return base.joinpath(*parts)


def runtime_dir() -> Path:
    """Where this user's perfd sockets go: ``/run/perfd`` for root (no other user can make a name in
    /run), ``$XDG_RUNTIME_DIR/perfd`` (a per-user tmpfs the login manager made 0700) when set and
    ours, else ``<tmp>/perfd-<uid>`` (which another user could make first: perfd then refuses it and
    says so). Computed the same way by the agent and by a training process of the same user; not
    created here."""
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            st = os.stat("/run")
            if st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return Path("/run/perfd")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        with contextlib.suppress(OSError):
            if os.stat(xdg).st_uid == os.geteuid():
                return Path(xdg) / "perfd"
    return Path(tempfile.gettempdir()) / f"perfd-{os.geteuid()}"
