"""What makes a run the run it is, so that `--resume` continues the same run and not another one.

A run folder's marker (run_folder.py) records, at each start, the config flattened to dotted keys and
a fingerprint of the base model's files. A resume (its dry run too) compares them with the new config:
* a change to what the checkpoints were trained as is refused in one line: the base model (its name,
  or its files changed under the same name), the adapter's shape (rank, alpha, targets, ...), full
  fine-tuning or quantization, the environments' ids and arguments, a variant's name, adapter or
  environments. Without this, another rank dies in ~60 lines of state-dict mismatches, and another
  base model or task resumes silently;
* anything else (learning rate, max_steps, an environment's weight, ...) may change and is named in
  the resume's log line.

The fingerprint reads each weight file's safetensors header and first MiB, not the whole file: cheap
on a 16 GB model, and a regenerated or swapped model differs there. A model that is not a local
folder (a hub name) is compared by name only.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

# Dotted keys a resume may not change (orchestrator.env.<i>.id, variants.<i>.model.lora.rank, ...).
_ENV = r"orchestrator\.env(\.\d+\.(id|args)(\..+)?)?"
_LORA = r"model\.lora\.(rank|alpha|use_rslora|target_modules|exclude_modules|modules_to_save)"
IDENTITY = re.compile(
    rf"^(model\.(name|quantization|full_finetune)|{_LORA}|{_ENV}|variants(\.\d+\.(name|model\..+|{_ENV}))?)$"
)
# Keys that differ between a start and its resume by design.
_NOT_COMPARED = re.compile(r"^resume(\..+)?$")
BASE_KEY = "model files"  # the fingerprint's key in the identity
_SAMPLED_BYTES = 1 << 20


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """{"model.lora.rank": 8, "orchestrator.env.0.id": "x", ...}: dicts and lists of dicts by key and
    index; a list of plain values is one value."""
    items: list[tuple[Any, Any]]
    if isinstance(config, dict) and config:
        items = list(config.items())
    elif isinstance(config, list) and config and all(isinstance(v, dict) for v in config):
        items = [(str(i), v) for i, v in enumerate(config)]
    else:
        return {prefix.removesuffix("."): config}
    return {k: v for key, value in items for k, v in flatten(value, f"{prefix}{key}.").items()}


def base_fingerprint(model: str) -> str | None:
    """A digest of a local model folder's config.json and weight files (name, size, safetensors
    header, first MiB); None for a name that is not a local folder."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    files = [folder / "config.json", *sorted(folder.glob("*.safetensors")), *sorted(folder.glob("*.bin"))]
    for file in (f for f in files if f.is_file()):
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as f:
            digest.update(f.read(_SAMPLED_BYTES))
    return digest.hexdigest()[:16]


def record(config: dict[str, Any]) -> dict[str, Any]:
    """What the marker keeps of a run's start: its flattened config and its base model's fingerprint."""
    name = config.get("model", {}).get("name")
    return {"config": flatten(config), "base": base_fingerprint(name) if isinstance(name, str) else None}


def compare(previous: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(refused, changed) between two records: "key: old -> new" for each key that differs, the
    identity keys refused, the others changed. A record from before this check compares as equal."""
    if "config" not in previous:
        return [], []
    old, new = previous["config"], current["config"]
    refused: list[str] = []
    changed: list[str] = []
    for key in sorted(old.keys() | new.keys()):
        if _NOT_COMPARED.match(key) or old.get(key) == new.get(key):
            continue
        line = f"{key}: {_show(old.get(key))} -> {_show(new.get(key))}"
        (refused if IDENTITY.match(key) else changed).append(line)
    same_name = old.get("model.name") == new.get("model.name")
    if same_name and previous.get("base") and current["base"] and previous["base"] != current["base"]:
        refused.append(f"{BASE_KEY}: the files of {new.get('model.name')} changed since the run started")
    return refused, changed


def _show(value: Any) -> str:
    return "(none)" if value is None else repr(value)
