"""What every config section shares: the base class that forbids unknown keys and reads field
docstrings, and the value types and constants that several processes' sections use.

The config is split by process (`run.py` the top level, `model.py`, `trainer.py`, `orchestrator.py`,
`inference.py`, `cluster.py`, `sft.py`), each module schema and validation only: what a value means at
run time lives with the code that uses it. Each field's docstring is its one documentation: `--help`
shows it, and scripts/config_reference.py renders the config reference (docs/config.md) from it.
"""

from __future__ import annotations

import json
import os
import re
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# vLLM's --max-lora-rank accepts only these values (docs/vllm.md).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Targets per chunk of the output head and its log-softmax (trainer/loss.py): a 151,936-token vocabulary
# makes a chunk's float32 logits 78 MB, so the vocabulary costs a fixed ~0.3 GB instead of growing with
# the row (docs/real_shapes.md: 1.2-1.4x the peak of a 259-token vocabulary, against 1.7-2.1x at 512).
# Liger-Kernel's fused linear cross-entropy picks 64-256 rows for Qwen3's shapes, for the same reason.
DEFAULT_LOGITS_CHUNK_SIZE = 128
LOGITS_CHUNK_DOC = (
    "Tokens per chunk of the output head: log-probabilities and entropies are computed over the vocabulary "
    "this many tokens at a time and recomputed in the backward pass, so no [tokens x vocab] float32 tensor is "
    "ever whole (with Qwen3's 151,936-token vocabulary, 0.6 GB per 1,000 tokens). Same loss and gradients up "
    "to float rounding, for one more pass of the output head. 0: the whole forward pass at once, nothing "
    "recomputed (the fastest for small vocabularies and short rows)."
)


def expand_user(path: str) -> str:
    """`path` with a leading "~" or "~user" expanded as a shell would; ValueError naming it for a user
    this machine does not have (`Path.expanduser` raises RuntimeError there, which pydantic passes on
    as a traceback, and `os.path.expanduser` leaves it be, a folder named "~nosuchuser" in the cwd)."""
    if not path.strip():
        raise ValueError("an empty path: give a folder or file")
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        user = expanded[1:].split(os.sep, 1)[0]
        raise ValueError(f"{path}: no user {user!r} on this machine for {'~' + user} (a home folder)")
    return expanded


# A path the user may write with "~": expanded once, when the config is validated, so that every
# process (vLLM, trainer, orchestrator, each reading the config rl wrote) gets the same folder.
UserPath = Annotated[Path, AfterValidator(lambda path: Path(expand_user(str(path))))]
# The shortest wait a process, a server or a network is given (inference.request_timeout, startup_timeout,
# policy_timeout, ...): below a second every request, start or step would time out (`request_timeout 1e-9`
# was accepted, and the run ended in a traceback at its first request).
MIN_WAIT = 1.0
# A seed every consumer takes: vLLM seeds numpy with --seed, which accepts 0 .. 2**32 - 1 only.
Seed = Annotated[int, Field(ge=0, lt=2**32)]


class Section(BaseModel):
    # Field docstrings become the field descriptions, which `--help` shows.
    # No NaN or infinity anywhere: an `lr = inf` would train a NaN adapter.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True, allow_inf_nan=False
    )

    @model_validator(mode="before")
    @classmethod
    def _values_of_their_kind(cls, data: Any) -> Any:
        # pydantic's lax mode converts between kinds: TOML's `true` became 1 where a number is meant
        # (`top_k = true` sampled greedily), and a string ("false", "no", "0") a bool where true or false
        # is meant (`packing = "false"` in TOML or JSON). The command line gives real bools
        # (`--trainer.packing`, `--no-trainer.packing`), so no spelling of the user's is refused here.
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(key, str) else None
                if field is not None and (problem := _wrong_kind(key, value, field.annotation)):
                    # The message as a value of the context, whose entries fill in the template in
                    # order: braces the user typed ("{key}") stay as typed.
                    raise PydanticCustomError(WRONG_KIND, "{problem}", {"key": key, "problem": problem})
        return data


# The error type of `Section._values_of_their_kind`; its context's "key" is the field at fault, which the
# loader adds to the section's location to name the key and the one file that set it.
WRONG_KIND = "wrong_kind"


def _wrong_kind(key: str, value: Any, annotation: Any) -> str | None:
    """Why `value` is not of the kind field `key` (of type `annotation`) takes, where pydantic would convert
    it: a bool for a number, a string for a bool; None otherwise."""
    if isinstance(value, bool) and _only(annotation, (int, float)):
        return f"{key} = {str(value).lower()}: {key} takes a number, not true or false"
    if isinstance(value, str) and _only(annotation, (bool,)):
        return f"{key} = {json.dumps(value)}: {key} takes true or false, not a string: write it without quotes"
    return None


def _only(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether `annotation` is one of `kinds`, or a union of them and None."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return any(k in kinds for k in members) and all(k in (*kinds, type(None)) for k in members)


# "package.module:function": how a config names a user's function (an environment factory, a loss, an
# advantage estimator), which lorarl.plugins imports and checks.
MODULE_FUNCTION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def module_function(value: str | None) -> str | None:
    """`value` if it has the form "package.module:function" (or is None); ValueError otherwise."""
    if value is not None and not MODULE_FUNCTION.fullmatch(value):
        raise ValueError(f"{value!r} is not of the form 'package.module:function'")
    return value
