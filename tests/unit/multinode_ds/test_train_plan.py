"""The trainer's dry run: what train.yml checks on the coordinator before anything starts."""
import json

import pytest

from multinode_ds import train


def run(capsys, *argv):
    rc = train.main(["--dry-run", "--run-dir", "/tmp/x", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_for_tiny_llama(capsys, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    rc, out, dummy = run(capsys, "--model", "llama-tiny", "--world-size", "2", "--memory-gib", "8")
    assert rc == 0
    plan = json.loads(out)
    assert plan["model"] == "llama-tiny" and plan["world_size"] == 2 and plan["zero_stage"] == 1


def test_llama_8b_does_not_fit_cpu_nodes(capsys, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    rc, dummy, err = run(capsys, "--model", "llama", "--world-size", "2", "--memory-gib", "12")
    assert rc == 2
    assert "model llama (8.03B parameters) needs about" in err and "-e model=llama-tiny" in err


def test_missing_data_and_bad_config(capsys, tmp_path):
    rc, dummy, err = run(capsys, "--data", str(tmp_path / "nope.txt"))
    assert rc == 2 and "does not exist on this node" in err
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    rc, dummy, err = run(capsys, "--ds-config", str(bad))
    assert rc == 2 and "is not valid JSON" in err


def test_unknown_model_is_refused():
    with pytest.raises(SystemExit):
        train.parse_args(["--model", "gpt5", "--run-dir", "/tmp/x"])


def test_missing_model_path_is_reported(capsys, tmp_path):
    rc, dummy, err = run(capsys, "--model-path", str(tmp_path / "no-weights"))
    assert rc == 2 and "model path" in err and "does not exist on this node" in err


def test_node_name_is_the_inventory_name(tmp_path, monkeypatch):
    from multinode_ds.train import node_name
    (tmp_path / "hostfile").write_text("# ranks\ngpu-a1 slots=2\ngpu-a2 slots=2\n")
    monkeypatch.setattr("socket.gethostname", lambda: "worker7")
    assert node_name(tmp_path, {"CROSS_RANK": "1", "CROSS_SIZE": "2"}) == "gpu-a2"
    assert node_name(tmp_path, {"CROSS_RANK": "0", "CROSS_SIZE": "2"}) == "gpu-a1"
    # DeepSpeed fell back to one local node, no node rank, a rank outside the file, no hostfile: the hostname.
    assert node_name(tmp_path, {"CROSS_RANK": "0", "CROSS_SIZE": "1"}) == "worker7"
    assert node_name(tmp_path, {}) == "worker7"
    assert node_name(tmp_path, {"CROSS_RANK": "5", "CROSS_SIZE": "2"}) == "worker7"
    assert node_name(tmp_path / "missing", {"CROSS_RANK": "0", "CROSS_SIZE": "2"}) == "worker7"


@pytest.mark.parametrize("argv,needle", [
    (["--micro-batch", "0"], "--micro-batch 0 must be at least 1"),
    (["--seq-len", "1"], "--seq-len 1 must be at least 2"),
    (["--seq-len", "100000"], "--seq-len 100000 is longer than llama-tiny can attend to (512 positions)"),
    (["--lr", "nan"], "--lr nan is not a learning rate"),
    (["--lr", "-0.1"], "--lr -0.1 is not a learning rate"),
    (["--lr", "3"], "--lr 3.0 is not a learning rate"),
    (["--warmup", "-3"], "--warmup -3 must be at least 0"),
    (["--print-every", "0"], "--print-every 0 must be at least 1"),
])
def test_trainer_options_that_cannot_work_fail_the_dry_run(capsys, argv, needle):
    rc, dummy, err = run(capsys, "--model", "llama-tiny", *argv)
    assert rc == 2 and needle in err and "Fix: -e args=" in err


def test_every_bad_option_is_named_at_once(capsys):
    rc, dummy, err = run(capsys, "--micro-batch", "0", "--print-every", "0")
    assert rc == 2 and "--micro-batch 0" in err and "--print-every 0" in err


def test_the_trainer_takes_no_abbreviation_of_an_option():
    """Issue 44, point 4: "--checkpoint-d" is not --checkpoint-dir (the plan sets that one)."""
    import pytest as _pytest
    from multinode_ds import train
    with _pytest.raises(SystemExit):
        train.parse_args(["--run-dir", "/r", "--checkpoint-d", "/elsewhere"])
    assert train.parse_args(["--run-dir", "/r", "--checkpoint-dir", "/c"]).checkpoint_dir == "/c"


def test_the_plan_knows_every_option_of_the_trainer():
    """The plan refuses in args what it sets itself, and an abbreviation of it, but not another trainer option that
    happens to begin one ("--data" is not "--dataset"): its two lists name every option of the trainer's parser."""
    from multinode_ds import train
    from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import PLANNED_OPTIONS, TRAINER_OPTIONS
    options = set(o for action in train.parser()._actions for o in action.option_strings)  # pylint: disable=protected-access
    assert options == set(PLANNED_OPTIONS) | set(TRAINER_OPTIONS)
