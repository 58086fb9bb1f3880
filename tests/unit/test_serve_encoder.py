"""The slim server's tokenizer (TextEncoder.from_tokenizer_json: tokenizer.json through `tokenizers` alone) gives
transformers' ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distrinews.model import build_tokenizer
from distrinews.predict.tokens import TextEncoder

TEXTS = [
    "Stocks rally as oil prices fall",
    "x",
    "Ünïcödé headline — with dashes, émojis 📰 and CJK 東京",
    " ".join(["a very long headline"] * 60),  # truncated
    "",
]


def encode(directory, max_length, texts):
    encoder = TextEncoder.from_tokenizer_json(directory, max_length)
    return encoder.collate(encoder.encode(texts))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tokenizer = build_tokenizer("minilm")
    directory = tmp_path_factory.mktemp("tok")
    # save_pretrained after a fixed-length call stores that padding and truncation in tokenizer.json:
    # the encoder must override both, as transformers does per call.
    tokenizer(["warm"], padding="max_length", max_length=128, truncation=True)
    tokenizer.save_pretrained(directory)
    return tokenizer, directory


@pytest.mark.parametrize("max_length", [16, 64])
def test_same_ids_mask_and_types_as_transformers(saved, max_length):
    tokenizer, directory = saved
    expected = tokenizer(TEXTS, truncation=True, max_length=max_length, padding=True, return_tensors="np")
    got = encode(directory, max_length, TEXTS)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert got[key].dtype == np.int64
        np.testing.assert_array_equal(got[key], expected[key].astype(np.int64))
    assert got["input_ids"].shape[1] == max_length  # the long text is truncated, the batch padded to it


def test_a_batch_pads_to_its_own_longest_text(saved):
    _, directory = saved
    got = encode(directory, 128, ["short one", "two"])
    assert got["input_ids"].shape == (2, 4)  # [CLS] short one [SEP]; not the stored 128


def test_an_unknown_pad_token_is_a_clear_error(saved, tmp_path):
    import json
    import shutil

    _, directory = saved
    broken = Path(shutil.copytree(directory, tmp_path / "broken"))
    config = json.loads((broken / "tokenizer_config.json").read_text())
    config["pad_token"] = "<nope>"
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="padding token '<nope>' is not in the vocabulary"):
        TextEncoder.from_tokenizer_json(broken, 64)


@pytest.mark.parametrize("max_length", [8, 16])
def test_encode_fitted_keeps_a_long_texts_last_whole_words_or_refuses_it_tokenizing_each_text_once(saved, max_length):
    """TEI's ``truncation_direction: left``: the last whole words that fit, with the special tokens around them,
    the ids the text cut at that word would give; ``truncate: false``: a text over ``max_length`` is refused."""
    from distrinews.predict.tokens import TextTooLong

    encoder = TextEncoder.from_tokenizer_json(saved[1], max_length)
    texts = [*TEXTS[:4], "supercalifragilisticexpialidocious " * 3, "word " * (max_length - 2)]
    whole = encoder._whole.encode_batch(texts)
    fitted = encoder.encode_fitted(texts, keep_end=True)
    for text, enc, kept in zip(texts, whole, fitted):
        assert len(kept) <= max_length
        if len(enc.ids) <= max_length:
            assert kept.ids.tolist() == enc.ids  # a text that fits is kept whole
            continue
        content = [i for i, special in enumerate(enc.special_tokens_mask) if not special]
        first = len(enc.ids) - len(kept) + 1  # its first kept content token: [CLS] stays in front
        assert kept.ids.tolist() == [enc.ids[0], *enc.ids[first:]]
        assert first > content[0]
        if enc.word_ids[first] == enc.word_ids[first - 1]:  # only a word longer than the budget is cut inside
            assert len(kept) == max_length and len(set(enc.word_ids[first:-1])) == 1, text
            continue
        assert kept.ids.tolist() == encoder.encode([text[enc.offsets[first][0] :]])[0].ids.tolist()
    assert [e.ids.tolist() for e in encoder.encode_fitted(texts[:2], truncate=False)] == [
        e.ids.tolist() for e in encoder.encode(texts[:2])
    ]
    with pytest.raises(TextTooLong) as refused:
        encoder.encode_fitted(texts, truncate=False)
    assert refused.value.max_length == max_length and refused.value.tokens == len(whole[2].ids)
