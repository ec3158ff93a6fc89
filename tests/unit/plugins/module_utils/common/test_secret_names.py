"""Secret names (common/secret_names.py): which variables hold secrets, and an environment with their values masked."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.secret_names import mask_env, secret_name


def test_secrets_are_masked_and_paths_kept():
    env = {"HF_TOKEN": "hf_abc", "WANDB_API_KEY": "k", "MY_PASSWORD": "p", "HF_TOKEN_PATH": "/opt/x/hf_token",
           "DS_ACCELERATOR": "cpu"}
    assert mask_env(env) == {"HF_TOKEN": "********", "WANDB_API_KEY": "********", "MY_PASSWORD": "********",
                             "HF_TOKEN_PATH": "/opt/x/hf_token", "DS_ACCELERATOR": "cpu"}


def test_a_secret_is_named_by_its_words_and_a_path_to_one_is_not():
    assert [secret_name(k) for k in ("HF_TOKEN", "comet.api_key", "db_passwd", "HF_TOKEN_PATH", "KEY_FILE", "STEPS")] \
        == [True, True, True, False, False, False]
