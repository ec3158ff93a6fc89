"""Training data: a byte-level tokenizer and fixed-length blocks from text files."""
from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path


class ByteTokenizer:
    """UTF-8 bytes as tokens, plus three specials; needs no download."""

    pad_id = 256
    bos_id = 257
    eos_id = 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *text.encode("utf-8"), self.eos_id]

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face tokenizer behind the ByteTokenizer's interface."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        ids = self.tok(text, add_special_tokens=True)["input_ids"]
        if self.tok.eos_token_id is not None:
            ids = ids + [self.tok.eos_token_id]
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def hf_dataset_texts(spec: str, limit: int = 100000) -> list[str]:
    """Texts of a Hugging Face dataset ``NAME[:SPLIT]`` (its ``text`` column)."""
    try:
        import datasets
    except ImportError:
        raise ValueError("--dataset needs the 'datasets' package on every node; add it to stack_packages") from None
    name, split = (spec.split(":", 1) + [""])[:2]
    ds = datasets.load_dataset(name, split=split or "train")
    if "text" not in ds.column_names:
        raise ValueError(f"dataset {name} has no 'text' column (columns: {', '.join(ds.column_names)})")
    return [t for t in ds.select(range(min(limit, len(ds))))["text"] if t and t.strip()]


def bundled_corpus() -> str:
    return resources.files("multinode_ds").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def read_texts(paths) -> list[str]:
    """Documents from .txt files (one document per blank-line separated paragraph)
    and .jsonl files (a ``text`` field per line)."""
    docs: list[str] = []
    for p in paths:
        path = Path(p)
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            if f.suffix == ".jsonl":
                for line in f.read_text(encoding="utf-8").splitlines():
                    if line.strip():
                        docs.append(json.loads(line)["text"])
            elif f.suffix in (".txt", ".md") or not path.is_dir():
                docs += [d.strip() for d in f.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    if not docs:
        raise ValueError(f"no training text found in {', '.join(map(str, paths))}")
    return docs


def make_blocks(docs: list[str], tokenizer: ByteTokenizer, seq_len: int) -> list[list[int]]:
    """Concatenate the tokenised documents and cut them into blocks of seq_len."""
    stream: list[int] = []
    for d in docs:
        stream += tokenizer.encode(d)
    n = len(stream) // seq_len
    if n == 0:
        raise ValueError(f"corpus has {len(stream)} tokens, fewer than one block of {seq_len}")
    return [stream[i * seq_len:(i + 1) * seq_len] for i in range(n)]


def rank_batches(blocks, rank: int, world_size: int, micro_batch: int, seed: int, step: int):
    """The micro-batch of ``rank`` at ``step``: every step draws one global batch from a
    seeded permutation of the blocks; rank r takes its own disjoint slice."""
    global_batch = micro_batch * world_size
    per_epoch = max(1, len(blocks) // global_batch)
    epoch, idx = divmod(step, per_epoch)
    order = list(range(len(blocks)))
    random.Random(seed + epoch).shuffle(order)
    start = idx * global_batch + rank * micro_batch
    chosen = [order[(start + k) % len(order)] for k in range(micro_batch)]
    return [blocks[i] for i in chosen]
