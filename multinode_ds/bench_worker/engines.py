"""The inference engines: which device and engine a slot uses (and why, in words), loading the model, and
timing one prompt's prefill and decode at batch size 1 (Hugging Face transformers or vLLM)."""
from __future__ import annotations

import importlib.util
import os
import time
from typing import NamedTuple

from .protocol import BenchError


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_device(asked: str) -> str:
    """``cpu`` or ``cuda`` for the work file's ``device`` (auto: cuda when torch sees a GPU)."""
    if asked == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if asked == "cuda" and not available:
        raise BenchError("device=cuda but torch.cuda.is_available() is False on this node (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Use device=auto or cpu, or install "
                         "a CUDA build of torch.")
    return "cuda" if available else "cpu"


def choose_engine(asked: str, device: str, model_path: str, have_vllm: bool) -> tuple[str, str]:
    """The engine to run and why, in words."""
    if asked == "hf":
        return "hf", "engine=hf asked for"
    if asked == "vllm":
        if not have_vllm:
            raise BenchError("engine=vllm but vllm is not installed in this node's venv. Install it on the GPU "
                             "nodes, or use engine=auto or hf.")
        if not model_path:
            raise BenchError("engine=vllm needs model_path (a local directory or hub id); the registry's random "
                             "models run only on engine=hf.")
        return "vllm", "engine=vllm asked for"
    if not have_vllm:
        return "hf", "vllm is not installed: Hugging Face transformers"
    if device != "cuda":
        return "hf", f"vllm is installed but the device is {device}: Hugging Face transformers"
    if not model_path:
        return "hf", "vllm is installed but the model has random weights (no model_path): Hugging Face transformers"
    return "vllm", "vllm is installed and the device is cuda"


class Sample(NamedTuple):
    """One sample's measurement."""

    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_s: float
    # Tokens made in the decode time: the first generated token comes out of the prefill.
    decode_tokens: int


class Engine:
    """What the benchmark needs from an engine: ``infer`` one prompt, batch size 1."""

    name = "none"
    dtype: str | None = None

    def validate(self, prompts: list[str]) -> None:
        """Raise BenchError before the go when a prompt cannot be run."""

    def infer(self, prompt: str) -> Sample:
        raise NotImplementedError


class HFEngine(Engine):
    """Hugging Face transformers: a prefill forward pass, then greedy one-token steps with the KV cache."""

    name = "hf"

    def __init__(self, model, tokenizer, device, max_new_tokens: int):
        import torch

        self.torch = torch
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.max_new_tokens = max_new_tokens
        self.dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        cfg = model.config
        self.context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    def validate(self, prompts: list[str]) -> None:
        if not self.context:
            return
        for text in prompts:
            n = len(self.tokenizer.encode(text))
            if n + self.max_new_tokens > self.context:
                raise BenchError(f"a prompt has {n} tokens; with max_new_tokens {self.max_new_tokens} it exceeds "
                                 f"the model's context of {self.context}. Use shorter prompts or fewer new tokens.")

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def infer(self, prompt: str) -> Sample:
        torch = self.torch
        ids = self.tokenizer.encode(prompt)
        with torch.inference_mode():
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            self.sync()
            t0 = time.perf_counter()
            out = self.model(input_ids=x, use_cache=True)
            token = out.logits[:, -1, :].argmax(-1, keepdim=True)
            self.sync()
            t1 = time.perf_counter()
            for _step in range(self.max_new_tokens - 1):
                out = self.model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
                token = out.logits[:, -1, :].argmax(-1, keepdim=True)
            self.sync()
            t2 = time.perf_counter()
        return Sample(len(ids), self.max_new_tokens, t1 - t0, t2 - t1, self.max_new_tokens - 1)


class VLLMEngine(Engine):
    """vLLM: a 1-token generate for the prefill time, then the sample's full generate."""

    name = "vllm"

    def __init__(self, model_path: str, max_new_tokens: int):
        import vllm

        # Prefix caching off: the full generate must prefill again, as a fresh request would.
        self.llm = vllm.LLM(model=model_path, enable_prefix_caching=False, seed=0)
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        self.dtype = str(getattr(config, "dtype", "")).replace("torch.", "") or None
        m = max_new_tokens
        self.first = vllm.SamplingParams(max_tokens=1, min_tokens=1, ignore_eos=True, temperature=0)
        self.full = vllm.SamplingParams(max_tokens=m, min_tokens=m, ignore_eos=True, temperature=0)

    def infer(self, prompt: str) -> Sample:
        t0 = time.perf_counter()
        self.llm.generate([prompt], self.first, use_tqdm=False)
        t1 = time.perf_counter()
        out = self.llm.generate([prompt], self.full, use_tqdm=False)[0]
        t2 = time.perf_counter()
        prefill = t1 - t0
        generated = len(out.outputs[0].token_ids)
        return Sample(len(out.prompt_token_ids), generated, prefill, max(0.0, (t2 - t1) - prefill),
                      max(0, generated - 1))


def load_hf(model: str, model_path: str, device: str, max_new_tokens: int) -> HFEngine:
    """The model (registry random weights, or from_pretrained) on ``device``, in eval mode."""
    import torch

    from .. import data
    from ..models import build_model

    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    dtype = torch.float32
    if dev.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if not model_path:
        spec = registry_spec(model)
        net, tok = build_model(spec, seed=0), data.ByteTokenizer()
    else:
        import transformers

        net = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        try:
            tok = data.HFTokenizer(transformers.AutoTokenizer.from_pretrained(model_path))
        except (OSError, ValueError):
            if net.config.vocab_size < data.ByteTokenizer.vocab_size:
                raise BenchError(f"{model_path} has no tokenizer and a vocabulary too small for bytes") from None
            tok = data.ByteTokenizer()
    net = net.to(device=dev, dtype=dtype).eval()
    return HFEngine(net, tok, dev, max_new_tokens)


def registry_spec(model: str):
    """The registry entry for a run without model_path; BenchError when it cannot run with random weights."""
    from ..models import get_spec

    try:
        spec = get_spec(model)
    except KeyError as exc:
        raise BenchError(f"{exc.args[0]}. Set model to one of them, or model_path to a local directory or "
                         f"hub id.") from None
    if not spec.byte_tokenizer:
        raise BenchError(f"model {model!r} needs its weights and tokenizer: set model_path (a local directory or "
                         f"hub id), or use a tiny registry model such as llama-tiny.")
    return spec


def load_engine(engine: str, work: dict, device: str) -> Engine:
    if engine == "vllm":
        return VLLMEngine(work["model_path"], int(work["max_new_tokens"]))
    return load_hf(work["model"], work["model_path"], device, int(work["max_new_tokens"]))
