"""A workdir's private files stay on the controller (issue 44, point 2): files named like secrets are left out (git
tracked or not) unless workdir_include_secrets names them, files only their owner may read are refused unless
workdir_allow_private, and the whole filesystem, the home directory and a directory holding .ssh/ are refused
before any file is listed."""
import os
import subprocess

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import usercode, workdir
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.workdir import (
    WorkdirError, list_files, listing, plan, private, secret, secrets_line)


def write(root, path, data=b"x", mode=0o644):
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)
    full.chmod(mode)
    return full


def git(root, *args):
    subprocess.run(["git", "-C", str(root)] + list(args), check=True, capture_output=True)


@pytest.fixture(name="project")
def project_fixture(tmp_path):
    """A committed project with the secrets people commit by mistake: .env, a key, a .aws/ directory."""
    root = tmp_path / "proj"
    write(root, "train.py", b"print(1)\n", 0o755)
    write(root, ".env", b"WANDB_API_KEY=k-1\n")
    write(root, ".env.example", b"WANDB_API_KEY=\n")
    write(root, "certs/server.pem", b"-----BEGIN PRIVATE KEY-----\n")
    write(root, "deploy/.aws/credentials", b"[default]\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return root


@pytest.mark.parametrize("path", [
    ".env", "conf/.env", ".env.local", "conf/.env.production", ".envrc", "certs/server.pem", "tls/site.key",
    "id_rsa", "keys/id_ed25519.pub", "id_ecdsa", ".ssh/config", "home/.ssh/known_hosts", "sub/.aws/credentials",
    ".kube/config", ".gnupg/pubring.kbx", ".docker/config.json", ".netrc", ".git-credentials", ".pypirc", ".npmrc",
    ".pgpass", "store.p12", "app.jks", ".vault_pass.txt", "credentials.json", "kubeconfig", ".env/bin/python"])
def test_files_named_like_secrets_are_secrets(path):
    assert secret(path) is True


@pytest.mark.parametrize("path", [
    "train.py", "keyboard.py", "data/keys.txt", "environment.yml", ".env.example", "conf/.env.sample",
    ".env.template", "ssh/config.py", "pem.py", "monkey.py", "README.md", ".gitignore"])
def test_ordinary_files_are_not_secrets(path):
    assert secret(path) is False


def test_workdir_include_secrets_ships_what_it_names():
    assert secret(".env.ci", [".env.ci"]) is False and secret(".env.local", [".env.ci"]) is True
    assert secret("certs/ca.pem", ["certs/ca.pem"]) is False and secret("certs/key.pem", ["certs/ca.pem"]) is True
    assert secret(".ssh/config", ["*"]) is False


def test_a_committed_secret_is_left_out_of_a_git_tree_and_of_a_plain_one(project, tmp_path):
    files, secrets = listing(str(project))
    assert files == [".env.example", "train.py"]
    assert secrets == [".env", "certs/server.pem", "deploy/.aws/credentials"]
    plain = tmp_path / "plain"
    write(plain, "run.py")
    write(plain, "config/.env.prod")
    write(plain, "id_rsa", mode=0o644)
    assert list_files(str(plain)) == ["run.py"]
    assert list_files(str(plain), include=["id_rsa"]) == ["id_rsa", "run.py"]


def test_the_plan_names_what_it_left_out_and_the_hash_follows_what_ships(project, tmp_path):
    out = plan("proj", "train.py", [], None, str(tmp_path))
    assert out["files_from"] == "./.env.example\n./train.py\n" and "/.env\n" not in out["files_from"]
    assert out["secrets_left_out"] == [".env", "certs/server.pem", "deploy/.aws/credentials"]
    shipped = plan("proj", "train.py", [], None, str(tmp_path), include_secrets=["certs/"])
    assert "certs/server.pem" in shipped["files"] and shipped["hash"] != out["hash"]
    line = secrets_line(out)
    assert line.startswith("workdir: 3 file(s) left out because their names say they hold secrets: .env, "
                           "certs/server.pem, deploy/.aws/credentials.") and "workdir_include_secrets" in line
    assert secrets_line(shipped) == "workdir: 2 file(s) left out because their names say they hold secrets: .env, " \
        "deploy/.aws/credentials. The ranks get secrets from secret_env (node-local, mode 0600); to ship such a " \
        "file anyway: -e workdir_include_secrets=<pattern>"
    assert secrets_line(plan("proj", "train.py", [], None, str(tmp_path), include_secrets=["*"])) is None


def test_an_entrypoint_named_like_a_secret_says_so(project, tmp_path):
    write(project, "tool.key", b"print(1)\n")
    with pytest.raises(WorkdirError, match=r"entrypoint=tool.key .* not shipped: its name says it holds a secret. "
                                           r"Fix: rename it, or ship it with -e workdir_include_secrets=tool.key"):
        plan("proj", "tool.key", [], None, str(tmp_path))


def test_files_only_their_owner_may_read_are_refused_unless_allowed(project, tmp_path):
    write(project, "notes.txt", b"mine\n", 0o600)
    write(project, "keys/a.txt", b"a\n", 0o644)
    (project / "keys").chmod(0o700)
    write(project, "group.txt", b"g\n", 0o640)  # the group may read it: not private
    with pytest.raises(WorkdirError) as err:
        plan("proj", "train.py", [], None, str(tmp_path))
    text = str(err.value)
    assert "workdir %s: keys/, notes.txt can be read only by its owner on the controller" % project in text
    assert "Fix: leave it out (workdir_exclude or .gitignore), or ship it anyway with -e workdir_allow_private=true" \
        in text
    out = plan("proj", "train.py", [], None, str(tmp_path), allow_private=True)
    assert {"notes.txt", "keys/a.txt", "group.txt"} <= set(out["files"])
    # Left out, it is no problem; a private file named like a secret is left out, never refused.
    assert "notes.txt" not in plan("proj", "train.py", ["notes.txt", "keys/"], None, str(tmp_path))["files"]
    (project / ".env").chmod(0o600)
    assert private(str(project), [".env.example", "train.py"]) == []


def test_many_private_files_are_counted_past_the_first_five(tmp_path):
    for i in range(7):
        write(tmp_path / "p", "f%d.txt" % i, mode=0o600)
    write(tmp_path / "p", "train.py")
    with pytest.raises(WorkdirError, match=r"f0.txt, f1.txt, f2.txt, f3.txt, f4.txt and 2 more can be read only"):
        plan("p", "train.py", [], None, str(tmp_path))


@pytest.fixture(name="no_listing")
def no_listing_fixture(monkeypatch):
    """Listing a directory (walking it, asking git) fails the test: a refusal must come before it."""
    def never(*_args, **_kw):
        raise AssertionError("the workdir was listed before it was refused")
    for name in ("_walk", "_git", "_inside_git", "listing", "list_files"):
        monkeypatch.setattr(workdir, name, never)


def test_the_whole_filesystem_is_refused_before_any_file_is_listed(no_listing, tmp_path):
    # An entrypoint that exists under /: the workdir would be listed (walked: minutes, then /proc) after its check.
    script = write(tmp_path, "train.py")
    with pytest.raises(WorkdirError) as err:
        plan("/", str(script), [], None, str(tmp_path))
    assert str(err.value) == ("workdir=/ is the whole filesystem (/): everything readable there would be copied to "
                              "the cluster. Fix: give the directory of your project, e.g. -e workdir=~/myproject")
    _inputs, problems = usercode.gather({"workdir": "/", "entrypoint": str(script)}, str(tmp_path), str(tmp_path))
    assert problems == [str(err.value)]


def test_the_home_directory_and_what_holds_it_are_refused(no_listing, tmp_path, monkeypatch):
    home = tmp_path / "users" / "me"
    write(home, "proj/train.py")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(WorkdirError, match=r"workdir=~ \(%s\) is your home directory %s, with its keys and "
                                           r"credentials: they would be copied to the cluster. Fix: give the "
                                           r"directory of your project" % (home, home)):
        plan("~", "proj/train.py", [], None, str(tmp_path))
    with pytest.raises(WorkdirError, match=r"workdir=users \(%s\) holds your home directory %s" % (
            tmp_path / "users", home)):
        plan("users", "me/proj/train.py", [], None, str(tmp_path))


def test_a_directory_holding_ssh_is_refused(no_listing, tmp_path):
    (tmp_path / "other" / ".ssh").mkdir(parents=True)
    write(tmp_path / "other", "train.py")
    with pytest.raises(WorkdirError, match=r"workdir=other \(.*/other\) holds .ssh/, as a home directory does"):
        plan("other", "train.py", [], None, str(tmp_path))


def test_a_project_inside_the_home_directory_ships(project, monkeypatch):
    monkeypatch.setenv("HOME", str(project.parent))
    assert plan("~/proj", "train.py", [], None, "/")["files"] == [".env.example", "train.py"]


@pytest.mark.parametrize("settings, words", [
    ({"workdir_allow_private": "maybe"}, ["workdir_allow_private=maybe is not a yes/no value",
                                          "Fix: -e workdir_allow_private=true"]),
    ({"workdir_include_secrets": ["ok", "a\nb"]}, ["workdir_include_secrets: 'a\\nb' is not a pattern"]),
])
def test_bad_privacy_settings_are_refused(project, settings, words):
    _inputs, problems = usercode.gather(dict(settings, workdir="proj", entrypoint="train.py"), str(project.parent),
                                        str(project.parent / "runs"))
    for word in words:
        assert word in "; ".join(problems)


def test_the_privacy_settings_reach_the_plan(project):
    (project / "train.py").chmod(0o700)
    settings = {"workdir": "proj", "entrypoint": "train.py"}
    _inputs, problems = usercode.gather(settings, str(project.parent), str(project.parent / "runs"))
    assert "train.py can be read only by its owner" in "; ".join(problems)
    inputs, problems = usercode.gather(dict(settings, workdir_allow_private="yes", workdir_include_secrets=".env"),
                                       str(project.parent), str(project.parent / "runs"))
    assert problems == [] and inputs["workdir"]["files"] == [".env", ".env.example", "train.py"]
    assert inputs["workdir"]["secrets_left_out"] == ["certs/server.pem", "deploy/.aws/credentials"]
    assert os.stat(project / "train.py").st_mode & 0o777 == 0o700
