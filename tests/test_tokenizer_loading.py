"""`load_tokenizer` builds the class AutoTokenizer would, by the short path where the folder
names `PreTrainedTokenizerFast`, and by AutoTokenizer otherwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import AutoTokenizer

from radixgen.runtime.tokenizer import _names_the_fast_base_class, load_tokenizer

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
