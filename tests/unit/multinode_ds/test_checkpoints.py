"""Which checkpoint a resume loads (multinode_ds/checkpoints.py), and the dry run's verdict on it."""
import zipfile
from pathlib import Path

import pytest

from multinode_ds import checkpoints, train


def tag(root, name, torn=False, empty=False):
    d = root / name
    d.mkdir(parents=True)
    for f in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        path = d / f
        if empty:
            path.write_bytes(b"")
            continue
        with zipfile.ZipFile(path, "w") as z:  # torch.save's format is a zip archive
            z.writestr("archive/data.pkl", b"x" * 2000)
        if torn:
            path.write_bytes(path.read_bytes()[:600])  # the central directory, written last, is gone
    return d


def test_latest_when_it_is_whole(tmp_path):
    tag(tmp_path, "step5")
    tag(tmp_path, "step10")
    (tmp_path / "latest").write_text("step10")
    assert checkpoints.choose(tmp_path) == {"tag": "step10", "step": 10, "skipped": []}


def test_a_torn_latest_falls_back_to_the_previous_whole_tag(tmp_path):
    tag(tmp_path, "step5")
    tag(tmp_path, "step10", torn=True)
    (tmp_path / "latest").write_text("step10")
    got = checkpoints.choose(tmp_path)
    assert got["tag"] == "step5" and got["step"] == 5
    assert got["skipped"][0]["tag"] == "step10" and "is torn" in got["skipped"][0]["why"]


def test_latest_naming_a_tag_that_was_never_written(tmp_path):
    tag(tmp_path, "step5")
    (tmp_path / "latest").write_text("step10")
    got = checkpoints.choose(tmp_path)
    assert got["tag"] == "step5" and got["skipped"] == [{"tag": "step10", "why": "%s does not exist" % (
        tmp_path / "step10")}]


def test_no_checkpoint_at_all(tmp_path):
    with pytest.raises(checkpoints.CheckpointError) as err:
        checkpoints.choose(tmp_path / "llama-tiny")
    assert "holds no checkpoint" in str(err.value) and "Fix: run without -e resume=true" in str(err.value)


def test_only_torn_ones(tmp_path):
    tag(tmp_path, "step5", empty=True)
    with pytest.raises(checkpoints.CheckpointError) as err:
        checkpoints.choose(tmp_path)
    assert "mp_rank_00_model_states.pt is empty" in str(err.value)


def test_the_dry_run_refuses_a_resume_without_a_checkpoint(tmp_path, capsys):
    rc = train.main(["--dry-run", "--model", "llama-tiny", "--run-dir", str(tmp_path / "run"), "--resume",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--steps", "10"])
    assert rc == 2 and "resume=true but" in capsys.readouterr().err


def test_the_dry_run_says_which_tag_it_resumes(tmp_path, capsys):
    tag(tmp_path / "ckpt", "step5")
    rc = train.main(["--dry-run", "--model", "llama-tiny", "--run-dir", str(tmp_path / "run"), "--resume",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--steps", "10"])
    assert rc == 0 and '"resume": {"skipped": [], "step": 5, "tag": "step5"}' in capsys.readouterr().out


def test_nothing_left_to_train(tmp_path, capsys):
    tag(tmp_path / "ckpt", "step10")
    rc = train.main(["--dry-run", "--model", "llama-tiny", "--run-dir", str(tmp_path / "run"), "--resume",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--steps", "10"])
    assert rc == 2 and "nothing left to train" in capsys.readouterr().err


def _zero_tag(root, name, world, ranks):
    """A ZeRO tag as DeepSpeed writes it: the model states recording dp_world_size, one optimizer partition per
    rank of ``ranks``."""
    import pickle

    tag = root / name
    tag.mkdir(parents=True)
    with zipfile.ZipFile(tag / "mp_rank_00_model_states.pt", "w") as z:
        z.writestr("mp_rank_00_model_states/data.pkl",
                   pickle.dumps({"module": None, "dp_world_size": world, "mp_world_size": 1}, protocol=2))
    for r in ranks:
        with zipfile.ZipFile(tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", "w") as z:
            z.writestr("archive/data.pkl", b"x" * 100)
    return tag


def test_a_zero_tag_without_every_ranks_partition_is_torn_even_when_latest_names_it(tmp_path):
    _zero_tag(tmp_path, "step30", 2, [0, 1])
    _zero_tag(tmp_path, "step35", 2, [0])  # rank 1 was killed before it saved its partition
    (tmp_path / "latest").write_text("step35")
    assert checkpoints.saved_world(tmp_path / "step35") == 2 and checkpoints.dp_world(tmp_path / "step30") == 2
    chosen = checkpoints.choose(tmp_path)
    assert chosen["tag"] == "step30"
    assert chosen["skipped"][0]["why"].endswith("is torn: it was saved by 2 ranks and has no ZeRO partition of rank 1")


def test_the_world_a_tag_was_saved_by_is_read_without_torch(tmp_path):
    assert checkpoints.saved_world(_zero_tag(tmp_path, "step4", 3, [0, 1, 2])) == 3
    assert checkpoints.saved_world(tmp_path / "nothing") is None


def test_a_universal_conversion_is_current_only_for_the_tag_it_was_made_from(tmp_path):
    source = tmp_path / "llama-tiny" / "step50"
    source.mkdir(parents=True)
    (source / "mp_rank_00_model_states.pt").write_bytes(b"first run")
    out = tmp_path / "llama-tiny.universal" / "step50"
    out.mkdir(parents=True)
    assert not checkpoints.conversion_current(out, source)      # never recorded: made again
    checkpoints.record_conversion(out, source)
    assert checkpoints.conversion_current(out, source) is (checkpoints.tag_problem(out) is None)
    fingerprint = checkpoints.tag_fingerprint(source)
    # Another run of the same model saves its own step50 there: the old conversion is not its own.
    (source / "mp_rank_00_model_states.pt").write_bytes(b"another run, another size")
    assert checkpoints.tag_fingerprint(source) != fingerprint
    assert not checkpoints.conversion_current(out, source)


def test_a_later_attempt_resumes_only_the_checkpoints_of_its_own_run(tmp_path, monkeypatch):
    for tag, run in (("step50", "run-a"), ("step600", "run-old"), ("step40", None)):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
        if run:
            checkpoints.mark_run(tmp_path / tag, run)
    (tmp_path / "latest").write_text("step600")
    whole = dict((t, None) for t in ("step50", "step600", "step40"))
    monkeypatch.setattr(checkpoints, "tag_problem", lambda tag_dir: whole.get(Path(tag_dir).name))
    assert checkpoints.choose(tmp_path)["tag"] == "step600"            # -e resume=true: any run's
    assert checkpoints.choose(tmp_path, "run-a")["tag"] == "step50"     # a later attempt: its own
    with pytest.raises(checkpoints.CheckpointError) as err:
        checkpoints.choose(tmp_path, "run-new")
    assert "holds no checkpoint of run run-new" in str(err.value)
    assert checkpoints.saved_by(tmp_path / "step40") is None


def test_the_trainer_marks_a_checkpoint_save_with_its_seconds():
    from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
    from multinode_ds.train import save_record  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    ranks = SimpleNamespace(rank=1, host="worker2")
    begin = save_record("begin", ranks, 40, time.time())
    end = save_record("end", ranks, 40, time.time() - 2.0)
    assert {k: begin[k] for k in ("event", "phase", "step", "rank", "host")} == \
        {"event": "save", "phase": "begin", "step": 40, "rank": 1, "host": "worker2"} and "seconds" not in begin
    assert end["phase"] == "end" and 2.0 <= end["seconds"] < 3.0
