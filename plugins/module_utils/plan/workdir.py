# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The user's working directory: what of it goes to the nodes, how big it is and what it is (issue 23).

``plan(root, entrypoint, excludes, max_mb, cwd, include_secrets, allow_private)`` checks the directory and the
entrypoint and returns the files to ship (git's view when the directory is in a git work tree: tracked and
untracked-but-not-ignored files, so .gitignore is respected; else every file but ``.git/``), less
``workdir_exclude``'s patterns and the files that hold secrets by their names (``SECRET_PATTERNS``, unless
``workdir_include_secrets`` names them), their size, a hash of paths, executable bits and contents (not mtimes), the
commit they came from, and the ``--files-from`` list rsync (``ansible.posix.synchronize``) ships them with.

Refused before any file is listed: the whole filesystem, the controller user's home directory (or a directory that
holds it), and any directory with ``.ssh/`` at its top.  Refused after: a file or directory no one but its owner may
read on the controller (mode 0600, 0700), unless ``workdir_allow_private``.

Pure Python, stdlib only, no Ansible import: runs on the controller and is unit-tested there.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import hashlib
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess

MIB = 1024 * 1024
BIGGEST = 5
CHUNK = 1024 * 1024
# Git's variables that would point it at another repository than the workdir's.
GIT_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")
# Files that hold secrets by their names, left out even when git tracks them (a committed .env is still a secret):
# GitHub's gitignore templates (.env, .env.*, *.pem, *.key, *.p12, .pypirc), direnv's .envrc, the credential
# stores of the usual command-line tools (ssh, gpg, aws, az, kubectl, docker, git, npm, psql, mysql, netrc: also
# wandb's), key stores.
SECRET_PATTERNS = (
    ".env", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk", "*.kdbx",
    ".envrc", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    ".ssh/", ".gnupg/", ".aws/", ".azure/", ".kube/", ".docker/",
    ".netrc", "_netrc", ".git-credentials", ".pypirc", ".npmrc", ".pgpass", ".my.cnf", ".vault_pass*",
    "credentials.json", "kubeconfig")
# .env.* is a secret (.env.local, .env.production), but not the templates projects commit beside it.
SECRET_ENV_GLOB = ".env.*"
SECRET_ENV_TEMPLATES = (".env.example", ".env.sample", ".env.template", ".env.dist")
# How many names an error or a warning lists before "and N more".
NAMED = 5
# The ranks' working directory, under each attempt's run directory (multinode_ds/rank.py starts them there): a link
# to each top entry of the workspace, so the script reads its files as on the controller, beside what the ranks
# write, which is collected with the run. The workspace itself is read-only (``seal``).
WORK_DIR = "work"


class WorkdirError(ValueError):
    """A workdir that cannot be shipped; the message names the variable and the fix."""


def _git(root, *args):
    """(returncode, stdout bytes, stderr text) of ``git -C root args``; returncode None when git is not installed."""
    env = dict((k, v) for k, v in os.environ.items() if k not in GIT_ENV)
    try:
        proc = subprocess.Popen(["git", "-C", root] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env)
    except OSError as e:
        return None, b"", str(e)
    out, err = proc.communicate()
    return proc.returncode, out, err.decode("utf-8", "replace").strip()


def _inside_git(root):
    """Whether ``root`` is in a git work tree.  A repository git cannot read (git not installed, a repository
    another user owns) is an error: walking the tree instead would ship what .gitignore leaves out."""
    rc, out, err = _git(root, "rev-parse", "--is-inside-work-tree")
    if rc == 0:
        return out.strip() == b"true"
    if "safe.directory" in err:
        raise WorkdirError("workdir %s is in a git repository another user owns, and git refuses it (%s). Fix: mark "
                           "it safe (git config --global --add safe.directory <the repository>)" % (root, err))
    if rc is None and _git_above(root):
        raise WorkdirError("workdir %s is in the git repository %s, and git cannot read it (%s). Fix: install git on "
                           "the controller" % (root, _git_above(root), err))
    return False


def _git_above(root):
    """The nearest directory at or above ``root`` that has a ``.git``; None when there is none."""
    here = os.path.realpath(root)
    while not os.path.exists(os.path.join(here, ".git")):
        if os.path.dirname(here) == here:
            return None
        here = os.path.dirname(here)
    return here


def _git_files(root):
    rc, out, err = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if rc != 0:
        raise WorkdirError("workdir %s: git ls-files failed: %s" % (root, err))
    return [os.fsdecode(p).rstrip("/") for p in out.split(b"\0") if p]


def _walk(root, top=""):
    """Every file and symlink under ``root/top`` (a symlink to a directory is a link, not followed), but ``.git``."""
    out = []
    for here, dirs, names in os.walk(os.path.join(root, top) if top else root):
        rel = os.path.relpath(here, root)
        rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        links = [d for d in dirs if os.path.islink(os.path.join(here, d))]
        dirs[:] = sorted(d for d in dirs if d != ".git" and d not in links)
        out += [rel + n for n in names + links if n != ".git"]
    return out


def _expand(root, paths):
    """git's entries as files: a directory git lists (a submodule, an untracked nested repository) is walked; an
    entry deleted from the tree but still in the index is dropped."""
    out = []
    for path in paths:
        full = os.path.join(root, path)
        if os.path.isdir(full) and not os.path.islink(full):
            out += _walk(root, path)
        elif os.path.lexists(full):
            out.append(path)
    return out


def excluded(path, patterns):
    """Whether the relative ``path`` matches one of ``patterns`` (rsync's simple patterns, fnmatch globs): a
    pattern without ``/`` matches any component (``*.pt``, ``__pycache__``); one with ``/`` inside, or a leading
    ``/``, the path from the root (``data/raw``, ``/out``), and with it everything below; a trailing ``/`` only a
    directory (``logs/``)."""
    parts = path.split("/")
    dirs = ["/".join(parts[:i]) for i in range(1, len(parts))]
    for pattern in patterns or ():
        directory_only = pattern.endswith("/")
        glob = pattern.rstrip("/")
        if "/" in glob:
            candidates = dirs + ([] if directory_only else [path])
            glob = glob.lstrip("/")
        else:
            candidates = parts[:-1] + ([] if directory_only else parts[-1:])
        if glob and any(fnmatch.fnmatchcase(c, glob) for c in candidates):
            return True
    return False


def _check_link(root, path):
    full = os.path.join(root, path)
    target = os.path.realpath(full)
    real_root = os.path.realpath(root)
    if target != real_root and not target.startswith(real_root.rstrip(os.sep) + os.sep):
        raise WorkdirError("workdir %s: %s is a symlink to %s, outside the workdir: it would arrive on the nodes as a "
                           "link to nothing. Fix: copy what it points to into the workdir, or add %s to "
                           "workdir_exclude" % (root, path, os.readlink(full), path))


def _check_name(root, path):
    if "\n" in path or "\r" in path:
        raise WorkdirError("workdir %s: the file name %r has a line break, which rsync's file list cannot carry. "
                           "Fix: rename it, or add it to workdir_exclude" % (root, path))


def secret(path, include=()):
    """Whether the relative ``path`` holds a secret by its name (``SECRET_PATTERNS``, ``.env.*`` but its templates)
    and ``include`` (``workdir_include_secrets``'s patterns, as ``excluded`` reads them) does not ship it anyway."""
    if excluded(path, include):
        return False
    name = path.rsplit("/", 1)[-1]
    if fnmatch.fnmatchcase(name, SECRET_ENV_GLOB) and name not in SECRET_ENV_TEMPLATES:
        return True
    return excluded(path, SECRET_PATTERNS)


def listing(root, excludes=(), include=()):
    """``(files, secrets)``: the sorted relative paths (``/``-separated) of the files and symlinks to ship from the
    directory ``root``, and those left out because they hold secrets (``secret``).  A symlink is shipped as a link;
    one that leads out of ``root`` is an error naming it."""
    if _inside_git(root):
        paths = _expand(root, _git_files(root))
    else:
        paths = _walk(root)
    paths = sorted(set(p for p in paths if not excluded(p, excludes)))
    secrets = [p for p in paths if secret(p, include)]
    files = [p for p in paths if not secret(p, include)]
    for path in files:
        _check_name(root, path)
        mode = os.lstat(os.path.join(root, path)).st_mode
        if stat.S_ISLNK(mode):
            _check_link(root, path)
        elif not stat.S_ISREG(mode):
            _check_kind(root, path, mode)
    return files, secrets


def _check_kind(root, path, mode):
    """A WorkdirError for what is neither a file nor a link (a FIFO would hang the hash, a device or a socket would be
    read or copied as one)."""
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    raise WorkdirError("workdir %s: %s is %s: only files, directories and symlinks ship. Fix: remove it, or add %s to "
                       "workdir_exclude" % (root, path, kind, path))


def list_files(root, excludes=(), include=()):
    """The files and symlinks to ship from ``root`` (``listing``'s first half)."""
    return listing(root, excludes, include)[0]


def named(paths):
    """``a, b, c`` for a person: the first ``NAMED`` of ``paths``, then how many more."""
    more = len(paths) - NAMED
    return ", ".join(paths[:NAMED]) + (" and %d more" % more if more > 0 else "")


def secrets_line(shipped):
    """The warning for the files a workdir's plan left out as secrets (``secrets_left_out``); None when none was."""
    left = (shipped or {}).get("secrets_left_out") or []
    if not left:
        return None
    return ("workdir: %d file(s) left out because their names say they hold secrets: %s. The ranks get secrets from "
            "secret_env (node-local, mode 0600); to ship such a file anyway: -e workdir_include_secrets=<pattern>"
            % (len(left), named(left)))


def private(root, files):
    """The shipped files, and the directories in the workdir above them, that neither the group nor others may read
    on the controller (mode 0600, 0700): sorted, a directory with a trailing ``/``.  Symlinks are not judged (a
    link's own mode means nothing; its target, in the workdir, is)."""
    dirs = set()
    for path in files:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    out = []
    for path in sorted(dirs) + list(files):
        info = os.lstat(os.path.join(root, path))
        if not stat.S_ISLNK(info.st_mode) and not info.st_mode & 0o044:
            out.append(path + "/" if stat.S_ISDIR(info.st_mode) else path)
    return sorted(out)


def check_private(root, files, allow):
    """A WorkdirError naming the private files (``private``) unless ``allow`` (``workdir_allow_private``)."""
    found = [] if allow else private(root, files)
    if found:
        raise WorkdirError("workdir %s: %s can be read only by its owner on the controller (no read bit for group or "
                           "others), so it looks private; on the cluster the run's account (every run's code) could "
                           "read it. Fix: leave it out (workdir_exclude or .gitignore), or ship it anyway with -e "
                           "workdir_allow_private=true (chmod go+r also says it is not private)" % (root, named(found)))


def home_directories():
    """The controller user's home directory, as $HOME and as the password database give it (real paths)."""
    homes = set([os.path.realpath(os.path.expanduser("~"))])
    try:
        homes.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    return homes


def refuse_broad(path, given):
    """A WorkdirError when the directory ``path`` (``given``: as the user wrote it) is the whole filesystem, the
    controller user's home directory or a directory above it, or holds ``.ssh/``: checked before any file is
    listed (walking ``/`` would take minutes and end on /proc)."""
    real = os.path.realpath(path)
    fix = "Fix: give the directory of your project, e.g. -e workdir=~/myproject"
    if os.path.dirname(real) == real:
        raise WorkdirError("workdir=%s is the whole filesystem (%s): everything readable there would be copied to the "
                           "cluster. %s" % (given, real, fix))
    for home in sorted(home_directories()):
        if home == real or home.startswith(real.rstrip(os.sep) + os.sep):
            raise WorkdirError("workdir=%s (%s) %s your home directory %s, with its keys and credentials: they would "
                               "be copied to the cluster. %s" % (
                                   given, real, "is" if home == real else "holds", home, fix))
    if os.path.isdir(os.path.join(real, ".ssh")):
        raise WorkdirError("workdir=%s (%s) holds .ssh/, as a home directory does: its keys would be on the cluster's "
                           "shared directory. %s" % (given, real, fix))


def _feed(sha, full):
    """The content of the regular file ``full`` into ``sha``: opened without following a link or waiting on a FIFO
    (one that took a listed file's place since), refused when it is anything else."""
    fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WorkdirError("%s is not a regular file any more: the workdir changed while it was read. Fix: run "
                               "again once it is still" % full)
        for block in iter(lambda: handle.read(CHUNK), b""):
            sha.update(block)


def digest(root, files):
    """sha256 (hex) of each file's relative path, kind (file the owner may execute, plain file, symlink), size and
    content (a symlink: its target), in order: the same tree gives the same hash whatever the mtimes and the
    group's and others' bits."""
    sha = hashlib.sha256()
    for path in files:
        full = os.path.join(root, path)
        info = os.lstat(full)
        sha.update(path.encode("utf-8", "surrogateescape") + b"\0")
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(full).encode("utf-8", "surrogateescape")
            sha.update(b"l%d\0" % len(target) + target)
            continue
        # The owner's execute bit, as git reads it: the workspace keeps only the owner's bits (rsync --chmod=go-rwx).
        sha.update(b"%s%d\0" % (b"x" if info.st_mode & stat.S_IXUSR else b"f", info.st_size))
        _feed(sha, full)
    return sha.hexdigest()


def planned_files(text):
    """The relative paths of a ``files_from`` list (``./`` taken off each line)."""
    return [line[2:] if line.startswith("./") else line for line in (text or "").split("\n") if line]


def tree(dest):
    """The sorted relative paths of every file and symlink under ``dest`` but ``.git`` (a copy, on a node)."""
    return sorted(_walk(dest))


def verify(dest, expected, planned=None):
    """None when the tree at ``dest`` (every file and symlink but ``.git``, as ``_walk`` lists them) hashes to
    ``expected`` (the plan's ``hash``), else the sentence saying how it differs: with ``planned`` (the plan's file
    list), the files missing there and the ones there but not planned, or that the files are the planned ones
    with another content (a file changed on the controller between the plan and the copy)."""
    found = tree(dest)
    there = digest(dest, found)
    if there == expected:
        return None
    why = ""
    if planned is not None:
        missing, extra = sorted(set(planned) - set(found)), sorted(set(found) - set(planned))
        parts = (["missing: %s" % named(missing)] if missing else []) + (
            ["not planned: %s" % named(extra)] if extra else [])
        why = ": " + "; ".join(parts) if parts else (
            ": the files are the planned ones, with another content or kind (changed on the controller since the "
            "plan read them?)")
    return "the copy in %s is not the content the plan hashed (%s planned, %s there%s)" % (
        dest, short_id(expected), short_id(there), why)


def seal(dest):
    """Make the copy at ``dest`` read-only, its owner's read and execute bits kept: directories 0500, files 0400
    (0500 when the owner may execute them); symlinks stay as they are. Ranks run as the owner: what they write
    into it by accident (outputs, caches) fails instead of changing the content that later runs reuse by hash."""
    for here, dirs, names in os.walk(dest):
        for name in dirs + names:
            full = os.path.join(here, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISDIR(mode):
                os.chmod(full, 0o500)
            elif stat.S_ISREG(mode):
                os.chmod(full, stat.S_IMODE(mode) & 0o500)
    os.chmod(dest, 0o500)


def remove(dest):
    """Remove the copy at ``dest``, sealed or not (its directories made writable first): a workspace that is no
    longer the content its marker names is copied again from nothing."""
    if not os.path.isdir(dest) or os.path.islink(dest):
        return
    os.chmod(dest, 0o700)
    for here, dirs, _names in os.walk(dest):
        for name in dirs:
            full = os.path.join(here, name)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(dest)


def top_names(files):
    """The workspace's top entries (each file's first path component), sorted: the links of ``WORK_DIR``."""
    return sorted(set(f.split("/", 1)[0] for f in files))


def pull_excludes(names):
    """The pull's rsync options that leave out the links of the ranks' working directory (``WORK_DIR/<name>`` for
    each of ``names``): they lead into the workspace, which the controller has. Each is quoted for the shell split
    ``ansible.posix.synchronize`` gives its command line, and a name with a wildcard has its wildcards escaped (rsync
    reads a backslash as an escape only in a pattern with a wildcard)."""
    out = []
    for name in names:
        if re.search(r"[*?\[]", name):
            name = re.sub(r"([*?\[\\])", r"\\\1", name)
        out.append(shlex.quote("--exclude=/%s/%s" % (WORK_DIR, name)))
    return out


def short_id(hexdigest):
    """The hash's first 16 hex digits: what a run records and a person reads."""
    return hexdigest[:16]


def sizes(root, files):
    """Bytes per top-level entry (``data/`` for a directory, ``model.bin`` for a file) of ``files``."""
    out = {}
    for path in files:
        first, _sep, rest = path.partition("/")
        key = first + "/" if rest else first
        out[key] = out.get(key, 0) + os.lstat(os.path.join(root, path)).st_size
    return out


def human(size):
    """``812.4 MiB``, ``3.0 KiB``, ``15 B``."""
    if size >= MIB // 10:
        return "%.1f MiB" % (size / MIB)
    return "%.1f KiB" % (size / 1024) if size >= 1024 else "%d B" % size


def size_report(root, files, max_mb):
    """The files' total bytes; over ``max_mb`` MiB (None: no limit), a WorkdirError naming the biggest entries."""
    by_entry = sizes(root, files)
    total = sum(by_entry.values())
    if max_mb is None or total <= max_mb * MIB:
        return total
    biggest = sorted(by_entry.items(), key=lambda kv: (-kv[1], kv[0]))
    named = ", ".join("%s (%s)" % (name, human(size)) for name, size in biggest[:BIGGEST])
    more = ", …" if len(biggest) > BIGGEST else ""
    raise WorkdirError("workdir %s is %s, over workdir_max_mb=%g: the biggest entries are %s%s — add them to "
                       ".gitignore or workdir_exclude, or raise workdir_max_mb" % (
                           root, human(total), max_mb, named, more))


def git_info(root):
    """``{"commit", "dirty", "branch"}`` of the git work tree ``root`` is in: the HEAD commit (None before the first
    commit), whether the workdir's part of the tree differs from it (changed or untracked-not-ignored files), the
    branch (None when detached); all None outside git."""
    if not _inside_git(root):
        return {"commit": None, "dirty": None, "branch": None}
    rc, head, _err = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    commit = head.decode().strip() if rc == 0 else None
    rc, branch, _err = _git(root, "symbolic-ref", "--short", "-q", "HEAD")
    rc_status, status, err = _git(root, "status", "--porcelain", "-z", "--", ".")
    if rc_status != 0:
        raise WorkdirError("workdir %s: git status failed: %s" % (root, err))
    return {"commit": commit, "dirty": bool(status.strip(b"\0")),
            "branch": branch.decode().strip() if rc == 0 else None}


def validate(root, entrypoint, cwd, files=None, secrets=()):
    """``(absolute root, entrypoint relative to it or None)``: ``root`` (relative to ``cwd``, where
    ansible-playbook runs) must be a directory, ``entrypoint`` (relative to the workdir, or absolute) a file inside
    it; with ``files`` (list_files's answer), one of those shipped (``secrets``: the files left out as secrets).
    The whole filesystem, the home directory and a directory holding ``.ssh/`` are refused (``refuse_broad``)."""
    if not root:
        raise WorkdirError("workdir is empty. Fix: give the directory to ship, e.g. -e workdir=.")
    path = os.path.normpath(os.path.join(cwd, os.path.expanduser(str(root))))
    if not os.path.exists(path):
        raise WorkdirError("workdir=%s does not exist (looked for %s; a relative path is taken from %s, where "
                           "ansible-playbook runs). Fix: give an existing directory" % (root, path, cwd))
    if not os.path.isdir(path):
        raise WorkdirError("workdir=%s is a file, not a directory. Fix: give the directory that holds it, e.g. "
                           "-e workdir=%s -e entrypoint=%s" % (root, os.path.dirname(path), os.path.basename(path)))
    refuse_broad(path, root)
    if not entrypoint:
        return path, None
    return path, _entrypoint(path, str(entrypoint), files, secrets)


def _entrypoint(root, entrypoint, files, secrets=()):
    rel = os.path.relpath(os.path.normpath(os.path.join(root, entrypoint)), root).replace(os.sep, "/")
    if rel == "." or rel == ".." or rel.startswith("../"):
        raise WorkdirError("entrypoint=%s is outside workdir %s: the nodes get only the workdir. Fix: give the "
                           "script's path inside the workdir (relative to it), or a workdir that holds the script"
                           % (entrypoint, root))
    full = os.path.join(root, rel)
    if not os.path.isfile(full):
        raise WorkdirError("entrypoint=%s is not a file in workdir %s (looked for %s). Fix: give the script's path "
                           "relative to the workdir" % (entrypoint, root, full))
    if files is not None and rel not in files:
        if rel in secrets:
            raise WorkdirError("entrypoint=%s is in workdir %s but not shipped: its name says it holds a secret. Fix: "
                               "rename it, or ship it with -e workdir_include_secrets=%s" % (entrypoint, root, rel))
        raise WorkdirError("entrypoint=%s is in workdir %s but not shipped: .gitignore or workdir_exclude leaves it "
                           "out. Fix: commit it or take it out of .gitignore, or out of workdir_exclude"
                           % (entrypoint, root))
    return rel


def files_from(files):
    """rsync's ``--files-from`` list of ``files``, one a line, each as ``./<path>``: rsync takes a line that starts
    with ``#`` or ``;`` for a comment (also with ``--from0``), and ``./`` (where the relative path starts, for
    ``--relative``) makes it read every name as it is."""
    return "".join("./" + f + "\n" for f in files)


def plan(root, entrypoint, excludes, max_mb, cwd, include_secrets=(), allow_private=False):
    """What ships of the workdir: ``{"root", "files", "count", "bytes", "hash", "id", "git", "entrypoint",
    "files_from", "secrets_left_out"}`` (``files_from``: the files one per line as ``files_from`` writes them, for
    rsync's ``--files-from`` with ``root`` as the source; ``secrets_left_out``: the files left out because their names say they hold secrets)."""
    path, _rel = validate(root, entrypoint, cwd)
    files, secrets = listing(path, excludes, include_secrets)
    if not files:
        raise WorkdirError("workdir %s has no file to ship: .gitignore or workdir_exclude leaves every one out. Fix: "
                           "give the directory that holds your code, or narrow workdir_exclude" % path)
    _path, rel = validate(path, entrypoint, path, files, secrets)
    check_private(path, files, allow_private)
    total = size_report(path, files, max_mb)
    hexdigest = digest(path, files)
    return {"root": path, "files": files, "count": len(files), "bytes": total, "hash": hexdigest,
            "id": short_id(hexdigest), "git": git_info(path), "entrypoint": rel, "top": top_names(files),
            "files_from": files_from(files), "secrets_left_out": secrets}
