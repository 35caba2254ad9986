"""Loads a checkpoint's tokenizer from its local folder through transformers (no network), and a
decoding-only tokenizer for the detokenizer process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_tokenizer(path: str | Path, chat_template_file: str | None = None):
    """Returns the transformers tokenizer stored in the folder `path` (local files only).

    `path` "tiny" resolves to the embedded default model (built on first use), a Hub ID to its
    snapshot in the local Hugging Face cache. `chat_template_file` (`--chat-template`): a Jinja
    file that replaces the tokenizer's chat template.

    Raises:
        FileNotFoundError: the folder (or the template file) does not exist, or the folder
            holds no tokenizer files.
    """
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
        # Imported only here: resolving AutoTokenizer walks transformers' whole model registry
        # (~2 s on the 2-core machine, in the scheduler and the HTTP process at every start).
        from transformers import AutoTokenizer

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


class TokenizerDecoder:
    """Decoding alone, with tokenizer.json's Rust tokenizer (the `tokenizers` package).

    A HF fast tokenizer whose clean-up pass is off decodes by calling this same backend, so the
    text is the same; loading it does not import transformers, which imports torch (transformers
    5): ~4.4 s of CPU in the server's detokenizer process on the 2-core machine, at every start.
    """

    clean_up_tokenization_spaces = False  # read by detokenizer.decode_batch

    def __init__(self, backend_tokenizer: Any):
        self.backend_tokenizer = backend_tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def load_decoder(path: str | Path):
    """A tokenizer to decode with: a `TokenizerDecoder` where it decodes exactly as
    `load_tokenizer(path)`'s tokenizer (`decodes_as_its_backend`), else that tokenizer.

    Raises:
        FileNotFoundError: as `load_tokenizer`.
    """
    from radixgen.runtime.tiny_model import resolve_model_path

    folder = Path(resolve_model_path(str(path)))
    backend = _exact_backend(folder) if folder.is_dir() else None
    return TokenizerDecoder(backend) if backend is not None else load_tokenizer(path)


def decodes_as_its_backend(folder: Path) -> bool:
    """Whether transformers' tokenizer of `folder` decodes with its tokenizer.json backend and
    nothing else: the fast base class, no clean-up pass, and every special token the config
    names (by role, in `additional_special_tokens`, in `added_tokens_decoder`) already an added
    token marked special in tokenizer.json (otherwise what transformers makes of the token at
    load decides what `skip_special_tokens` drops: its tokenizer decodes then)."""
    return _exact_backend(folder) is not None


def _exact_backend(folder: Path):
    """tokenizer.json's Rust tokenizer where `decodes_as_its_backend`, else None (read once:
    its added tokens' special flags come from the loaded tokenizer)."""
    if not _names_the_fast_base_class(folder):
        return None
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        named = [config.get(role) for role in _SPECIAL_TOKEN_ROLES]
        named += config.get("additional_special_tokens") or []
        extra = config.get("extra_special_tokens") or []  # transformers 5: a list or a dict
        named += list(extra.values()) if isinstance(extra, dict) else extra
        decoder_entries = (config.get("added_tokens_decoder") or {}).items()
        if config.get("clean_up_tokenization_spaces", True) is not False:
            return None
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # tokenizers raises plain Exceptions on a bad file
        return None  # load_tokenizer reports what is wrong with the files
    special = {
        token.content: token_id
        for token_id, token in backend.get_added_tokens_decoder().items()
        if token.special
    }
    for token in named:
        content = token.get("content") if isinstance(token, dict) else token
        if content is not None and content not in special:
            return None
    for token_id, entry in decoder_entries:
        if not isinstance(entry, dict) or entry.get("special") is not True:
            return None  # an added, non-special token: compare with tokenizer.json's flags
        if special.get(entry.get("content")) != int(token_id):
            return None
    return backend


_SPECIAL_TOKEN_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")  # fmt: skip
