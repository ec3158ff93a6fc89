"""One rank: the run's program, started from files, never from a shell's command line.

``python -m multinode_ds.rank --run-dir D [--local_rank=N]``

DeepSpeed's launcher (``launch.py``, on every rank's node) starts this module in place of the program.  It reads

* ``D/program.json`` -- the program's argv after DeepSpeed's options (``["--module", "multinode_ds.train", ...]``
  for the bundled trainer, ``["/path/script.py", ARGS...]`` for a user's script), written by ``run_prepare``;
* ``D/rank.env`` -- the ranks' whole environment, ``KEY=VALUE`` lines, exactly as planned (``.deepspeed_env``
  holds only the values a shell reads as they are: with pdsh, each node's shell sources it);
* the run's secrets, when ``MULTINODE_DS_SECRET_ENV`` names them: a node-local JSON object, mode 0600, that the
  play wrote and the node's agent removes when the run ends;

and becomes the program as ``launch.py`` would have started it: ``python -u [-m] SCRIPT --local_rank=N ARGS``.
So no value of the user's (arguments, paths, variables, secrets) is ever part of a command that a shell reads,
and no secret is on a command line or in a file of the run directory.
"""
from __future__ import annotations

# Only what a rank's start needs: this module runs once per rank, before the program's own imports, so it loads no
# more than json (argparse for --help or a bad argument, the checkpoints module for a later attempt's resume).
import json
import os
import sys

PROGRAM_FILE = "program.json"
WORKDIR_VAR = "MULTINODE_DS_WORKDIR"
WORK_DIR = "work"
ENV_FILE = "rank.env"
# The variable naming the node-local file of the run's secrets (rank.env holds its path, never a secret).
SECRET_VAR = "MULTINODE_DS_SECRET_ENV"
# "1": the rank starts from the node's warm process when there is one (multinode_ds.warm; -e warm_start).
WARM_VAR = "MULTINODE_DS_WARM"
# How the rank started, in its own environment: "warm", or "cold" (and why, when warm was asked for).
START_VAR = "MULTINODE_DS_START"


def read_env_file(path) -> dict:
    """KEY=VALUE lines of a .deepspeed_env or rank.env file (``{}`` when there is none)."""
    env = {}
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return env
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key.strip()] = value
    return env


def read_secrets(path: str) -> dict:
    """The run's secrets: a JSON object of names to single-line values (``{}`` when there is no such file)."""
    if not path:
        return {}
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise SystemExit("multinode_ds.rank: cannot read the run's secrets (%s): %s" % (path, exc))
    return dict((str(k), str(v)) for k, v in data.items()) if isinstance(data, dict) else {}


def program_argv(python: str, program: list, local_rank) -> list:
    """DeepSpeed's launch.py: ``python -u [-m] SCRIPT --local_rank=N ARGS`` (``--module X`` -> ``-m X``)."""
    program = list(program)
    if program and program[0] == "--module":
        return [python, "-u", "-m", program[1], "--local_rank=%s" % local_rank] + program[2:]
    return [python, "-u", program[0], "--local_rank=%s" % local_rank] + program[1:]


def resume_tag(env: dict) -> str:
    """The whole checkpoint a later attempt of the run loads (``MULTINODE_DS_RESUME_TAG``): the newest whole tag of
    ``MULTINODE_DS_CHECKPOINT_DIR`` (multinode_ds.checkpoints.choose, the bundled trainer's choice), "" on the first
    attempt or when there is none.  Every rank reads the same shared directory, so they agree."""
    if str(env.get("MULTINODE_DS_ATTEMPT") or "1") == "1" or not env.get("MULTINODE_DS_CHECKPOINT_DIR"):
        return ""
    # A later attempt only: the first attempt's ranks never load the checkpoints module.
    from multinode_ds import checkpoints  # pylint: disable=import-outside-toplevel
    try:
        return checkpoints.choose(env["MULTINODE_DS_CHECKPOINT_DIR"])["tag"]
    except checkpoints.CheckpointError:
        return ""


def rank_environment(run_dir, base: dict, extra: dict | None = None, secrets_out: dict | None = None) -> dict:
    """``base`` (the launcher's environment), then ``rank.env``, then ``extra`` (what the launcher gives this
    rank: RANK, LOCAL_RANK...), then the secrets (also into ``secrets_out``, when given); and the checkpoint a
    later attempt resumes from."""
    env = dict(base)
    env.update(read_env_file(os.path.join(run_dir, ENV_FILE)))
    env.update(extra or {})
    secrets = read_secrets(env.get(SECRET_VAR, ""))
    env.update(secrets)
    if secrets_out is not None:
        secrets_out.update(secrets)
    env["MULTINODE_DS_RESUME_TAG"] = resume_tag(env)
    return env


def read_program(run_dir) -> list:
    path = os.path.join(run_dir, PROGRAM_FILE)
    try:
        with open(path) as fh:
            program = json.load(fh)
    except (OSError, ValueError) as exc:
        raise SystemExit("multinode_ds.rank: cannot read the program to start (%s): %s" % (path, exc))
    if not isinstance(program, list) or not program or not all(isinstance(a, str) for a in program):
        raise SystemExit("multinode_ds.rank: %s is not a list of arguments" % path)
    return program


def become(run_dir, local_rank, extra: dict | None = None):
    """Replace this process by the rank's program (the PID stays: the launcher waits on it)."""
    program = read_program(run_dir)
    secrets = {}
    env = rank_environment(run_dir, os.environ, extra, secrets_out=secrets)
    argv = program_argv(sys.executable, program, local_rank)
    # A script shipped with -e workdir runs in its attempt's work/: a link to each top entry of the read-only
    # workspace (its data/ as on the controller; its imports come from the script's own directory, the workspace)
    # beside what it writes, collected with the run (plugins/module_utils/plan/workdir.py WORK_DIR).
    cwd = os.path.join(run_dir, WORK_DIR) if env.get(WORKDIR_VAR) else run_dir
    if env.get(WARM_VAR) == "1":
        # The rank forked from the node's warm process (torch, DeepSpeed and transformers imported once per node):
        # this process waits for it, passing on its signals, and ends as it ended.
        from multinode_ds import warm  # pylint: disable=import-outside-toplevel
        try:
            warm.end_like(warm.run(argv, dict(env, **{START_VAR: "warm"}), cwd, secrets=tuple(secrets)))
        except warm.Refused as exc:
            env[START_VAR] = "cold: %s" % exc
            sys.stderr.write("multinode_ds.rank: rank %s starts cold: %s\n" % (env.get("RANK", local_rank), exc))
            sys.stderr.flush()
    else:
        env[START_VAR] = "cold"
    os.chdir(cwd)
    os.execvpe(argv[0], argv, env)


def options(argv, names: dict):
    """``{dest: value}`` from ``argv`` when it holds only the options of ``names`` (option -> dest), each as
    ``--opt value`` or ``--opt=value``; None for anything else (``--help``, an unknown option, a missing value),
    which the caller hands to argparse for its usage and error message.  No argparse on a rank's way to its
    program."""
    out, i = {}, 0
    while i < len(argv):
        opt, eq, value = argv[i].partition("=")
        if opt not in names or (not eq and i + 1 >= len(argv)):
            return None
        if not eq:
            i += 1
            value = argv[i]
        out[names[opt]] = value
        i += 1
    return out


def parse_args(argv=None):
    """``{"run_dir", "local_rank"}`` from ``--run-dir D [--local_rank=N]`` (``--local-rank`` too); anything else goes
    to argparse, for its usage and error message."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = options(argv, {"--run-dir": "run_dir", "--local_rank": "local_rank", "--local-rank": "local_rank"})
    if out is not None and out.get("run_dir"):
        return {"run_dir": out["run_dir"], "local_rank": out.get("local_rank")}
    # Usage and errors only: a good command line never loads argparse.
    import argparse  # pylint: disable=import-outside-toplevel
    p = argparse.ArgumentParser(prog="python -m multinode_ds.rank", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", default=None)
    return vars(p.parse_args(argv))


def main(argv=None) -> int:
    args = parse_args(argv)
    local_rank = args["local_rank"] if args["local_rank"] is not None else os.environ.get("LOCAL_RANK", "0")
    become(args["run_dir"], local_rank)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
