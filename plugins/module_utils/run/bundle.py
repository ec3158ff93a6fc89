# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A finished run's directory as one answer: packed on the coordinator by ``run_status`` (option ``bundle``) in the
watch's last call, unpacked on the controller by the ``watch`` action, so that a run that ended well is collected
without a transfer of its own.

What it carries is what ``train.yml``'s collection (rsync) copies: every directory and regular file of the run
directory except the ``checkpoints`` and ``attempts`` directories, at any depth, with their modes and times.  A
directory that holds anything else (a symbolic link, a socket), a file that goes away while it is read, or more
than ``max_bytes`` of files is not packed: ``pack`` says why and the play's rsync collects the run as before.

``pack`` opens each file without following a link and without waiting on a FIFO, and reads it only when it is still
a regular file (``common/files.py``); ``unpack`` writes only under its destination: every name is checked (relative,
no ``..``, no empty or odd part), no directory on the way may be a symbolic link, files are written beside their
place and renamed over it (a link already there is replaced, never followed; ``common/files.py``), and no mode bit
beyond ``0o777`` is kept.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import stat
import zlib

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files

EXCLUDED_DIRS = ("checkpoints", "attempts")
MAX_BYTES = 16 * 1024 * 1024


class BundleError(ValueError):
    """A bundle that cannot be unpacked where it was asked to go."""


def pack(root, max_bytes=MAX_BYTES, excluded=EXCLUDED_DIRS):
    """``(bundle, None, files)``: the run directory ``root`` as text (zlib-compressed JSON, base64), or
    ``(None, why, 0)`` when it cannot be packed as the collection would copy it."""
    entries, total, count = [], 0, 0
    root = root.rstrip("/") or "/"
    for here, dirs, names in os.walk(root, onerror=_raise):
        rel_here = os.path.relpath(here, root)
        kept = []
        for name in sorted(dirs):
            path = os.path.join(here, name)
            if os.path.islink(path):
                return None, "%s is a symbolic link" % _rel(rel_here, name), 0
            if name not in excluded:
                kept.append(name)
        dirs[:] = kept
        if rel_here != ".":
            info = os.lstat(here)
            entries.append({"path": rel_here, "dir": True, "mode": stat.S_IMODE(info.st_mode) & 0o777,
                            "mtime": info.st_mtime})
        for name in sorted(names):
            path, rel = os.path.join(here, name), _rel(rel_here, name)
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    return None, "%s is not a regular file" % rel, 0
                total += info.st_size
                if total > max_bytes:
                    return None, "the run directory holds more than %d bytes" % max_bytes, 0
                refused = []
                data = files.read_bytes(path, root, limit=max_bytes + 1, refused=refused)
                if data is None:  # replaced since lstat (by a link, a FIFO; a link on the way) or gone
                    return None, "%s %s" % (rel, "is not a regular file" if refused else "cannot be read: gone"), 0
            except OSError as exc:
                return None, "%s cannot be read: %s" % (rel, exc.strerror or exc), 0
            total += len(data) - info.st_size  # a file that grew since lstat counts as read
            if total > max_bytes:
                return None, "the run directory holds more than %d bytes" % max_bytes, 0
            entries.append({"path": rel, "mode": stat.S_IMODE(info.st_mode) & 0o777, "mtime": info.st_mtime,
                            "data": base64.b64encode(data).decode("ascii")})
            count += 1
    text = json.dumps(entries, sort_keys=True).encode("utf-8")
    return base64.b64encode(zlib.compress(text, 6)).decode("ascii"), None, count


def _raise(exc):
    raise exc


def _rel(rel_here, name):
    return name if rel_here == "." else os.path.join(rel_here, name)


def entries_of(bundle, max_bytes=MAX_BYTES):
    """The entries of ``bundle``; BundleError when it is not one (or unpacks to far more than ``max_bytes``)."""
    try:
        raw = base64.b64decode(bundle.encode("ascii") if isinstance(bundle, str) else bundle, validate=True)
        inflate = zlib.decompressobj()
        # Base64 makes 4 bytes of 3 and JSON adds a name, a mode and a time per file: allow for that, no more.
        limit = 2 * max_bytes + 1024 * 1024
        text = inflate.decompress(raw, limit)
        if inflate.unconsumed_tail:
            raise BundleError("the bundle unpacks to more than %d bytes" % limit)
        entries = json.loads(text.decode("utf-8"))
    except (ValueError, TypeError, zlib.error, UnicodeDecodeError) as exc:
        if isinstance(exc, BundleError):
            raise
        raise BundleError("not a run bundle: %s" % exc)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BundleError("not a run bundle: not a list of entries")
    return entries


def safe_name(name):
    """``name`` when it is a relative path whose parts are plain names; else BundleError."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\x00" in name:
        raise BundleError("refusing the name %r" % (name,))
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BundleError("refusing the name %r" % (name,))
    return name


def unpack(bundle, dest, max_bytes=MAX_BYTES):
    """Write ``bundle`` under ``dest`` (made when missing); returns the number of files written."""
    entries = entries_of(bundle, max_bytes)
    os.makedirs(dest, exist_ok=True)
    top = os.path.realpath(dest)
    written = 0
    for entry in entries:
        name = safe_name(entry.get("path"))
        target = os.path.join(top, name)
        parent = os.path.dirname(target)
        _make_dirs(top, os.path.relpath(parent, top))
        mode = int(entry.get("mode", 0o644)) & 0o777
        if entry.get("dir"):
            _make_dirs(top, name)
            os.chmod(target, mode | 0o700)
        else:
            data = base64.b64decode(str(entry.get("data", "")).encode("ascii"), validate=True)
            try:
                files.write_bytes(target, data, top, mode)
            except files.UnsafePath as exc:
                raise BundleError(str(exc))
            written += 1
        try:
            os.utime(target, (float(entry.get("mtime", 0)), float(entry.get("mtime", 0))), follow_symlinks=False)
        except (OSError, ValueError, TypeError):
            pass
    return written


def _make_dirs(top, rel):
    """Make ``top/rel`` one directory at a time; no part on the way may be a symbolic link or a file."""
    if rel in ("", "."):
        return
    path = top
    for part in rel.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise BundleError("%s is a symbolic link on the controller: not writing through it" % path)
        if not os.path.isdir(path):
            if os.path.exists(path):
                raise BundleError("%s is there and is not a directory" % path)
            os.mkdir(path, 0o755)
