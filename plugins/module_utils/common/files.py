# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files in a run's directory on the controller (``runs/<run_id>/``), whose content came back from the cluster:
rank code wrote it, so no name there is taken to be what it says.

- ``refuse_specials`` walks a collected directory (lstat, no link followed) and removes what is neither a regular
  file nor a directory (a symbolic link, a FIFO, a socket, a device), returning the names it removed;
  ``rsync_skipped`` reads the names rsync left behind for the same reason from its output.
- ``read_bytes``, ``read_text`` and ``read_json`` open a file without following a link (``O_NOFOLLOW``) and without
  waiting on a FIFO (``O_NONBLOCK``), and read it only when it is a regular file (``fstat``); anything else reads as
  absent, and its name is added to ``refused``.
- ``write_bytes``, ``write_text`` and ``write_json`` write a temporary file beside the target (``O_CREAT|O_EXCL|
  O_NOFOLLOW``) and rename it over the target: a link there is replaced, never followed.

With ``root`` (the run's directory), no directory between ``root`` and the file may be a symbolic link: each is
opened relative to the one before with ``O_NOFOLLOW`` (writes make the missing ones). ``root`` itself is the
controller's own and is trusted; without it, the file's own directory is.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import binascii
import errno
import json
import os
import re
import stat

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
READ_FLAGS = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# What opening a name with O_NOFOLLOW (or O_DIRECTORY) answers when it is a link (ELOOP; EMLINK on the BSDs), a
# socket (ENXIO), or a file where a directory must be (ENOTDIR).
_REFUSED_ERRNOS = (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.ENOTDIR)
_RSYNC_SKIPPED = re.compile(r'^skipping non-regular file "(.*)"$')


class UnsafePath(OSError):
    """A name under the run's directory that is not what it must be (a link on the way, a directory in a file's
    place)."""


def _parts(root, path):
    """``(base, directories, name)``: the trusted directory, the ones from it to ``path``'s, and the file's name."""
    if root is None:
        return os.path.dirname(path) or ".", [], os.path.basename(path)
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if rel in (".", "") or os.path.isabs(rel) or ".." in parts:
        raise ValueError("%s is not under %s" % (path, root))
    return root, parts[:-1], parts[-1]


def _name(root, path):
    """How a refused file is named: relative to ``root`` when given."""
    return os.path.relpath(path, root) if root is not None else path


def open_dir(base, parts, create=False):
    """A descriptor of ``base/parts...``, each part opened with O_NOFOLLOW relative to the one before (made first
    with ``create``). Raises UnsafePath when a part is a link or not a directory, FileNotFoundError when one is
    missing."""
    fd = os.open(base, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    done = []
    try:
        for part in parts:
            done.append(part)
            if create:
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in _REFUSED_ERRNOS:
                    raise UnsafePath(exc.errno, "%s is a symbolic link or not a directory: not going through it"
                                     % os.path.join(base, *done))
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(path, root, refused):
    """A descriptor of the regular file ``path`` opened for reading, or None (missing, or refused: named)."""
    try:
        base, parts, name = _parts(root, path)
        dir_fd = open_dir(base, parts)
    except UnsafePath:
        refused.append(_name(root, path))
        return None
    except (OSError, ValueError):
        return None
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _REFUSED_ERRNOS:
            refused.append(_name(root, path))
        return None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        refused.append(_name(root, path))
        return None
    return fd


def read_bytes(path, root=None, limit=None, tail=False, refused=None):
    """The content of the regular file ``path`` - at most ``limit`` bytes, its last ones with ``tail`` - or None
    when it is missing or is not a regular file (a link, a FIFO, a socket, a device, a directory: its name is added
    to the list ``refused``)."""
    fd = _open_file(path, root, refused if refused is not None else [])
    if fd is None:
        return None
    try:
        if limit is not None and tail:
            size = os.fstat(fd).st_size
            if size > limit:
                os.lseek(fd, size - limit, os.SEEK_SET)
        chunks, left = [], limit
        while left is None or left > 0:
            chunk = os.read(fd, min(left, 1 << 20) if left is not None else 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            if left is not None:
                left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(path, root=None, limit=None, tail=False, refused=None):
    """``read_bytes`` as text (UTF-8, undecodable bytes replaced), or None."""
    data = read_bytes(path, root, limit, tail, refused)
    return None if data is None else data.decode("utf-8", "replace")


def read_json(path, root=None, refused=None):
    """The JSON value of the regular file ``path``; None when it is missing or refused; ValueError when it is not
    JSON."""
    text = read_text(path, root, refused=refused)
    return None if text is None else json.loads(text)


def is_regular(path, root=None):
    """Whether ``path`` is a regular file, reached without a link."""
    fd = _open_file(path, root, [])
    if fd is None:
        return False
    os.close(fd)
    return True


def write_bytes(path, data, root=None, mode=None):
    """Write ``data`` to ``path`` whole: a new file beside it, renamed over it (a link at ``path`` is replaced, not
    followed). Its mode follows the umask unless ``mode`` is given. Raises OSError (UnsafePath when a directory on
    the way from ``root`` is a link, or ``path`` is a directory)."""
    base, parts, name = _parts(root, path)
    if not os.path.isdir(base):
        os.makedirs(base)  # the trusted directory (``root``, or the file's own without it)
    dir_fd = open_dir(base, parts, create=True)
    try:
        tmp, fd = _temp(dir_fd, name)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None:
                os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.close(fd)
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            os.unlink(tmp, dir_fd=dir_fd)
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise UnsafePath(exc.errno, "%s is a directory: not writing there" % path)
            raise
    finally:
        os.close(dir_fd)
    return path


def _temp(dir_fd, name):
    """A new temporary file beside ``name``: (its name, a descriptor open for writing)."""
    while True:
        tmp = ".%s.%s.tmp" % (name[:64], binascii.hexlify(os.urandom(6)).decode("ascii"))
        try:
            return tmp, os.open(tmp, WRITE_FLAGS, 0o666, dir_fd=dir_fd)
        except FileExistsError:
            continue


def write_text(path, text, root=None, mode=None):
    """``write_bytes`` of ``text`` in UTF-8 (a name that is not UTF-8 is written escaped)."""
    return write_bytes(path, text.encode("utf-8", "backslashreplace"), root, mode)


def write_json(path, value, root=None):
    """``value`` as indented JSON with sorted keys and a last newline."""
    return write_text(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n", root)


def printable(name):
    """A file name as text a report can hold (bytes that are not UTF-8 escaped)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def refuse_specials(root, skip=(), remove=True):
    """The names (relative to ``root``, sorted) of everything under ``root`` that is neither a regular file nor a
    directory - a symbolic link (to anything), a FIFO, a socket, a device - each removed unless not ``remove``.
    Top-level entries named in ``skip`` are left alone. No link is followed; the walk is not recursive (any depth)."""
    found, todo = [], [""]
    while todo:
        rel = todo.pop()
        try:
            names = sorted(os.listdir(os.path.join(root, rel) if rel else root))
        except OSError:
            continue
        for name in names:
            sub = os.path.join(rel, name) if rel else name
            if not rel and name in skip:
                continue
            try:
                mode = os.lstat(os.path.join(root, sub)).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                todo.append(sub)
            elif not stat.S_ISREG(mode):
                found.append(sub)
                if remove:
                    try:
                        os.unlink(os.path.join(root, sub))
                    except OSError:
                        pass
    return sorted(printable(n) for n in found)


def rsync_skipped(lines):
    """The names rsync did not copy because they are not regular files (``--no-links --no-devices --no-specials``),
    from its output lines."""
    out = []
    for line in lines or []:
        found = _RSYNC_SKIPPED.match(str(line).strip())
        if found:
            out.append(found.group(1))
    return sorted(set(out))
