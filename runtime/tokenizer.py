"""Loads a checkpoint's tokenizer from its local folder through transformers (no network)."""

from __future__ import annotations

import json
from pathlib import Path


def load_tokenizer(path: str | Path, chat_template_file: str | None = None):
    """Returns the transformers tokenizer stored in the folder `path` (local files only).

    `path` "tiny" resolves to the embedded default model (built on first use), a Hub ID to its
    snapshot in the local Hugging Face cache. `chat_template_file` (`--chat-template`): a Jinja
    file that replaces the tokenizer's chat template.

    Raises:
        FileNotFoundError: the folder (or the template file) does not exist, or the folder
            holds no tokenizer files.
    """
    from transformers import AutoTokenizer

    from radixgen.runtime.tiny_model import resolve_model_path

    folder = Path(resolve_model_path(str(path)))
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer path {str(path)!r} is not a folder")
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if not any((folder / name).is_file() for name in tokenizer_files):
        raise FileNotFoundError(f"tokenizer path {str(path)!r} has none of {list(tokenizer_files)}")
    if _names_the_fast_base_class(folder):
        # The class AutoTokenizer would pick, without the model config it also loads (in a
        # fresh process, importing the config's module costs ~2 s on the 2-core machine, in
        # each of a server's three processes).
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if chat_template_file is not None:
        template = Path(chat_template_file).expanduser()
        if not template.is_file():
            raise FileNotFoundError(f"--chat-template {chat_template_file!r} is not a file")
        tokenizer.chat_template = template.read_text()
    return tokenizer


def _names_the_fast_base_class(folder: Path) -> bool:
    """Whether the folder's tokenizer_config.json names `PreTrainedTokenizerFast` (Llama 3, the
    embedded tiny, ...) beside a tokenizer.json: AutoTokenizer would build exactly that class."""
    config = folder / "tokenizer_config.json"
    if not (config.is_file() and (folder / "tokenizer.json").is_file()):
        return False
    try:
        return json.loads(config.read_text()).get("tokenizer_class") == "PreTrainedTokenizerFast"
    except (OSError, ValueError, AttributeError):
        return False  # AutoTokenizer reports what is wrong with the file
