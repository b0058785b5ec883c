"""serve/service.py's heartbeat janitor with the real Store and run folder, and a stand-in for the
trainer connection (service.py takes it as `engine`): a session silent for serve.heartbeat_timeout has
its tenants saved and dropped from the trainer, and each is loaded again from that state before its
next request, which then runs as if nothing had happened."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tinker import types

from lorarl.config.serve import ServeConfig
from lorarl.serve import ops
from lorarl.serve.folder import ServeFolder
from lorarl.serve.service import UNLOADED, Service
from lorarl.serve.store import DONE, Store

OWNER = "owner-a"


class Trainer:
    """What the trainer process is asked, in order; a saved state is a folder with one file."""

    def __init__(self) -> None:
        self.ops: list[ops.Op] = []

    async def acall(self, op: ops.Op) -> Any:
        self.ops.append(op)
        if isinstance(op, ops.SaveState):
            op.folder.mkdir(parents=True, exist_ok=True)
            (op.folder / "adapter").write_text("state")
        if isinstance(op, ops.OptimStep):
            return ops.OptimStepResult({"grad_norm": 1.0, "learning_rate": op.adam.learning_rate})
        return None


async def _until(condition: Any, seconds: float = 2.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.005)


def test_a_silent_sessions_tenants_are_unloaded_and_loaded_again_on_their_next_request(tmp_path: Path) -> None:
    cfg = ServeConfig(model={"name": "m"}, output_dir=tmp_path, serve={"heartbeat_timeout": 0.05})
    folder = ServeFolder(tmp_path / "run")
    folder.root.mkdir()
    store, trainer = Store(folder.database), Trainer()

    async def main() -> None:
        service = Service(cfg, store, folder, trainer, sampler=None, vocab_size=10)  # type: ignore[arg-type]
        session = service.create_session(OWNER)["session_id"]
        create = types.CreateModelRequest(session_id=session, model_seq_id=0, base_model="m")
        model_id = service.create_model(OWNER, create)["model_id"]
        service.start()
        await _until(lambda: (m := store.model(model_id, OWNER)) is not None and not m.loaded)
        unloaded = folder.tenant_state(model_id, "weights", UNLOADED)
        assert trainer.ops == [
            ops.CreateTenant(model_id, ops.LoraSpec(32)),
            ops.SaveState(model_id, unloaded),
            ops.DropTenant(model_id),
        ]
        model = store.model(model_id, OWNER)
        assert model is not None and model.resume_from == str(unloaded) and (unloaded / "adapter").is_file()

        service.heartbeat(session, OWNER)  # the client is back
        step = types.OptimStepRequest(model_id=model_id, seq_id=1, optim_params=types.AdamParams(learning_rate=1e-3))
        request_id = service.optim_step(OWNER, step)["request_id"]
        await _until(lambda: (r := store.request(request_id, OWNER)) is not None and r.status == DONE)
        assert trainer.ops[3:] == [ops.LoadState(model_id, unloaded, optimizer=True), trainer.ops[4]]
        assert isinstance(trainer.ops[4], ops.OptimStep)
        done = store.request(request_id, OWNER)
        assert done is not None and done.result is not None
        assert json.loads(done.result)["metrics"]["learning_rate"] == 1e-3
        model = store.model(model_id, OWNER)
        assert model is not None and model.loaded
        for task in service.tasks:
            task.cancel()

    asyncio.run(main())
