"""Where `lorarl-serve` keeps a tenant's saved states and sampler weights in its run folder, and the
`tinker://` paths clients name them by. One place maps one to the other, and a path from a request
never leads outside the run folder: a name is one plain file name, a model id one of the server's.

    serve.sqlite                                   sessions, tenants, requests (store.py)
    tenants/<model id>/weights/<name>/             a saved state: adapter, optimizer, LoRA spec
    tenants/<model id>/sampler_weights/<name>/     a PEFT adapter folder that vLLM serves

`tinker://<model id>/weights/<name>` is the SDK's form (three parts; the model id may hold ':').
"""

from __future__ import annotations

import re
from pathlib import Path

from lorarl.run_folder import RunFolder
from lorarl.serve.ops import BadRequest

KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_MODEL_ID = re.compile(r"s[0-9a-f]{12}:train:\d+")


class ServeFolder(RunFolder):
    @property
    def database(self) -> Path:
        return self.root / "serve.sqlite"

    def tenant_state(self, model_id: str, kind: str, name: str) -> Path:
        """The folder of `tinker://<model_id>/<kind>/<name>`; BadRequest if a symlink in the run folder
        would lead it outside."""
        return self.inside(self.root / "tenants" / model_id.replace(":", "-") / kind / name)

    def inside(self, path: Path) -> Path:
        """`path` if it resolves inside the run folder; BadRequest if not (a symlink planted in it, say)."""
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise BadRequest(f"path: {path} leads outside the run folder {self.root}; not used")
        return path


def tinker_path(model_id: str, kind: str, name: str) -> str:
    return f"tinker://{model_id}/{kind}/{name}"


def parse_tinker_path(path: str, field: str = "path") -> tuple[str, str, str]:
    """(model id, kind, name) of a `tinker://` path; BadRequest naming `field` if it is not one of this
    server's forms (nothing in it can point outside the run folder)."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or not _MODEL_ID.fullmatch(parts[0]) or parts[1] not in KINDS:
        raise BadRequest(f"{field}: {path!r} is not a path of this server (tinker://<model id>/weights/<name>)")
    check_name(parts[2], field)
    return parts[0], parts[1], parts[2]


def check_name(name: str, field: str = "path") -> str:
    """`name` if it is one plain file name for a saved state; BadRequest naming `field` if not."""
    if not _NAME.fullmatch(name):
        raise BadRequest(
            f"{field}: {name!r}: a checkpoint name is 1-128 letters, digits, '.', '_' and '-', "
            "not starting with '.' or '-'"
        )
    return name
