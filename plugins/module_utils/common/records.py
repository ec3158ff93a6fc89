# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's quarantine and spares records: where they are, and how one is read.

The records are files on the coordinator, in the shared directory (``<shared_dir>/runs/.records/quarantine.json``
and ``spares.json``, or the absolute paths there that ``quarantine_file`` and ``spares_file`` name), so that every
controller that drives the cluster sees the same quarantined nodes and the same spares held.  The coordinator reads
them before every plan (``node_facts`` with ``records``) and changes them under their lock (``run_recovery``, whose
functions are ``run/recovery.py``'s).

A record is read without following a link - neither the file nor, for the default place, the ``.records``
directory under ``runs/`` (the run's account writes there, and so can rank code) - only when it is a regular file
of at most ``LIMIT`` bytes; a file that is no record is an error that names it and the fix, never taken as empty
(that would let every quarantined node or held spare out).

Pure Python, standard library only: ``node_facts`` sends it to the node with its read.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import stat

# The shared directory when the inventory sets no shared_dir_path (role shared_dir's default).
SHARED_DIR = "/srv/multinode-deepspeed"
# The records' directory under the shared directory (run ids never start with a dot: no run's directory).
RECORDS_DIR = os.path.join("runs", ".records")
# The most bytes a record may hold (a node's entry takes about 100).
LIMIT = 1 << 20

# Each record file: its key, what it is called (its variable), and what removing it gives up.
RECORDS = {
    "nodes": ("quarantine file (quarantine_file)", "every node it quarantined takes ranks again"),
    "spares": ("spares file (spares_file)", "every spare a run holds is free again; stop the runs that use spares "
                                            "first"),
}
# The result key of each record in node_facts' answer, and its file's key.
ANSWER = (("quarantine", "quarantine_file", "nodes"), ("spares", "spares_file", "spares"))

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# What opening a name with O_NOFOLLOW (or O_DIRECTORY) answers when it is a link, a socket or not a directory.
_REFUSED = (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.ENOTDIR)


class RecordError(ValueError):
    """The quarantine or spares file cannot be read as one: the message names the file and the fix."""


def record_paths(shared_dir=None, quarantine_file=None, spares_file=None):
    """``{"quarantine_file", "spares_file"}``: the given paths, else the records' place in ``shared_dir``."""
    base = os.path.join(shared_dir or SHARED_DIR, RECORDS_DIR)
    return {"quarantine_file": quarantine_file or os.path.join(base, "quarantine.json"),
            "spares_file": spares_file or os.path.join(base, "spares.json")}


def path_problems(quarantine_file=None, spares_file=None):
    """``quarantine_file`` and ``spares_file`` set to a path that is not absolute: it is a path on the coordinator,
    where ``~`` would be another account's home for each module that reads or writes it."""
    return ["%s=%s is not an absolute path. Fix: the path of the file on the coordinator, from / (or leave %s out: "
            "<shared_dir_path>/%s/%s)" % (var, value, var, RECORDS_DIR, name)
            for var, value, name in (("quarantine_file", quarantine_file, "quarantine.json"),
                                     ("spares_file", spares_file, "spares.json"))
            if value not in (None, "") and not str(value).startswith("/")]


def _trusted(path):
    """``(directory, parts)``: the directory trusted as it is (the records' default place: the shared ``runs/``,
    which only root can replace; else the file's own directory) and the names from it to the file."""
    parent = os.path.dirname(path)
    if os.path.basename(parent) == os.path.basename(RECORDS_DIR):
        return os.path.dirname(parent), [os.path.basename(parent), os.path.basename(path)]
    return parent or ".", [os.path.basename(path)]


def _refused(path, what):
    return RecordError("%s is not a regular file (a symbolic link, a FIFO, a device or a directory on its way): the "
                       "%s is never read through it. Fix: remove it (rm %s); the next change writes it again" % (
                           path, what, path))


def _open(path, what):
    """A descriptor of the regular file ``path`` reached without a link, or None when it is missing."""
    base, parts = _trusted(path)
    try:
        fd = os.open(base, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = (os.O_RDONLY | os.O_NONBLOCK) if last else (os.O_RDONLY | _DIRECTORY)
            try:
                nxt = os.open(part, flags | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return None
                if exc.errno in _REFUSED:
                    raise _refused(path, what)
                raise
            os.close(fd)
            fd = nxt
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _refused(path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(path, what, limit=LIMIT):
    """The text of the record file ``path`` (None when it is missing); RecordError when it is a link or not a
    regular file, larger than ``limit``, or cannot be read."""
    try:
        fd = _open(path, what)
        if fd is None:
            return None
        try:
            data = os.read(fd, limit + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise RecordError("%s (the %s) cannot be read: %s. Fix: make it readable by the account that reads it on "
                          "the coordinator, or remove it" % (path, what, exc.strerror or exc))
    if len(data) > limit:
        raise RecordError("%s is larger than %d bytes, too large for a %s. Fix: remove it (every entry in it is "
                          "lost)" % (path, limit, what))
    return data.decode("utf-8", "replace")


def parse(text, path, key):
    """The entries under ``key`` of a record file's ``text``.  A file that is empty, not JSON, not a JSON object, or
    whose ``key`` is not an object is an error naming the file and the fix."""
    what, lost = RECORDS[key]
    try:
        data = json.loads(text)
        why = None if isinstance(data, dict) and isinstance(data.get(key, {}), dict) else (
            "not a JSON object with %s" % key)
    except ValueError as exc:
        data, why = None, "empty" if not text.strip() else "not JSON (%s)" % exc
    if why:
        raise RecordError("%s is not a %s: it is %s. Fix: repair it (a JSON object {\"%s\": {...}}, as the last run "
                          "wrote it), or remove it (%s)" % (path, what, why, key, lost))
    return data.get(key, {})


def read(path, key):
    """The entries under ``key`` of the record file at ``path`` (``{}`` when there is none); RecordError when it is
    not one (``read_text``, ``parse``)."""
    if not path:
        return {}
    text = read_text(path, RECORDS[key][0])
    return {} if text is None else parse(text, path, key)


def read_all(shared_dir=None, quarantine_file=None, spares_file=None):
    """Both records as the coordinator answers for the plan: the paths, ``quarantine`` and ``spares`` (their
    entries; empty when missing or damaged) and ``problems`` (a damaged one's error, with its fix)."""
    out = record_paths(shared_dir, quarantine_file, spares_file)
    out["problems"] = []
    for name, var, key in ANSWER:
        try:
            out[name] = read(out[var], key)
        except RecordError as exc:
            out[name] = {}
            out["problems"].append(str(exc))
    return out
