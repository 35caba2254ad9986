"""Hub IDs (`meta-llama/Llama-3.1-8B-Instruct`) resolved from the local Hugging Face cache only:
radixgen never downloads. The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`; a model's snapshot is `models--ORG--NAME/snapshots/REVISION`, the
revision `refs/main` names (or the most recent snapshot)."""

from __future__ import annotations

import os
import re
from pathlib import Path

# An `org/name` or `name` Hub ID: letters, digits, '-', '_', '.' (no path separators beyond one).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?")


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def looks_like_hub_id(model_path: str) -> bool:
    return bool(_HUB_ID.fullmatch(model_path)) and not os.path.exists(model_path)


def resolve_hub_id(model_id: str) -> str:
    """The local snapshot folder of Hub ID `model_id`.

    Raises:
        FileNotFoundError: no snapshot is in the cache; says where it looked and what to do.
    """
    repo = hub_cache_dir() / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return str(snapshots / ref.read_text().strip())
    candidates = (
        sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    )
    if candidates:
        return str(candidates[-1])
    raise FileNotFoundError(
        f"{model_id!r} is not a local folder, and Hub IDs are looked up in the local Hugging "
        f"Face cache only ({hub_cache_dir()}; set HF_HUB_CACHE or HF_HOME to use another), "
        "where it is not: radixgen never downloads. Download it where there is network "
        f"(`huggingface-cli download {model_id}`) or pass --model-path /path/to/checkpoint-folder"
    )
