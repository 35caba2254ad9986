"""Speculative decoding: proposers guess the next tokens cheaply, one target forward verifies
them all, and the accepted prefix plus the target's own next token are appended.

- `config.py`: the `--speculative-*` flags resolved into one `SpeculativeConfig` (torch-free:
  `ServerArgs` validates through it).
- `ngram.py`: the NGRAM (prompt lookup) proposer.
- `verify.py`: greedy and rejection-sampling acceptance over a verify forward's logits.
- `decoder.py`: `SpeculativeDecoder`, one verify step of the running batch (slots, forward,
  acceptance, freeing rejected slots, finishing).

docs/engine.md (`## Speculative decoding`) describes the flags and the rules.
"""
