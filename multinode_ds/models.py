"""Model registry of the bundled trainer.

Each entry names a model family and the architecture hyper-parameters.  The
``llama`` entry is the Llama 3.1 8B architecture; ``llama-tiny`` is a
random-initialised miniature of it that trains on CPU in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

BYTE_VOCAB = 256 + 3  # bytes + pad/bos/eos, see data.ByteTokenizer


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    config: dict = field(default_factory=dict)
    description: str = ""
    # True when the model trains with the built-in byte tokenizer (random init);
    # False when it needs the model's own tokenizer and weights.
    byte_tokenizer: bool = False

    def n_params(self) -> int:
        """Parameter count from the architecture, without building the model."""
        c = self.config
        if self.family == "llama":
            h, i, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
            heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
            head_dim = h // heads
            attn = h * h * 2 + h * (kv * head_dim) * 2
            mlp = 3 * h * i
            norms = 2 * h
            per_layer = attn + mlp + norms
            emb = c["vocab_size"] * h
            lm_head = 0 if c.get("tie_word_embeddings") else c["vocab_size"] * h
            return layers * per_layer + emb + lm_head + h
        if self.family == "gpt2":
            h, layers, v, pos = c["n_embd"], c["n_layer"], c["vocab_size"], c["n_positions"]
            per_layer = 12 * h * h + 13 * h
            return layers * per_layer + v * h + pos * h + 2 * h
        raise ValueError(f"unknown family {self.family}")


REGISTRY: dict[str, ModelSpec] = {
    "llama": ModelSpec(
        name="llama",
        family="llama",
        description="Llama 3.1 8B architecture",
        config=dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            hidden_act="silu",
            tie_word_embeddings=False,
            bos_token_id=128000,
            eos_token_id=128001,
        ),
    ),
    "llama-tiny": ModelSpec(
        name="llama-tiny",
        family="llama",
        description="random-initialised tiny Llama for CPU clusters and tests",
        byte_tokenizer=True,
        config=dict(
            vocab_size=BYTE_VOCAB,
            hidden_size=64,
            intermediate_size=172,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            hidden_act="silu",
            tie_word_embeddings=True,
        ),
    ),
    "gpt2-tiny": ModelSpec(
        name="gpt2-tiny",
        family="gpt2",
        description="random-initialised tiny GPT-2 for CPU clusters and tests",
        byte_tokenizer=True,
        config=dict(vocab_size=BYTE_VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512),
    ),
}


def get_spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown model {name!r}; known models: {known}") from None


def build_model(spec: ModelSpec, seed: int = 0):
    """Build a random-initialised model for ``spec`` (transformers is imported here)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if spec.family == "llama":
        cfg = transformers.LlamaConfig(**spec.config)
        return transformers.LlamaForCausalLM(cfg)
    if spec.family == "gpt2":
        cfg = transformers.GPT2Config(**spec.config)
        return transformers.GPT2LMHeadModel(cfg)
    raise ValueError(f"unknown family {spec.family}")
