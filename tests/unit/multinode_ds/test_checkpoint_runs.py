"""Runs of one model share its checkpoint directory (issue 44, point 4): a new run never overwrites another run's
tags; ``-e resume=true`` loads the newest save of any run, a later attempt only its own run's."""
import os
import time
import zipfile
from pathlib import Path

import pytest

from multinode_ds import checkpoints, train


class SavingEngine:
    """DeepSpeed's save as far as the directory goes: the tag's files, then ``latest`` naming it."""

    def __init__(self, content):
        self.content = content

    def save_checkpoint(self, ckpt_dir, tag, client_state):
        d = Path(ckpt_dir) / tag
        d.mkdir(parents=True, exist_ok=True)
        for f in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
            with zipfile.ZipFile(d / f, "w") as z:
                z.writestr("archive/data.pkl", self.content + str(client_state).encode())
        (Path(ckpt_dir) / "latest").write_text(tag)


def ranks():
    return train.Ranks(rank=0, world=1, local_rank=0, host="w1", on_cpu=True, device="cpu")


def save_as(monkeypatch, run_id, ckpt, step, content):
    import torch.distributed as dist

    monkeypatch.setenv("MULTINODE_DS_RUN_ID", run_id)
    monkeypatch.setattr(dist, "barrier", lambda: None)
    train.save(SavingEngine(content), str(ckpt), step, ranks())


def files_of(tag_dir):
    return dict((p.name, p.read_bytes()) for p in Path(tag_dir).iterdir())


def test_a_new_run_of_the_same_model_never_overwrites_another_runs_tags(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    ckpt = tmp_path / "checkpoints" / "llama-tiny"
    for step in (10, 20):
        save_as(monkeypatch, "run-a", ckpt, step, b"run a")
    before = dict((t, files_of(ckpt / t)) for t in ("run-a-step10", "run-a-step20"))
    # A fresh run (no resume) of the same model, the same steps.
    save_as(monkeypatch, "run-b", ckpt, 10, b"run b")
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["run-a-step10", "run-a-step20", "run-b-step10"]
    assert dict((t, files_of(ckpt / t)) for t in before) == before
    assert checkpoints.saved_by(ckpt / "run-b-step10") == "run-b"
    # latest names the newest save, which -e resume=true loads; a later attempt of run-a still finds its own.
    assert (ckpt / "latest").read_text() == "run-b-step10"
    assert checkpoints.choose(ckpt)["tag"] == "run-b-step10"
    assert checkpoints.choose(ckpt, "run-a")["tag"] == "run-a-step20"


def test_a_trainer_started_by_hand_keeps_plain_step_tags(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    save_as(monkeypatch, "", tmp_path, 3, b"x")
    assert (tmp_path / "latest").read_text() == "step3" and checkpoints.saved_by(tmp_path / "step3") is None
    assert checkpoints.tag_name(7, "r1") == "r1-step7" and checkpoints.tag_name(7) == "step7"
    assert checkpoints.step_of("e2e-step5-step30") == 30


def whole(root, name, run=None, mtime=None):
    d = root / name
    d.mkdir(parents=True)
    with zipfile.ZipFile(d / "mp_rank_00_model_states.pt", "w") as z:
        z.writestr("archive/data.pkl", b"x" * 100)
    if run:
        checkpoints.mark_run(d, run)
    if mtime is not None:
        os.utime(d, (mtime, mtime))
    return d


def test_a_torn_latest_falls_back_to_its_own_runs_previous_tag_not_another_runs_higher_step(tmp_path):
    now = time.time()
    whole(tmp_path, "old-step600", "old", now - 3600)
    whole(tmp_path, "new-step40", "new", now - 60)
    torn = whole(tmp_path, "new-step50", "new", now)
    (torn / "mp_rank_00_model_states.pt").write_bytes(b"")
    (tmp_path / "latest").write_text("new-step50")
    chosen = checkpoints.choose(tmp_path)
    assert chosen["tag"] == "new-step40" and [s["tag"] for s in chosen["skipped"]] == ["new-step50"]
    # With its run's tags all torn, the other runs' follow, the one saved last first.
    (tmp_path / "new-step40" / "mp_rank_00_model_states.pt").write_bytes(b"")
    whole(tmp_path, "mid-step100", "mid", now - 600)
    assert checkpoints.choose(tmp_path)["tag"] == "mid-step100"


def test_an_unmarked_tag_belongs_to_the_run_its_name_says(tmp_path):
    # Rank 0 died between DeepSpeed's save and its mark: the name still says whose it is.
    whole(tmp_path, "new-step40")
    whole(tmp_path, "old-step600", "old")
    (tmp_path / "latest").write_text("new-step50")  # never finished
    assert checkpoints.choose(tmp_path)["tag"] == "new-step40"
    assert checkpoints.run_of(tmp_path, "new-step40") == "new" and checkpoints.run_of(tmp_path, "step40") is None
