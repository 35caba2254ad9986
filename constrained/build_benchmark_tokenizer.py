"""Regenerates `benchmark_tokenizer_128k.json.gz`: a 128,000-token byte-level BPE vocabulary.

No Llama-3 tokenizer can be downloaded, yet compile and mask costs depend on the vocabulary's
size and shape, so the constrained benchmarks (and tests that need a large vocabulary) use this
one: byte-level BPE like Llama-3's, trained with `tokenizers` on every UTF-8 text file of the
Python standard library (site-packages excluded), read in sorted order. The standard library differs
between Python versions, so the result is committed (gzipped: ~2 MB instead of ~8 MB) and must
not be rebuilt per machine; load it with `load_benchmark_tokenizer()`.

    .venv/bin/python -m radixgen.constrained.build_benchmark_tokenizer   # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import gzip
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 128_000
SPECIAL_TOKENS = ["<|end_of_text|>", "<|begin_of_text|>", "<|eot_id|>"]
TOKENIZER_FILE = Path(__file__).with_name("benchmark_tokenizer_128k.json.gz")


def load_benchmark_tokenizer():
    """The committed 128k benchmark tokenizer as a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(gzip.decompress(TOKENIZER_FILE.read_bytes()).decode())


def stdlib_sources(stdlib_dir: Path) -> Iterator[str]:
    """Every UTF-8 text file of the standard library (sources, test data, docs), sorted; the
    .py files alone saturate at ~123k merges."""
    for path in sorted(stdlib_dir.rglob("*")):
        if "site-packages" in path.parts or not path.is_file() or path.suffix == ".pyc":
            continue
        try:
            yield path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:  # binary files
            continue


def train_byte_level_bpe(texts, *, vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts` (an iterable of strings)
    with `vocab_size` entries, specials included. Also trains the tiny model's tokenizer
    (runtime/tiny_assets/build_tokenizer.py)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_tokenizer():
    """Trains the byte-level BPE tokenizer (VOCAB_SIZE entries, specials included)."""
    stdlib_dir = Path(sysconfig.get_paths()["stdlib"])
    return train_byte_level_bpe(
        stdlib_sources(stdlib_dir), vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TOKENIZER_FILE)
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    size = tokenizer.get_vocab_size()
    if size != VOCAB_SIZE:
        raise SystemExit(f"trained only {size} tokens: the corpus is too small for {VOCAB_SIZE}")
    args.out.write_bytes(gzip.compress(tokenizer.to_str().encode(), compresslevel=9, mtime=0))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, {size} tokens)")


if __name__ == "__main__":
    main()
