"""Loads a checkpoint's tokenizer from its local folder through transformers (no network)."""

from __future__ import annotations

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
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if chat_template_file is not None:
        template = Path(chat_template_file).expanduser()
        if not template.is_file():
            raise FileNotFoundError(f"--chat-template {chat_template_file!r} is not a file")
        tokenizer.chat_template = template.read_text()
    return tokenizer
