import pytest

from multinode_ds.models import REGISTRY, build_model, get_spec


def test_llama_is_llama_3_1_8b():
    spec = get_spec("llama")
    c = spec.config
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]) == (
        4096, 32, 32, 8)
    assert c["vocab_size"] == 128256 and c["intermediate_size"] == 14336
    assert c["rope_scaling"]["rope_type"] == "llama3"
    # Llama 3.1 8B has 8.03 billion parameters.
    assert spec.n_params() == 8_030_261_248


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown model 'gpt5'; known models: .*llama-tiny"):
        get_spec("gpt5")


@pytest.mark.parametrize("name", [n for n, s in REGISTRY.items() if s.byte_tokenizer])
def test_tiny_param_count_matches_the_built_model(name):
    pytest.importorskip("transformers")
    spec = get_spec(name)
    model = build_model(spec, seed=0)
    assert sum(p.numel() for p in model.parameters()) == spec.n_params()


def test_pretrained_weights_from_a_local_directory(tmp_path):
    pytest.importorskip("transformers")
    from multinode_ds import train
    spec = get_spec("llama-tiny")
    model = build_model(spec, seed=3)
    model.save_pretrained(tmp_path / "weights")
    args = train.parse_args(["--run-dir", str(tmp_path), "--model-path", str(tmp_path / "weights")])
    loaded, tok = train.load_model_and_tokenizer(spec, args)
    a = dict(model.named_parameters())
    for name, param in loaded.named_parameters():
        assert (param == a[name]).all(), name
    # No tokenizer saved with these weights: the byte tokenizer fits the vocabulary.
    assert tok.encode("ab")[1:3] == [97, 98]
