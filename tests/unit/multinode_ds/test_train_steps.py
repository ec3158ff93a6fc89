"""The trainer's parts (multinode_ds/train.py): its data, its DeepSpeed config and optimizer, the resume, the
records of each step, when it prints and saves; and a real run on one CPU rank."""
import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from multinode_ds import checkpoints, train

ROOT = Path(__file__).resolve().parents[3]


def args(*argv):
    return train.parse_args(["--run-dir", "/shared/runs/r1", *argv])


def ranks(rank=0, world=2, on_cpu=True):
    return train.Ranks(rank=rank, world=world, local_rank=rank % 2, host="gpu-a1", on_cpu=on_cpu, device="cpu")


def test_the_data_is_the_files_given_else_the_bundled_corpus(tmp_path):
    (tmp_path / "a.txt").write_text("first document\n\nsecond document\n")
    assert train.training_texts(args("--data", str(tmp_path / "a.txt"))) == ["first document", "second document"]
    bundled = train.training_texts(args())
    assert len(bundled) > 1 and all(doc.strip() for doc in bundled)


def test_the_dataset_comes_first(monkeypatch):
    monkeypatch.setattr(train.data_mod, "hf_dataset_texts", lambda spec: ["from " + spec])
    assert train.training_texts(args("--dataset", "wikitext:train", "--data", "/x.txt")) == ["from wikitext:train"]


def test_on_cpu_the_device_options_are_taken_as_given():
    assert train.device_capabilities(args(), ranks()) == (None, False)
    assert train.device_capabilities(args("--device-memory-gib", "40", "--bf16"), ranks()) == (40.0, True)


def test_the_generated_config_with_the_users_merged_over_it(tmp_path):
    config = train.deepspeed_config(args("--micro-batch", "2"), ranks(), 107520)
    assert config["zero_optimization"] == {"stage": 1} and config["train_micro_batch_size_per_gpu"] == 2
    assert "optimizer" not in config and not train.deepspeed_builds_optimizer(config)
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}}))
    config = train.deepspeed_config(args("--ds-config", str(user)), ranks(), 107520)
    assert config["zero_optimization"] == {"stage": 2} and config["optimizer"] == {"type": "Adam"}
    assert config["train_micro_batch_size_per_gpu"] == 4 and train.deepspeed_builds_optimizer(config)


def test_deepspeed_builds_the_optimizer_when_it_is_offloaded():
    assert train.deepspeed_builds_optimizer({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})
    assert not train.deepspeed_builds_optimizer({"zero_optimization": {"stage": 3}})


def test_the_optimizer_described_unless_the_config_names_one():
    config = train.describe_optimizer({}, 3e-4, 5)
    assert config == {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.01}},
                      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                                   "warmup_num_steps": 5}}}
    mine = {"optimizer": {"type": "Lamb"}}
    assert train.describe_optimizer(mine, 1e-3, 1)["optimizer"] == {"type": "Lamb"}
    assert mine["scheduler"]["params"]["warmup_max_lr"] == 1e-3


def test_the_checkpoint_directory():
    assert train.checkpoint_dir(args()) == "/shared/runs/r1/checkpoints"
    assert train.checkpoint_dir(args("--checkpoint-dir", "/ckpt")) == "/ckpt"


class FakeEngine:
    def __init__(self, load_path, client):
        self.loaded = []
        self.answer = (load_path, client)

    def load_checkpoint(self, ckpt_dir, tag):
        self.loaded.append((ckpt_dir, tag))
        return self.answer


def whole_tag(root, name):
    (root / name).mkdir(parents=True)
    for f in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        with zipfile.ZipFile(root / name / f, "w") as z:
            z.writestr("archive/data.pkl", b"x" * 2000)


def test_resume_loads_the_chosen_tag_and_goes_on_from_its_step(tmp_path, capsys):
    assert train.resume_checkpoint(args(), FakeEngine(None, None), str(tmp_path), 0) == (0, None)
    whole_tag(tmp_path, "step4")
    (tmp_path / "latest").write_text("step6")
    engine = FakeEngine(str(tmp_path / "step4"), {"step": 4})
    start, resumed = train.resume_checkpoint(args("--resume"), engine, str(tmp_path), 0)
    assert start == 4 and resumed["tag"] == "step4" and engine.loaded == [(str(tmp_path), "step4")]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("multinode_ds: skipping checkpoint step6: ")
    assert out[1] == "multinode_ds: resumed from %s at step 4" % (tmp_path / "step4")
    # Without the client state, the tag's step; other ranks print nothing.
    assert train.resume_checkpoint(args("--resume"), FakeEngine("p", None), str(tmp_path), 1)[0] == 4
    assert capsys.readouterr().out == ""
    with pytest.raises(RuntimeError, match="could not load checkpoint step4 from"):
        train.resume_checkpoint(args("--resume"), FakeEngine(None, None), str(tmp_path), 1)


def test_the_start_and_step_records():
    rec = train.start_record(ranks(rank=1), "llama-tiny", 107520, 4, {"tag": "step4", "skipped": []})
    assert rec["event"] == "start" and rec["rank"] == 1 and rec["local_rank"] == 1 and rec["world_size"] == 2
    assert rec["host"] == "gpu-a1" and rec["machine"] == socket.gethostname() and rec["start_step"] == 4
    assert rec["resumed_from"] == "step4" and rec["skipped_checkpoints"] == [] and rec["process_start"] <= rec["time"]
    assert train.start_record(ranks(), "llama-tiny", 1, 0, None)["resumed_from"] is None
    rec = train.step_record(args("--steps", "10", "--micro-batch", "4", "--seq-len", "64"), ranks(), 3, 2.5, 2.4,
                            1e-3, 0.5)
    assert {k: rec[k] for k in ("event", "step", "total_steps", "loss", "loss_local", "lr", "step_time")} == {
        "event": "step", "step": 3, "total_steps": 10, "loss": 2.5, "loss_local": 2.4, "lr": 1e-3, "step_time": 0.5}
    assert rec["samples_per_sec"] == 16.0 and rec["tokens_per_sec"] == 1024.0 and rec["host"] == "gpu-a1"
    assert rec["compute"] is None
    assert train.step_record(args("--steps", "10"), ranks(), 3, 2.5, 2.4, 1e-3, 0.5, 0.125)["compute"] == 0.125


@pytest.mark.parametrize("done,expected", [(1, False), (5, True), (7, False), (10, True), (12, True)])
def test_progress_every_n_steps_and_at_the_last(done, expected):
    assert train.progress_due(done, 12, 5) is expected


@pytest.mark.parametrize("done,interval,expected", [(4, 2, True), (3, 2, False), (10, 2, False), (4, 0, False)])
def test_checkpoints_every_interval_but_not_the_last(done, interval, expected):
    assert train.checkpoint_due(done, 10, interval) is expected


def test_the_progress_line_and_its_time_left():
    rec = {"step": 6, "total_steps": 10, "loss": 2.345678, "tokens_per_sec": 1234.4}
    # Two steps run in 4 s since a resume at step 4: 2 s a step, 4 steps left.
    assert train.progress_line(rec, 4.0, 2) == "multinode_ds: step 6/10 loss 2.3457 1234 tok/s eta 8s"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer(run_dir, *argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), CROSS_RANK="0", CROSS_SIZE="1")
    return subprocess.run([sys.executable, "-m", "multinode_ds.train", "--run-dir", str(run_dir), "--seq-len", "32",
                           *argv], env=env, capture_output=True, text=True, timeout=600, check=False)


def test_a_real_run_on_one_cpu_rank(tmp_path):
    pytest.importorskip("deepspeed")
    (tmp_path / "hostfile").write_text("node-a slots=1\n")
    proc = trainer(tmp_path, "--steps", "3", "--save-interval", "2", "--print-every", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith("multinode_ds:")]
    assert lines[0] == "multinode_ds: training llama-tiny (0.11M params) on 1 ranks, steps 0..3"
    assert lines[1].startswith("multinode_ds: step 2/3 loss ") and lines[2].startswith("multinode_ds: step 3/3 loss ")
    assert lines[3] == "multinode_ds: rank 0 on node-a finished 3 steps" and len(lines) == 4
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step*")) == ["step2", "step3"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step3"
    assert json.loads((tmp_path / "ds_config.json").read_text())["zero_optimization"] == {"stage": 1}
    records = [json.loads(x) for x in (tmp_path / "metrics" / "rank0.jsonl").read_text().splitlines()]
    # Each checkpoint save between a save record when it begins and one when it ends (with its seconds): the watch
    # gives a save under way its own allowance (module_utils/run/pace.py).
    assert [(r["event"], r.get("step"), r.get("phase")) for r in records] == [
        ("start", None, None), ("step", 1, None), ("step", 2, None), ("save", 2, "begin"), ("save", 2, "end"),
        ("step", 3, None), ("save", 3, "begin"), ("save", 3, "end"), ("done", None, None)]
    assert all(r["seconds"] >= 0 for r in records if r.get("phase") == "end")
    assert records[0]["start_step"] == 0 and records[0]["resumed_from"] is None and records[0]["host"] == "node-a"
    steps = [r for r in records if r["event"] == "step"]
    assert records[-1]["steps"] == 3 and records[-1]["final_loss"] == steps[-1]["loss"]
    assert records[1]["tokens_per_sec"] == pytest.approx(4 * 32 / records[1]["step_time"])
    # Each step's forward passes, timed: a part of the step, the straggler score's input.
    assert all(0 < r["compute"] < r["step_time"] for r in steps)


def test_resume_if_any_starts_from_step_0_without_a_checkpoint(tmp_path, capsys):
    assert train.resume_checkpoint(args("--resume-if-any"), FakeEngine(None, None), str(tmp_path), 0) == (0, None)
    assert "no whole checkpoint to resume from, starting from step 0" in capsys.readouterr().out
    whole_tag(tmp_path, "step4")
    engine = FakeEngine(str(tmp_path / "step4"), {"step": 4})
    assert train.resume_checkpoint(args("--resume-if-any"), engine, str(tmp_path), 0)[0] == 4


def test_a_checkpoint_of_another_world_is_converted_once_by_rank_0_with_ds_to_universal(tmp_path, monkeypatch):
    import torch.distributed as dist

    whole_tag(tmp_path, "step4")
    (tmp_path / "step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(
        (tmp_path / "step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").read_bytes())
    assert checkpoints.dp_world(tmp_path / "step4") == 2
    calls = []

    def convert(argv, check):
        # What ds_to_universal leaves: a whole tag in the output folder.
        calls.append(argv)
        shutil.copytree(argv[argv.index("--input_folder") + 1], argv[argv.index("--output_folder") + 1])

    monkeypatch.setattr(subprocess, "run", convert)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    ranks = train.Ranks(0, 1, 0, "w1", True, None)
    # The same world, or no resume: a plain load.
    assert train.universal_resume(args(), str(tmp_path), ranks) is None
    assert train.universal_resume(args("--resume"), str(tmp_path), ranks._replace(world=2)) is None
    where = train.universal_resume(args("--resume-if-any"), str(tmp_path), ranks)
    assert where == str(tmp_path) + ".universal"
    argv = calls[0]
    assert argv[1:4] == ["-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder"]
    assert argv[argv.index("--output_folder") + 1] == str(tmp_path) + ".universal/step4"
    assert "--inject_missing_state" in argv and calls[1] == "barrier"
    # Another rank only waits.
    calls.clear()
    train.universal_resume(args("--resume"), str(tmp_path), ranks._replace(rank=1, world=1))
    assert calls == ["barrier"]
    # Rank 0 of a later attempt finds the conversion current; another run's step4 of the same model is not.
    calls.clear()
    train.universal_resume(args("--resume"), str(tmp_path), ranks)
    assert calls == ["barrier"]
    (tmp_path / "step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(
        (tmp_path / "step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").read_bytes() + b"")
    os.utime(tmp_path / "step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt", ns=(1, 1))
    train.universal_resume(args("--resume"), str(tmp_path), ranks)
    assert calls[1][1:3] == ["-m", "deepspeed.checkpoint.ds_to_universal"] and calls[-1] == "barrier"


def test_the_generated_config_loads_a_universal_checkpoint_and_accumulates():
    a = args("--grad-accum", "2")
    a.load_universal = True
    config = train.deepspeed_config(a, train.Ranks(0, 1, 0, "w1", True, None), 1000)
    assert config["checkpoint"] == {"load_universal": True} and config["gradient_accumulation_steps"] == 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_joins_as_soon_as_the_store_listens_not_a_retry_later(monkeypatch):
    """Ranks other than 0 poll rank 0's store every few hundredths of a second: the store opening 0.3 s late is
    joined well before torch's own second-long retry would."""
    import threading
    import time

    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "1")
    opened = {}
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_late():
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen(4)
        opened["at"] = time.monotonic()

    thread = threading.Thread(target=listen_late)
    thread.start()
    try:
        assert train.wait_for_store(timeout=10, interval=0.01) is True
        joined = time.monotonic()
    finally:
        thread.join()
        server.close()
    assert 0 <= joined - opened["at"] < 0.5


def test_rank_0_and_a_run_without_a_master_do_not_wait(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "0")
    assert train.wait_for_store(timeout=5) is True
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv("MASTER_ADDR")
    assert train.wait_for_store(timeout=5) is True


def test_a_store_that_never_opens_gives_up_after_the_timeout(monkeypatch):
    """torch's own connect then goes on (and reports the address it cannot reach)."""
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "1")
    assert train.wait_for_store(timeout=0.2, interval=0.05) is False


def test_a_checkpoint_asked_by_the_watch_is_looked_for_once_a_second_and_answered_once(tmp_path):
    asked = {"path": str(tmp_path / "control" / "SAVE"), "done": False, "looked": 0.0}
    assert train.save_asked(asked, 100.0) is False and asked["looked"] == 100.0
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "SAVE").write_text("{}")
    assert train.save_asked(asked, 100.5) is False  # looked less than a second ago
    assert train.save_asked(asked, 101.0) is True
    asked["done"] = True
    assert train.save_asked(asked, 200.0) is False
    # The answer the watch reads: the step of the checkpoint, beside the ask, written whole.
    train.save_answered(asked["path"], 61)
    answer = json.loads((tmp_path / "control" / "SAVED").read_text())
    assert answer["step"] == 61 and answer["time"] > 0
    assert sorted(p.name for p in (tmp_path / "control").iterdir()) == ["SAVE", "SAVED"]
