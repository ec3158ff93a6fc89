import json

import pytest

from multinode_ds import data


def test_byte_tokenizer_round_trip():
    tok = data.ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert max(ids) < tok.vocab_size
    assert tok.decode(ids) == "héllo"


def test_bundled_corpus_is_shipped_and_long_enough():
    text = data.bundled_corpus()
    blocks = data.make_blocks([text], data.ByteTokenizer(), 64)
    assert len(blocks) >= 40 and all(len(b) == 64 for b in blocks)


def test_read_texts_txt_and_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("one\n\ntwo\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "three"}) + "\n\n")
    assert data.read_texts([tmp_path]) == ["one", "two", "three"]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="no training text"):
        data.read_texts([empty])


def test_make_blocks_too_short():
    with pytest.raises(ValueError, match="fewer than one block"):
        data.make_blocks(["hi"], data.ByteTokenizer(), 64)


def test_ranks_get_disjoint_slices_of_each_global_batch():
    blocks = [[i] for i in range(100)]
    for step in range(5):
        r0 = data.rank_batches(blocks, 0, 2, 4, seed=1, step=step)
        r1 = data.rank_batches(blocks, 1, 2, 4, seed=1, step=step)
        assert len(r0) == len(r1) == 4
        assert not {b[0] for b in r0} & {b[0] for b in r1}
    assert data.rank_batches(blocks, 0, 2, 4, 1, 3) == data.rank_batches(blocks, 0, 2, 4, 1, 3)
