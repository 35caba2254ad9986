"""Regenerates `tokenizer.json`, the byte-level BPE tokenizer of the embedded `tiny` model.

The tokenizer is trained with `tokenizers` on a fixed, sorted subset of the Python standard
library's sources: text present on every machine. The standard library differs between Python
versions, so the trained file is committed next to this script and the model build copies it;
run this script only to regenerate it (the result is deterministic for one Python version):

    python runtime/tiny_assets/build_tokenizer.py [--out runtime/tiny_assets/tokenizer.json]
"""

from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 32000
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The top-level stdlib modules and packages read, in this order; a fixed list keeps the corpus
# (and so the merges) stable and the training short (a few MB of text).
CORPUS_SOURCES = [
    "argparse.py", "asyncio", "collections", "concurrent", "configparser.py", "ctypes",
    "dataclasses.py", "difflib.py", "doctest.py", "email", "enum.py", "functools.py", "html",
    "http", "idlelib", "imaplib.py", "importlib", "inspect.py", "json", "logging", "mailbox.py",
    "multiprocessing", "pathlib.py", "pickletools.py", "pydoc.py", "pydoc_data", "random.py",
    "re", "shutil.py", "sqlite3", "ssl.py", "statistics.py", "string.py", "subprocess.py",
    "tarfile.py", "textwrap.py", "threading.py", "tkinter", "turtle.py", "typing.py",
    "unittest", "urllib", "xml", "zipfile.py",
]  # fmt: skip
MAX_CORPUS_BYTES = 8 * 1024 * 1024


def corpus_files(stdlib_dir: Path) -> list[Path]:
    """The sorted .py files of CORPUS_SOURCES that exist in this Python's standard library."""
    files: list[Path] = []
    for name in CORPUS_SOURCES:
        source = stdlib_dir / name
        if source.is_dir():
            files.extend(sorted(p for p in source.rglob("*.py") if "test" not in p.parts))
        elif source.is_file():
            files.append(source)
    return files


def corpus_texts(files: list[Path]) -> Iterator[str]:
    total = 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        total += len(text)
        if total > MAX_CORPUS_BYTES:
            return
        yield text


def build_tokenizer():
    """Trains and returns the `tokenizers.Tokenizer` (byte-level BPE, VOCAB_SIZE entries)."""
    from radixgen.constrained.build_benchmark_tokenizer import train_byte_level_bpe

    files = corpus_files(Path(sysconfig.get_paths()["stdlib"]))
    return train_byte_level_bpe(
        corpus_texts(files), vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = Path(__file__).with_name("tokenizer.json")
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    tokenizer.save(str(args.out), pretty=False)
    print(f"wrote {args.out} (vocab {tokenizer.get_vocab_size()})")


if __name__ == "__main__":
    main()
