"""multinode_ds/rank.py: each rank becomes the run's program from files (program.json, rank.env, the node-local
secrets), so that no argument, path or value of the user's passes through a shell."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multinode_ds import rank

ROOT = Path(__file__).resolve().parents[3]
HOSTILE = ["--note", "$(touch {p}/pwned-subst)", "`touch {p}/pwned-tick`", "; touch {p}/pwned-semi",
           "a b'c\"d", "&& touch {p}/pwned-and", "|touch {p}/pwned-pipe", "\\$HOME", "*"]


def test_program_started_as_deepspeeds_launch_py_does():
    assert rank.program_argv("/v/python", ["--module", "multinode_ds.train", "--steps", "3"], "1") == [
        "/v/python", "-u", "-m", "multinode_ds.train", "--local_rank=1", "--steps", "3"]
    assert rank.program_argv("/v/python", ["/shared/my.py", "--x"], "0") == [
        "/v/python", "-u", "/shared/my.py", "--local_rank=0", "--x"]


def test_the_environment_rank_env_then_the_launchers_then_the_secrets(tmp_path):
    secrets = tmp_path / "s.json"
    secrets.write_text(json.dumps({"WANDB_API_KEY": "k-123", "RANK": "ignored-by-the-plan-not-here"}))
    (tmp_path / "rank.env").write_text("A=from rank.env\nB=$(not expanded)\nMULTINODE_DS_SECRET_ENV=%s\n" % secrets)
    env = rank.rank_environment(tmp_path, {"A": "base", "PATH": "/bin"}, {"RANK": "3"})
    assert env["A"] == "from rank.env" and env["B"] == "$(not expanded)" and env["PATH"] == "/bin"
    assert env["WANDB_API_KEY"] == "k-123"


def test_no_secrets_file_named_means_none(tmp_path):
    assert "WANDB_API_KEY" not in rank.rank_environment(tmp_path, {}, {})


def test_an_unreadable_secrets_file_stops_the_rank_naming_it(tmp_path):
    (tmp_path / "rank.env").write_text("MULTINODE_DS_SECRET_ENV=%s/gone.json\n" % tmp_path)
    with pytest.raises(SystemExit, match="cannot read the run's secrets .*gone.json"):
        rank.rank_environment(tmp_path, {}, {})


def test_a_missing_or_bad_program_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match="program.json"):
        rank.read_program(tmp_path)
    (tmp_path / "program.json").write_text('"python x.py"')
    with pytest.raises(SystemExit, match="not a list of arguments"):
        rank.read_program(tmp_path)


def test_hostile_arguments_and_values_arrive_verbatim_and_run_nothing(tmp_path):
    """The real exec: a script that records its argv and environment."""
    script = tmp_path / "show.py"
    script.write_text("import json, os, sys\n"
                      "json.dump({'argv': sys.argv[1:], 'v': os.environ.get('HOSTILE'), "
                      "'s': os.environ.get('MY_SECRET')}, open(os.path.join(os.environ['OUT'], 'seen.json'), 'w'))\n")
    args = [a.format(p=tmp_path) for a in HOSTILE]
    (tmp_path / "program.json").write_text(json.dumps([str(script)] + args))
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"MY_SECRET": "s3cr3t; $(touch %s/pwned-secret)" % tmp_path}))
    os.chmod(secrets, 0o600)
    (tmp_path / "rank.env").write_text("HOSTILE=$(touch %s/pwned-env); `id`\nOUT=%s\nMULTINODE_DS_SECRET_ENV=%s\n"
                                       % (tmp_path, tmp_path, secrets))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "multinode_ds.rank", "--local_rank=2", "--run-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == ["--local_rank=2"] + args
    assert seen["v"] == "$(touch %s/pwned-env); `id`" % tmp_path
    assert seen["s"].startswith("s3cr3t; ")
    assert not list(tmp_path.glob("pwned*"))


def test_a_shipped_script_runs_in_its_attempts_work_directory_and_the_bundled_trainer_in_the_run_directory(tmp_path):
    script = tmp_path / "cwd.py"
    script.write_text("import os\nopen(os.path.join(os.environ['OUT'], 'cwd.txt'), 'w').write(os.getcwd())\n")
    (tmp_path / "program.json").write_text(json.dumps([str(script)]))
    (tmp_path / "work").mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for rank_env, cwd in (("", tmp_path), ("MULTINODE_DS_WORKDIR=/shared/workspaces/w1\n", tmp_path / "work")):
        (tmp_path / "rank.env").write_text("OUT=%s\n%s" % (tmp_path, rank_env))
        proc = subprocess.run([sys.executable, "-m", "multinode_ds.rank", "--run-dir", str(tmp_path)], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "cwd.txt").read_text() == str(cwd)


def test_a_later_attempt_gets_the_newest_whole_checkpoint_as_its_resume_tag(tmp_path):
    import zipfile

    from multinode_ds.rank import resume_tag

    env = {"MULTINODE_DS_ATTEMPT": "2", "MULTINODE_DS_CHECKPOINT_DIR": str(tmp_path)}
    assert resume_tag(env) == ""
    for tag in ("step4", "step6"):
        (tmp_path / tag).mkdir()
        with zipfile.ZipFile(tmp_path / tag / "mp_rank_00_model_states.pt", "w") as z:
            z.writestr("archive/data.pkl", b"x")
    (tmp_path / "step8").mkdir()  # torn: no model states
    assert resume_tag(env) == "step6"
    assert resume_tag(dict(env, MULTINODE_DS_ATTEMPT="1")) == ""
    assert resume_tag({"MULTINODE_DS_ATTEMPT": "3"}) == ""


def test_the_shims_arguments_in_every_form_and_argparse_for_the_rest(capsys):
    assert rank.parse_args(["--local_rank=2", "--run-dir", "/d"]) == {"run_dir": "/d", "local_rank": "2"}
    assert rank.parse_args(["--run-dir=/d e"]) == {"run_dir": "/d e", "local_rank": None}
    assert rank.parse_args(["--local-rank", "3", "--run-dir", "/d"]) == {"run_dir": "/d", "local_rank": "3"}
    for bad in ([], ["--run-dir"], ["--bogus", "x", "--run-dir", "/d"], ["--local_rank=1"]):
        with pytest.raises(SystemExit) as exc:
            rank.parse_args(bad)
        assert exc.value.code == 2
    assert "usage: python -m multinode_ds.rank" in capsys.readouterr().err


def test_a_ranks_start_loads_only_what_it_needs():
    """multinode_ds.rank and multinode_ds.slurm_rank run once per rank before its program's imports: neither loads
    argparse, pathlib, subprocess, the agent or the checkpoints module."""
    heavy = ("argparse", "pathlib", "subprocess", "multinode_ds.agent", "multinode_ds.checkpoints")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", "import sys, multinode_ds.rank, multinode_ds.slurm_rank; "
                           "print(sorted(m for m in %r if m in sys.modules))" % (heavy,)],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"
