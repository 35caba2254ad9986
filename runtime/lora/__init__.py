"""Multi-LoRA serving: PEFT adapters loaded from local folders (`adapter.py`), a device pool of
stacked adapter weights with LRU eviction (`pool.py`), and the linear-layer wrapper that adds
each token's adapter delta through kernels/lora.py (`layer.py`). docs/lora.md."""
