"""tiny's corpus and training script: the manifest pins the corpus and its held-out split, the
committed CI slice is reproducible from it, and the training script writes a checkpoint that
loads through the runtime (two steps on the CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.tiny_assets import corpus
from radixgen.runtime.tiny_assets.train import learning_rate, parse_args, train_one
from radixgen.runtime.tiny_assets.trainable_llama import TrainableLlama
from radixgen.runtime.tiny_model import TINY_CONFIG


@pytest.fixture(scope="module")
def manifest() -> list[corpus.ManifestEntry]:
    return corpus.read_manifest()


def test_manifest_split_is_a_function_of_the_path(manifest):
    assert len(manifest) > 1500
    assert all(entry.split == corpus.split_of(entry.relative_path) for entry in manifest)
    paths = [entry.relative_path for entry in manifest]
    assert len(set(paths)) == len(paths)
    counts = {split: sum(e.split == split for e in manifest) for split in corpus.SPLITS}
    assert counts["test"] >= 40 and counts["valid"] >= 20


def test_ci_slice_is_held_out_and_reproducible(manifest):
    test_files = [e for e in manifest if e.split == "test"]
    texts = corpus.read_verified_sources(test_files, corpus.stdlib_dir())["test"]
    test_tokens = corpus.tokenize_documents(texts)
    committed = corpus.load_ci_slice()
    assert committed.dtype == np.uint16
    assert committed.size <= 20_000
    assert np.array_equal(corpus.ci_slice(test_tokens), committed)


def test_a_changed_file_is_refused(manifest, tmp_path):
    entry = manifest[0]
    (tmp_path / entry.relative_path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / entry.relative_path).write_text("# not the stdlib's file\n")
    with pytest.raises(ValueError, match="differs from corpus_manifest.txt"):
        corpus.read_verified_sources([entry], tmp_path)
    with pytest.raises(ValueError, match="missing"):
        corpus.read_verified_sources([manifest[1]], tmp_path)


def test_learning_rate_schedule():
    assert learning_rate(0.0, 1.0) == 0.0
    assert learning_rate(0.05, 1.0) == pytest.approx(1.0)
    assert learning_rate(1.0, 1.0) == pytest.approx(0.1)
    assert learning_rate(0.5, 1.0) < learning_rate(0.2, 1.0)


def test_two_training_steps_write_a_checkpoint_the_runtime_loads(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for split, size in (("train", 4096), ("valid", 1024), ("test", 1024)):
        np.save(data / f"{split}.npy", rng.integers(0, 32000, size, dtype=np.uint16))
    out = tmp_path / "out"
    args = parse_args(
        ["--data", str(data), "--out", str(out), "--shapes", "deep8", "--device", "cpu"]
        + ["--steps", "2", "--seq-len", "32", "--batch-size", "2", "--eval-every", "1"]
        + ["--eval-batch", "4", "--no-compile"]
    )
    metrics = train_one(args)
    assert metrics["steps"] == 2 and len(metrics["history"]) == 2
    assert metrics["test_perplexity"] > 1000  # two steps on random tokens learn nothing
    config = json.loads((out / "config.json").read_text())
    assert config == {**TINY_CONFIG}  # the shipped shape is deep8's
    weights = load_file(out / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert ModelConfig.from_dict(config, {}).tie_word_embeddings
    # The checkpoint loads into a fresh trainable model under the same names.
    model = TrainableLlama(config)
    model.load_state_dict({name: tensor.float() for name, tensor in weights.items()})


def test_training_arguments_are_checked():
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--out", "o", "--steps", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--out", "o", "--shapes", "huge"])
