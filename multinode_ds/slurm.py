"""The Slurm backend's node side: submit and follow the run's batch job.

``python -m multinode_ds.slurm job --run-dir D``
    On the coordinator (started by the run's agent): ``sbatch --parsable D/slurm/job.sbatch``, then follow the
    job with ``scontrol`` until it ends.  It writes ``D/scheduler.json`` (job id, state, exit code, elapsed,
    nodes: from ``sacct`` when the cluster keeps accounting, else from ``scontrol``).  When a node of the job
    goes DOWN (or the job ends NODE_FAIL), or a rank fails, it writes the cause to ``D/control/ABORT`` (the
    watch and every agent read it).  SIGTERM or SIGINT (the agent stopping the run: Ctrl-C on the controller,
    the run's timeout, a stale lease) runs ``scancel``.  Exits 0 only when the job COMPLETED with exit code 0.

Each rank, under srun, is ``python -m multinode_ds.slurm_rank`` (a module of its own: it loads only what a rank's
start needs).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from multinode_ds.agent import MARKER, write_json

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE")
# srun's words for a task ended by a signal -> the exit code DeepSpeed's launcher reports for it (-signal).
SIGNALS = {"Killed": -9, "Terminated": -15, "Segmentation fault": -11, "Aborted": -6, "Bus error": -7,
           "Floating point exception": -8, "Hangup": -1, "Interrupt": -2, "User defined signal 1": -10}


# --------------------------------------------------------------------------- the job

# Reasons a PENDING job will not start by waiting (a requested node is DOWN or DRAINED, the partition is down).
UNSATISFIABLE = ("ReqNodeNotAvail", "NodeDown", "PartitionDown", "PartitionInactive", "PartitionNodeLimit",
                 "BadConstraints", "PartitionConfig", "InvalidAccount", "InvalidQOS")


# A job in these states waits in the queue: the watch counts neither its start nor its startup allowance yet.
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED")
# What to do about a job that waits, by the reason Slurm gives (the first that the reason contains).
QUEUE_FIXES = (
    ("JobHeld", "the job is held: scontrol release {job}"),
    ("Resources", "the partition's nodes are busy with other jobs (squeue -p {partition}): wait for them, free "
                  "them, or give the run more time with -e queue_timeout=SECONDS"),
    ("Priority", "jobs with a higher priority come first (sprio; squeue -p {partition}): wait, or give the run "
                 "more time with -e queue_timeout=SECONDS"),
    ("Reservation", "a reservation holds the nodes (scontrol show reservation)"),
    ("Dependency", "the job waits for another job (scontrol show job {job}: Dependency)"),
    ("QOS", "a limit of the job's QOS or account (sacctmgr show qos; squeue -j {job} -o %r)"),
    ("Assoc", "a limit of the job's account (sacctmgr show assoc)"),
)


def queue_fix(reason, job_id, partition=None) -> str:
    """What to do about job ``job_id`` that waits in the queue for ``reason``."""
    for word, fix in QUEUE_FIXES:
        if word in (reason or ""):
            return fix.format(job=job_id, partition=partition or "<partition>")
    return "see why Slurm keeps it waiting: scontrol show job %s (Reason), sinfo -p %s" % (
        job_id, partition or "<partition>")


def queue_record(job_id, info: dict, submitted: float, started=None) -> dict:
    """The run's queue record (``control/queue.json``) from the job's ``scontrol show job`` fields: ``queued``
    while it waits (Slurm's state and reason, since ``submitted``, what to do), else ``started`` (at ``started``,
    when the job was first seen running)."""
    state = info.get("JobState") or "PENDING"
    if state in QUEUED and started is None:
        reason = info.get("Reason")
        reason = None if reason in (None, "", "None", "(null)") else reason
        return {"state": "queued", "label": state, "reason": reason, "job_id": job_id, "since": submitted,
                "fix": queue_fix(reason, job_id, info.get("Partition"))}
    return {"state": "started", "label": state, "job_id": job_id, "since": submitted, "started": started}


def run(argv, timeout=30, detached=False):
    """A Slurm command.  ``detached``: in a session of its own and without the run's marker, so that the agent
    stopping the run's processes (by process group and by marker) does not cut it short."""
    env = None
    if detached:
        env = dict((k, v) for k, v in os.environ.items() if k != MARKER)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=detached)
    except OSError as exc:
        return 1, "", str(exc)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        if not detached:
            proc.kill()
        return 1, "", "%s did not answer within %ss" % (argv[0], timeout)


def say(msg: str) -> None:
    print("multinode_ds.slurm: %s" % msg, flush=True)


def parse_scontrol(text: str) -> dict:
    info = {}
    for token in re.split(r"\s+(?=[A-Za-z:/]+=)", (text or "").strip()):
        key, sep, value = token.partition("=")
        if sep:
            info[key] = value
    return info


def scontrol_job(job_id: str):
    """(the job's Key=Value record, or {}; whether Slurm no longer knows the job)."""
    rc, out, err = run(["scontrol", "show", "job", "-o", job_id])
    if rc == 0:
        return parse_scontrol(out), False
    return {}, "Invalid job id" in (err or "")


def bad_node_state(state: str) -> bool:
    """sinfo's %T: DOWN or FAIL, or a '*' suffix (not responding).  Not DRAIN, DRAINING or FAILING: running jobs
    are meant to finish there."""
    base = re.sub(r"[*~#!%$@^+-]+$", "", state.strip()).lower()
    return base in ("down", "fail") or state.strip().endswith("*")


def node_states(nodelist: str) -> dict:
    rc, out, _err = run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N|%T|%E"])
    states = {}
    if rc == 0:
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) >= 2:
                states[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return states


def abort(run_dir: Path, reason: str, host: str, **extra) -> None:
    """The run's ABORT record (first writer wins), as the agents write it."""
    path = run_dir / "control" / "ABORT"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        json.dump(dict(reason=reason, host=host, time=time.time(), **extra), fh)


def srun_failures(text: str) -> list:
    """srun's lines on failed tasks, the cause first: [(node, tasks, exit code or None, what)].  Lines after
    srun's "Terminating StepId" (the tasks --kill-on-bad-exit ended) come after every line before it."""
    pat = re.compile(r"srun: error: (\S+): tasks? ([0-9,\-]+): (Exited with exit code (\d+)|.*)$")
    first, then = [], []
    seen_stop = False
    for line in text.splitlines():
        if "Terminating StepId" in line or "Force Terminated" in line:
            seen_stop = True
        m = pat.search(line.strip())
        if m:
            code = int(m.group(4)) if m.group(4) else SIGNALS.get(m.group(3).strip())
            (then if seen_stop else first).append((m.group(1), m.group(2), code, m.group(3)))
    return first + then


def node_failures(text: str) -> list:
    """srun's "Node failure on X" lines -> [X]."""
    return re.findall(r"srun: error: Node failure on (\S+)", text)


class Job:
    def __init__(self, args):
        self.run_dir = Path(args.run_dir)
        self.script = self.run_dir / "slurm" / "job.sbatch"
        self.host = args.host or os.uname().nodename
        self.poll = args.poll
        self.job_id = None
        self.state = None
        self.info = {}
        self.nodelist = None
        self.stopping = None
        self.submitting = False
        self.submitted = time.time()
        self.started = None
        self.queue = None
        try:
            self.names = json.loads((self.run_dir / "slurm" / "names.json").read_text())
        except (OSError, ValueError):
            self.names = {}

    def name(self, node: str) -> str:
        """The inventory's name for a Slurm node (the batch script uses Slurm's)."""
        return self.names.get(node, node)

    def record(self, final=False, tries=40) -> dict:
        rec = {"name": "slurm", "job_id": self.job_id, "state": self.info.get("JobState", self.state or "PENDING"),
               "exit_code": self.info.get("ExitCode"), "elapsed": self.info.get("RunTime"),
               "nodes": self.info.get("NodeList") or self.nodelist, "partition": self.info.get("Partition"),
               "reason": self.info.get("Reason"), "source": "scontrol"}
        if final and self.job_id:
            for _try in range(tries):  # accounting is written a moment after the job ends
                rc, out, _err = run(["sacct", "-n", "-P", "-X", "-j", self.job_id, "-o",
                                     "JobID,JobName,Partition,State,ExitCode,Elapsed,NodeList,Start,End"])
                rows = [line.split("|") for line in out.splitlines() if line.startswith(self.job_id + "|")]
                if rc == 0 and rows and rows[0][3].split()[0] in TERMINAL:
                    r = rows[0]
                    rec.update(state=r[3].split()[0], exit_code=r[4], elapsed=r[5], nodes=r[6], partition=r[2],
                               start=r[7], end=r[8], source="sacct")
                    break
                if rc != 0:
                    rec["sacct"] = (_err or out).strip()[:300]
                    break
                time.sleep(0.25)
        write_json(self.run_dir / "scheduler.json", rec)
        return rec

    def note_queue(self) -> None:
        """``control/queue.json`` (what run_status reports and the watch reads), when it changed: whether the
        job waits in the queue, and why, or when it started."""
        state = self.info.get("JobState") or "PENDING"
        if self.started is None and state not in QUEUED:
            self.started = time.time()
        rec = queue_record(self.job_id, self.info, self.submitted, self.started)
        if rec != self.queue:
            try:
                write_json(self.run_dir / "control" / "queue.json", rec)
                self.queue = rec
            except OSError as exc:
                say("could not write control/queue.json: %s" % exc)

    def cancel(self, why: str) -> None:
        """scancel, detached from the run (the agent's SIGKILL of the run's processes does not stop it)."""
        if self.job_id and not getattr(self, "cancelled", False):
            self.cancelled = True
            say("scancel %s: %s" % (self.job_id, why))
            run(["scancel", self.job_id], timeout=5, detached=True)
        self.stopping = self.stopping or why

    def on_signal(self, signum, _frame):
        # The agent signals the process group and each of the run's processes: a second SIGTERM must not cut
        # the scancel short.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        why = "the run was stopped (%s)" % signal.Signals(signum).name
        if self.submitting:
            self.stopping = why  # sbatch is answering: its job id is cancelled as soon as it comes
            return
        self.cancel(why)
        raise KeyboardInterrupt

    def batch_output(self) -> str:
        path = self.run_dir / "slurm" / ("batch-%s.out" % self.job_id)
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    def fail(self, reason: str, node: str = None, **extra) -> None:
        abort(self.run_dir, reason, self.name(node) if node else self.host, job_id=self.job_id, **extra)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        try:
            self.submitting = True
            self.submitted = time.time()
            rc, out, err = run(["sbatch", "--parsable", str(self.script)], timeout=60, detached=True)
            self.submitting = False
            if rc != 0:
                why = (err or out).strip().splitlines()[-1:] or ["exit code %d" % rc]
                say("sbatch failed: %s" % why[0])
                self.fail("sbatch refused the job: %s" % why[0])
                return rc or 1
            self.job_id = out.strip().split(";", maxsplit=1)[0]
            say("submitted batch job %s" % self.job_id)
            self.note_queue()
            if self.stopping:
                self.cancel(self.stopping)
                raise KeyboardInterrupt
            self.record()
            return self.follow()
        except KeyboardInterrupt:
            # The agent SIGKILLs what is left of the run a few seconds after its SIGTERM: be quick.
            self.wait_end(1.5)
            self.record(final=True, tries=1)
            return 143

    def wait_end(self, seconds: float) -> None:
        deadline = time.time() + seconds
        while self.job_id and time.time() < deadline:
            info, gone = scontrol_job(self.job_id)
            self.info = info or self.info
            if gone or self.info.get("JobState") in TERMINAL:
                return
            time.sleep(0.5)

    def follow(self) -> int:
        last = None
        seen_running = False
        while True:
            info, gone = scontrol_job(self.job_id)
            if info:
                self.info = info
                if info.get("NodeList") not in (None, "", "(null)"):
                    self.nodelist = info["NodeList"]
            elif gone:
                # Slurm forgot the job (MinJobAge passed while it was not answering): accounting has the end.
                self.info["JobState"] = "UNKNOWN"
                break
            state = self.info.get("JobState", "UNKNOWN")
            reason = self.info.get("Reason")
            self.note_queue()
            if state != last:
                where = (" on %s" % self.nodelist if state == "RUNNING" and self.nodelist else
                         " (%s)" % reason if reason not in (None, "", "None") else "")
                say("job %s %s%s" % (self.job_id, state, where))
                last = state
                self.record()
            if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD") and seen_running:
                # A cluster that requeues jobs on a node failure would start the run again from scratch.
                why = "Slurm requeued job %s (%s)" % (self.job_id, reason)
                down = self.down_nodes(self.nodelist)
                say(why)
                self.fail(down[0][1] + "; " + why if down else why, down[0][0] if down else None)
                self.cancel(why)
            elif state == "PENDING" and reason and any(r in reason for r in UNSATISFIABLE):
                down = self.down_nodes(self.info.get("ReqNodeList"))
                why = "Slurm cannot start job %s (%s)%s" % (self.job_id, reason,
                                                            ": " + down[0][1] if down else "")
                say(why)
                self.fail(why, down[0][0] if down else None)
                self.cancel(why)
            elif state == "RUNNING":
                seen_running = True
                down = self.down_nodes(self.nodelist)
                if down:
                    node, why = down[0]
                    say(why)
                    self.fail(why, node)
                    self.cancel(why)
            if state in TERMINAL:
                break
            time.sleep(self.poll)
        rec = self.record(final=True)
        return self.verdict(rec)

    def down_nodes(self, nodelist) -> list:
        """[(Slurm node, "node N is DOWN in Slurm (reason)")] for the nodes of ``nodelist`` Slurm marks bad."""
        if nodelist in (None, "", "(null)"):
            return []
        out = []
        for node, (state, why) in sorted(node_states(nodelist).items()):
            if bad_node_state(state):
                detail = " (%s)" % why if why and why != "none" else ""
                out.append((node, "node %s is %s in Slurm%s" % (self.name(node), state.upper(), detail)))
        return out

    def local_rank(self, tasks: str) -> int:
        """The local rank of global rank ``tasks`` (its first, for a range) from the tasks file."""
        try:
            rank = int(tasks.split(",")[0].split("-")[0])
            lines = (self.run_dir / "slurm" / "tasks").read_text().split()
            return lines[:rank].count(lines[rank])
        except (OSError, ValueError, IndexError):
            return 0

    def verdict(self, rec: dict) -> int:
        state = rec.get("state") or ""
        code = str(rec.get("exit_code") or "0:0")
        output = self.batch_output()
        failures = srun_failures(output)
        say("job %s ended %s, exit code %s, elapsed %s" % (self.job_id, state, code, rec.get("elapsed")))
        if state == "COMPLETED" and code.split(":", maxsplit=1)[0] == "0":
            return 0
        down = self.down_nodes(rec.get("nodes") or self.nodelist)
        lost = node_failures(output)
        if down:
            node, why = down[0]
            self.fail("%s; Slurm job %s ended %s" % (why, self.job_id, state), node)
        elif state == "NODE_FAIL" or lost:
            node = lost[0] if lost else None
            self.fail("Slurm job %s ended %s: %s failed" % (
                self.job_id, state, "node %s" % self.name(node) if node else "a node of %s" % rec.get("nodes")), node)
        elif failures:
            node, tasks, exit_code, what = failures[0]
            if exit_code is not None:
                # The line DeepSpeed's launcher writes for a failed rank (what the run's diagnosis reads), first:
                # the agent stops this process as soon as the ABORT below appears.
                print("%s: rank %s (--local_rank=%d) exits with return code = %d" % (
                    self.name(node), tasks, self.local_rank(tasks), exit_code), flush=True)
            outcome = ("exited with %d%s" % (exit_code, " (%s)" % what.lower() if exit_code < 0 else "")
                       if exit_code is not None else what.lower())
            self.fail("rank %s on %s %s (Slurm job %s %s; srun --kill-on-bad-exit ended every rank)" % (
                tasks, self.name(node), outcome, self.job_id, state), node, exit_code=exit_code)
        elif state == "TIMEOUT":
            self.fail("Slurm job %s reached its time limit" % self.job_id)
        else:
            self.fail("Slurm job %s ended %s (exit code %s)%s" % (
                self.job_id, state, code, ": %s" % self.stopping if self.stopping else ""))
        try:
            first = int(code.split(":", maxsplit=1)[0])
        except ValueError:
            first = 1
        return first or 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m multinode_ds.slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    j = sub.add_parser("job", help="submit the run's batch job and follow it (on the coordinator)")
    j.add_argument("--run-dir", required=True)
    j.add_argument("--host", default=None, help="the coordinator's inventory name (default: its hostname)")
    j.add_argument("--poll", type=float, default=0.5,
                   help="seconds between two looks at the job (scontrol, a cheap call): its end is seen at once")
    return p.parse_args(argv)


def main(argv=None) -> int:
    return Job(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
