"""The training corpus of the `tiny` model: Python 3.11's standard library, fixed by a manifest.

The standard library differs between Python versions (3.11 here and in CI, 3.12 on the GPU
machine), so the corpus is pinned by `corpus_manifest.txt`: one line per source file with its
sha256, its split and its path relative to the stdlib folder. The split is a pure function of
the path (a hash), so the held-out files are fixed before any training and never trained on.

    python -m radixgen.runtime.tiny_assets.corpus manifest   # rewrite the manifest (rarely)
    python -m radixgen.runtime.tiny_assets.corpus tokens --out DIR
        # verify every file against the manifest and write DIR/{train,valid,test}.npy (uint16)
    python -m radixgen.runtime.tiny_assets.corpus ci-slice --tokens DIR
        # rewrite the committed held-out CI slice from DIR/test.npy

Each file becomes `<|endoftext|>` followed by its tokens; a split is its files' tokens
concatenated in manifest order. Perplexity is measured over fixed windows of EVAL_WINDOW
tokens (each window's first token is context only), the same way on the GPU and in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

ASSETS_DIR = Path(__file__).parent
MANIFEST_PATH = ASSETS_DIR / "corpus_manifest.txt"
CI_SLICE_PATH = ASSETS_DIR / "heldout_ci_tokens.npy"
TOKENIZER_PATH = ASSETS_DIR / "tokenizer.json"
SPLITS = ("train", "valid", "test")
Split = Literal["train", "valid", "test"]
# Per mille of files by path hash: test (reported held-out perplexity) and valid (checkpoint
# selection during training) are disjoint from train and from each other.
TEST_PER_MILLE = 30
VALID_PER_MILLE = 20
# Generated or data-only sources: a machine's build config and pydoc's help-text dump.
EXCLUDED_PARTS = {"site-packages", "__pycache__", "pydoc_data"}
EXCLUDED_PREFIX = "_sysconfigdata"
DOCUMENT_SEPARATOR_ID = 0  # <|endoftext|>
EVAL_WINDOW = 1024
CI_SLICE_WINDOWS = 4  # 4 x 1024 tokens: a CI test of a few seconds (the limit is 20k)


@dataclass(frozen=True)
class ManifestEntry:
    sha256: str
    split: Split
    relative_path: str


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> Split:
    """The split of a file, from a hash of its path alone (stable across machines)."""
    bucket = int(hashlib.sha256(relative_path.encode()).hexdigest()[:8], 16) % 1000
    if bucket < TEST_PER_MILLE:
        return "test"
    if bucket < TEST_PER_MILLE + VALID_PER_MILLE:
        return "valid"
    return "train"


def scan_stdlib(root: Path) -> list[ManifestEntry]:
    """Every UTF-8 `.py` file of the standard library at `root`, sorted by path."""
    entries = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if EXCLUDED_PARTS & set(relative.parts) or relative.name.startswith(EXCLUDED_PREFIX):
            continue
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a few tests of other source encodings
        name = relative.as_posix()
        entries.append(ManifestEntry(hashlib.sha256(data).hexdigest(), split_of(name), name))
    return entries


def write_manifest(entries: list[ManifestEntry], path: Path = MANIFEST_PATH) -> None:
    lines = [f"{e.sha256} {e.split} {e.relative_path}" for e in entries]
    header = "# sha256 split path (relative to the Python 3.11 stdlib); see corpus.py\n"
    path.write_text(header + "\n".join(lines) + "\n")


def read_manifest(path: Path = MANIFEST_PATH) -> list[ManifestEntry]:
    entries = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        sha256, split, relative_path = line.split(" ", 2)
        entries.append(ManifestEntry(sha256, split, relative_path))  # type: ignore[arg-type]
    return entries


def read_verified_sources(entries: list[ManifestEntry], root: Path) -> dict[Split, list[str]]:
    """The texts of the manifest's files per split, in manifest order.

    Raises:
        ValueError: a file is missing or its sha256 differs (another Python version).
    """
    texts: dict[Split, list[str]] = {split: [] for split in SPLITS}
    for entry in entries:
        path = root / entry.relative_path
        if not path.is_file():
            raise ValueError(f"corpus file {path} is missing: build the corpus on Python 3.11")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ValueError(f"corpus file {path} differs from corpus_manifest.txt (sha256)")
        texts[entry.split].append(data.decode("utf-8"))
    return texts


def tokenize_documents(texts: list[str]) -> np.ndarray:
    """`<|endoftext|>` + tokens for each text, concatenated: uint16 [num_tokens]."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
    pieces = []
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        pieces.append(np.array([DOCUMENT_SEPARATOR_ID, *encoding.ids], dtype=np.uint16))
    return np.concatenate(pieces)


def eval_windows(tokens: np.ndarray, window: int = EVAL_WINDOW) -> np.ndarray:
    """Non-overlapping windows of `window` tokens (the ragged tail dropped): [n, window]."""
    count = len(tokens) // window
    return tokens[: count * window].reshape(count, window)


def ci_slice(test_tokens: np.ndarray) -> np.ndarray:
    """CI_SLICE_WINDOWS windows spread evenly over the test split: uint16 [CI_SLICE_WINDOWS, EVAL_WINDOW]."""
    windows = eval_windows(test_tokens)
    stride = len(windows) // CI_SLICE_WINDOWS
    return np.ascontiguousarray(windows[::stride][:CI_SLICE_WINDOWS])


def load_ci_slice() -> np.ndarray:
    """The committed held-out CI slice: uint16 [CI_SLICE_WINDOWS, EVAL_WINDOW]."""
    return np.load(CI_SLICE_PATH)


def main() -> None:
    parser = argparse.ArgumentParser(description="tiny's corpus: manifest, tokens, CI slice")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("manifest", help="rewrite corpus_manifest.txt from this stdlib")
    tokens = commands.add_parser("tokens", help="write DIR/{train,valid,test}.npy")
    tokens.add_argument("--out", type=Path, required=True)
    slice_parser = commands.add_parser("ci-slice", help="rewrite the committed CI slice")
    slice_parser.add_argument("--tokens", type=Path, required=True)
    args = parser.parse_args()

    if args.command == "manifest":
        entries = scan_stdlib(stdlib_dir())
        write_manifest(entries)
        counts = {split: sum(e.split == split for e in entries) for split in SPLITS}
        print(f"wrote {MANIFEST_PATH}: {counts}")
    elif args.command == "tokens":
        texts = read_verified_sources(read_manifest(), stdlib_dir())
        args.out.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            array = tokenize_documents(texts[split])
            np.save(args.out / f"{split}.npy", array)
            print(f"{split}: {len(texts[split])} files, {len(array)} tokens")
    else:
        np.save(CI_SLICE_PATH, ci_slice(np.load(args.tokens / "test.npy")))
        print(f"wrote {CI_SLICE_PATH}")


if __name__ == "__main__":
    main()
