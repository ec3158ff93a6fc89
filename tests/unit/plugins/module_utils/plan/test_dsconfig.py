import importlib.util
import json
import re
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.dsconfig import (
    LOG_PATTERN, check_result, choose, find_in_args, translate)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "ds_config"
CONFIG_ERRORS = json.loads((FIXTURES / "deepspeed_config_errors.json").read_text())
ENGINE_ERRORS = json.loads((FIXTURES / "deepspeed_engine_errors.json").read_text())


# -- where the config is given -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", ["--deepspeed_config /shared/ds.json --lr 1e-4",
                                  "--deepspeed_config=/shared/ds.json --lr 1e-4",
                                  "--deepscale_config /shared/ds.json --lr 1e-4"])
def test_the_config_flag_is_found_and_taken_out(args):
    assert find_in_args(args) == ("/shared/ds.json", "--lr 1e-4")


def test_args_without_the_flag_are_kept_and_requoted():
    assert find_in_args("--name 'two words' --deepspeed") == (None, "--name 'two words' --deepspeed")
    assert find_in_args("") == (None, "")
    assert find_in_args(None) == (None, "")
    assert find_in_args("--deepspeed_config 'my dir/ds.json' --x") == ("my dir/ds.json", "--x")


def test_the_flag_twice_names_both():
    with pytest.raises(ValueError) as err:
        find_in_args("--deepspeed_config a.json --deepscale_config=b.json")
    assert "--deepspeed_config a.json" in str(err.value) and "--deepscale_config=b.json" in str(err.value)


@pytest.mark.parametrize("args", ["--deepspeed_config", "--deepspeed_config --lr 1"])
def test_the_flag_without_a_file_is_refused(args):
    with pytest.raises(ValueError, match="no file after it"):
        find_in_args(args)


def test_choose_takes_the_one_given():
    assert choose("/shared/a.json", "--lr 1") == ("/shared/a.json", "--lr 1")
    assert choose(None, "--deepspeed_config=/shared/b.json --lr 1") == ("/shared/b.json", "--lr 1")
    assert choose("", "--lr 1") == (None, "--lr 1")


def test_choose_refuses_both():
    with pytest.raises(ValueError) as err:
        choose("A", "--deepspeed_config B --lr 1")
    assert str(err.value) == "ds_config given twice: -e ds_config=A and --deepspeed_config B in args \u2014 keep one"


# -- DeepSpeed's texts, worded -------------------------------------------------------------------------------------

def test_batch_sum_names_the_values_and_the_right_total():
    assert translate(CONFIG_ERRORS["batch_mismatch"]) == (
        "train_batch_size", "ds_config: train_batch_size 32 \u2260 micro batch 4 \u00d7 accumulation 2 \u00d7 world 2",
        "set train_batch_size to 16, or remove it and DeepSpeed derives it")


def test_batch_sum_in_a_rank_log_line():
    line = (FIXTURES / "rank0_batch_assertion.log").read_text().splitlines()[-1]
    key, message, fix = translate(line)
    assert key == "train_batch_size" and "world 1" in message and "set train_batch_size to 8" in fix


@pytest.mark.parametrize("name, key, words", [
    ("train_batch_not_positive", "train_batch_size", "train_batch_size is -2"),
    ("micro_batch_not_positive", "train_micro_batch_size_per_gpu", "micro batch per GPU is 0 at world size 2"),
    ("grad_acc_not_positive", "gradient_accumulation_steps", "gradient_accumulation_steps is 0 at world size 2"),
    ("batch_missing", "train_micro_batch_size_per_gpu", "neither train_batch_size nor"),
    ("fp16_and_bf16", "fp16.enabled", "fp16.enabled and bf16.enabled are both true"),
    ("duplicate_keys", "a", "a given twice"),
])
def test_each_config_assertion_is_worded(name, key, words):
    got = translate(CONFIG_ERRORS[name], world_size=2)
    assert got is not None, name
    assert got[0] == key and words in got[1] and got[2], got


def test_pydantic_errors_name_the_field_and_the_value():
    key, message, fix = translate(CONFIG_ERRORS["pydantic_extra"], key="zero_optimization.stagee")
    assert key == "zero_optimization.stagee" and "not a key of DeepSpeed's DeepSpeedZeroConfig" in message
    assert "spelling" in fix
    key, message, _fix = translate(CONFIG_ERRORS["pydantic_enum"])
    # The model names the section (a rank's log has no config to look it up in).
    assert key == "zero_optimization.stage"
    assert message.startswith("ds_config: zero_optimization.stage 7: Input should be 0, 1, 2, 3")


def test_fp16_on_cpu_workers():
    assert translate(ENGINE_ERRORS["fp16_unsupported"], accelerator="cpu") == (
        "fp16.enabled", "ds_config: fp16.enabled on CPU workers (no fp16 kernels)",
        "set it false, or bf16 if the workers' CPUs support it")


def test_bf16_unsupported_suggests_fp16():
    key, message, fix = translate(ENGINE_ERRORS["bf16_unsupported"], accelerator="cuda")
    assert key == "bf16.enabled" and "CUDA workers" in message and "fp16" in fix
    assert "workers whose accelerator has none" in translate(ENGINE_ERRORS["bf16_unsupported"])[1]


def test_unknown_optimizer_and_scheduler_list_deepspeeds_names():
    key, message, fix = translate(ENGINE_ERRORS["optimizer_unknown"], known=["adam", "adamw"])
    assert key == "optimizer.type" and "Adamm" in message and "one of adam, adamw" in fix
    key, message, fix = translate(ENGINE_ERRORS["scheduler_unknown"])
    assert key == "scheduler.type" and "WarmupLRR" in message and "torch.optim.lr_scheduler" in fix


def test_nvme_without_path_names_the_section():
    key, message, _fix = translate(ENGINE_ERRORS["nvme_path_missing"],
                                   key="zero_optimization.offload_optimizer.nvme_path")
    assert key == "zero_optimization.offload_optimizer.nvme_path"
    assert "offload_optimizer.device is nvme" in message


def test_ds_checks_own_texts():
    key, message, fix = translate("DeepSpeedConfig does not read key 'train_batch_sise'",
                                  known=["train_batch_size", "steps_per_print"])
    assert key == "train_batch_sise" and "ignores it" in message and "did you mean train_batch_size?" in fix
    key, message, fix = translate("zero_optimization.offload_param.device cpu needs ZeRO stage 3 (stage is 2)")
    assert key == "zero_optimization.offload_param.device" and "ignores it" in message
    assert fix == "set zero_optimization.stage to 3, or remove offload_param"
    key, message, _fix = translate("/x/ds.json is not JSON: line 3 column 7: Expecting ',' delimiter")
    assert message == "ds_config: /x/ds.json is not JSON (line 3, column 7: Expecting ',' delimiter)"


def test_log_pattern_finds_the_line_the_diagnosis_words():
    """What run/diagnose.py does with a rank's log: the first line LOG_PATTERN finds, worded by translate."""
    lines = (FIXTURES / "rank0_batch_assertion.log").read_text().splitlines()
    hits = [line for line in lines if re.search(LOG_PATTERN, line)]
    assert hits == [lines[-1]] and translate(hits[0])[0] == "train_batch_size"
    for text in list(CONFIG_ERRORS.values())[1:] + list(ENGINE_ERRORS.values())[1:]:
        if "\n" not in text:  # pydantic's take three lines: not a log rule
            assert re.search(LOG_PATTERN, text), text
    for other in (FIXTURES.parent / "logs").glob("*.log"):
        assert not re.search(LOG_PATTERN, other.read_text()), other.name


@pytest.mark.parametrize("text", ["", None, "rank 0 finished", "AssertionError: something else entirely"])
def test_other_texts_are_not_config_errors(text):
    assert translate(text) is None


def test_the_fixture_texts_are_still_deepspeeds():
    """The fixed parts of the texts, in the installed DeepSpeed's source (skipped where DeepSpeed is not)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None:
        pytest.skip("DeepSpeed is not installed here")
    root = Path(spec.origin).parent
    source = "".join((root / p).read_text() for p in ("runtime/config.py", "runtime/engine.py",
                                                      "runtime/zero/partition_parameters.py"))
    for fixed in ("to micro_batch_per_gpu * gradient_acc_step * world_size ", "has to be greater than 0",
                  "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided",
                  "bfloat16 and fp16 modes cannot be simultaneously enabled",
                  "Type fp16 is not supported on your device.",
                  "Type bf16 is not supported on your device.", "DeepSpeed does not recognize LR scheduler",
                  '"nvme_path" in DeepSpeed Config cannot be None if remote device is', "getattr(torch.optim, "):
        assert fixed in source, fixed


# -- ds_check's output, for the play -------------------------------------------------------------------------------

def test_check_result_of_the_seed_config():
    errors = check_result((FIXTURES / "ds_check_seed_world2_cpu.json").read_text())
    assert errors == [
        "ds_config: train_batch_size 32 \u2260 micro batch 4 \u00d7 accumulation 2 \u00d7 world 2 \u2014 "
        "set train_batch_size to 16, or remove it and DeepSpeed derives it",
        "ds_config: fp16.enabled on CPU workers (no fp16 kernels) \u2014 "
        "set it false, or bf16 if the workers' CPUs support it"]


def test_check_result_words_bare_deepspeed_texts():
    """A node package without the table gives DeepSpeed's text alone: the controller words it."""
    report = {"ok": False, "accelerator": "cpu", "derived": {}, "problems": [
        {"key": "fp16.enabled", "message": "ds_config: Type fp16 is not supported on your device.", "fix": "",
         "text": ENGINE_ERRORS["fp16_unsupported"]},
        {"key": "", "message": "ds_config: Nebula checkpointing has been removed.", "fix": "", "text": "Nebula..."}]}
    assert check_result(json.dumps(report)) == [
        "ds_config: fp16.enabled on CPU workers (no fp16 kernels) \u2014 set it false, or bf16 if the workers' CPUs "
        "support it", "ds_config: Nebula checkpointing has been removed."]


def test_check_result_ok_and_garbage():
    assert check_result('{"ok": true, "problems": [], "derived": {"train_batch_size": 16}}') == []
    got = check_result("Traceback ...\nImportError: no deepspeed")
    assert got == ["ds_check gave no result: ImportError: no deepspeed"]
    assert check_result("") == ["ds_check gave no result: no output"]
    assert check_result('{"ok": false, "problems": []}') == ["ds_check found the config unusable but named no problem"]


# -- issue 44: what DeepSpeedConfig computes with unchecked, sections that are not, ops, nesting -------------------

def test_a_value_of_the_wrong_kind_names_the_key_the_value_and_the_fix():
    key, message, fix = translate('DeepSpeedConfig reads train_batch_size as a whole number of at least 1, not '
                                  '"sixteen"')
    assert key == "train_batch_size"
    assert message == 'ds_config: train_batch_size is "sixteen"; DeepSpeed reads it as a whole number of at least 1'
    assert fix.startswith("set train_batch_size to a whole number of at least 1, such as 16 (JSON, without quotes)")
    key, message, fix = translate('DeepSpeedConfig reads prescale_gradients as true or false, not "false"')
    assert (key, fix) == ("prescale_gradients", "set prescale_gradients to true or false, such as true (JSON, "
                                                "without quotes)")


def test_a_section_given_as_a_value_is_named():
    text = "deepspeed.runtime.zero.config.DeepSpeedZeroConfig() argument after ** must be a mapping, not int"
    key, message, fix = translate(text)
    assert key == "zero_optimization"
    assert message == "ds_config: zero_optimization is a number, not a section; DeepSpeed reads it as a JSON object"
    assert fix.startswith("give zero_optimization an object ({...}) of its keys, or remove it")
    assert translate("DeepSpeedConfig reads activation_checkpointing as a section, not 3")[0] == (
        "activation_checkpointing")


def test_pydantic_in_a_rank_log_finds_its_section_from_the_model_and_the_choices():
    key, message, fix = translate("1 validation error for DeepSpeedZeroConfig\noffload_optimizer.device\n  Input "
                                  "should be 'none', 'cpu' or 'nvme' [type=enum, input_value='gpu', input_type=str]")
    assert key == "zero_optimization.offload_optimizer.device" and "'gpu'" in message
    assert fix == "set zero_optimization.offload_optimizer.device to one of 'none', 'cpu', 'nvme'"
    key, _message, fix = translate("1 validation error for DeepSpeedMonitorConfig\ntensorboard\n  Input should be a "
                                   "valid dictionary or instance of TensorBoardConfig [type=model_type, "
                                   "input_value=2, input_type=int]")
    assert key == "tensorboard" and fix == "set tensorboard to a valid dictionary or instance of TensorBoardConfig"


def test_an_op_the_workers_lack_names_it_and_what_they_have():
    key, message, fix = translate("DeepSpeed's fused_lamb (FusedLambBuilder) does not exist for the cpu accelerator")
    assert key == "optimizer.type"
    assert message == ("ds_config: needs DeepSpeed's fused_lamb op (FusedLambBuilder), which the cpu accelerator "
                       "does not have (the engine would fail at its start)")
    assert "Lamb and Lion without offload need GPU workers" in fix
    key, message, fix = translate("DeepSpeed's async_io (AsyncIOBuilder) cannot be built on this node for the cpu "
                                  "accelerator: libaio is missing")
    assert key == "zero_optimization" and message.endswith("cannot be built on the cpu workers: libaio is missing")


def test_a_batch_size_given_as_text_in_a_rank_log():
    lines = (FIXTURES / "rank0_batch_text.log").read_text().splitlines()
    key, message, fix = translate(lines[-1])
    assert key == "train_batch_size" and "a batch size is not a number" in message and "sixteen" in fix
    assert re.search(LOG_PATTERN, lines[-1])


def test_nesting_is_found_without_recursion():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.dsconfig import (  # noqa: E501 pylint: disable=import-outside-toplevel
        MAX_DEPTH, depth_problem, too_deep)
    deep = []
    for _level in range(100000):  # far past Python's recursion limit
        deep = [deep]
    assert too_deep({"a": deep}).startswith("a[0][0]")
    assert too_deep({"zero_optimization": {"offload_param": {"device": "cpu"}}}) is None
    assert too_deep({"a": [{"b": 1}]}, limit=2) == "a[0]"
    assert MAX_DEPTH == 32
    assert depth_problem("ds.json", "a" + "[0]" * 40) == (
        "ds_config=ds.json nests deeper than 32 levels (at a" + "[0]" * 18 + "[0..."
        "): not a DeepSpeed config. Fix: give your DeepSpeed JSON config (its sections nest a few levels)")
