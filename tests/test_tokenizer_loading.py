"""`load_tokenizer` builds the class AutoTokenizer would, by the short path where the folder
names `PreTrainedTokenizerFast`, and by AutoTokenizer otherwise; `load_decoder` decodes as it."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from radixgen.runtime.detokenizer import decode_batch
from radixgen.runtime.tokenizer import (
    TokenizerDecoder,
    _names_the_fast_base_class,
    decodes_as_its_backend,
    load_decoder,
    load_tokenizer,
)

TEXTS = [
    "def f(x):\n    return x  # ünïcode ✓",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]


def assert_same_tokenizer(ours, theirs):
    assert type(ours) is type(theirs)
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id) == (
        theirs.eos_token_id,
        theirs.pad_token_id,
        theirs.bos_token_id,
    )
    assert len(ours) == len(theirs)
    for text in TEXTS:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids
        assert ours.decode(ids) == theirs.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
            ids, skip_special_tokens=True
        )
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages, tokenize=False) == theirs.apply_chat_template(
        messages, tokenize=False
    )


def test_the_fast_path_builds_what_autotokenizer_builds(tiny_model_path):
    folder = tiny_model_path
    assert _names_the_fast_base_class(Path(folder))
    theirs = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert_same_tokenizer(load_tokenizer(folder), theirs)


def test_other_folders_go_through_autotokenizer(tiny_model_path, tmp_path):
    """No `tokenizer_class` in tokenizer_config.json: AutoTokenizer decides, as before."""
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(f"{tiny_model_path}/{name}", tmp_path / name)
    config = json.loads(Path(tiny_model_path, "tokenizer_config.json").read_text())
    del config["tokenizer_class"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert not _names_the_fast_base_class(tmp_path)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert_same_tokenizer(load_tokenizer(tmp_path), theirs)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert not _names_the_fast_base_class(tmp_path)


def test_the_decoder_decodes_as_the_tokenizer_without_transformers(tiny_model_path):
    """The detokenizer's `load_decoder`: for the tiny's folder a `TokenizerDecoder` over
    tokenizer.json, whose text equals transformers' tokenizer's for random ids (special tokens
    and bytes of split characters included), each alone and batched; loaded in a fresh
    interpreter, it imports neither transformers nor torch."""
    decoder = load_decoder(tiny_model_path)
    assert isinstance(decoder, TokenizerDecoder)
    tokenizer = load_tokenizer(tiny_model_path)
    generator = random.Random(0)
    sequences = [[0, 1, 2], []] + [
        [generator.randrange(len(tokenizer)) for _ in range(generator.randrange(1, 40))]
        for _ in range(50)
    ]
    for skip in (False, True):
        expected = [tokenizer.decode(ids, skip_special_tokens=skip) for ids in sequences]
        assert [decoder.decode(ids, skip_special_tokens=skip) for ids in sequences] == expected
        assert decode_batch(decoder, sequences, skip) == expected
    probe = (
        "import sys; from radixgen.runtime.tokenizer import load_decoder; "
        f"load_decoder({str(tiny_model_path)!r}); "
        "print('transformers' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False"], done.stderr


def _tiny_copy(tiny_model_path, folder: Path, config_changes: dict, unmark: str | None = None):
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(f"{tiny_model_path}/{name}", folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | config_changes))
    if unmark is not None:  # an added token tokenizer.json does not mark special
        backend = json.loads((folder / "tokenizer.json").read_text())
        for token in backend["added_tokens"]:
            token["special"] = token["special"] and token["content"] != unmark
        (folder / "tokenizer.json").write_text(json.dumps(backend))


def test_the_decoder_is_transformers_tokenizer_where_it_would_decode_otherwise(
    tiny_model_path, tmp_path
):
    """A clean-up pass, a special token that only the config names special, or an added token
    the config marks otherwise: `load_decoder` gives transformers' tokenizer (whatever
    transformers makes of such a token at load, the decoder does not guess it)."""
    cases = {
        "cleanup": ({"clean_up_tokenization_spaces": True}, None),
        "config-only special": ({}, "<|im_start|>"),
        "added_tokens_decoder": (
            {"added_tokens_decoder": {"1": {"content": "<|im_start|>", "special": False}}},
            None,
        ),
    }
    for name, (changes, unmark) in cases.items():
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        _tiny_copy(tiny_model_path, folder, changes, unmark)
        assert not decodes_as_its_backend(folder), name
        assert not isinstance(load_decoder(folder), TokenizerDecoder), name
    assert decodes_as_its_backend(Path(tiny_model_path))
