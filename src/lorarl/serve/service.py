"""What each Tinker API call does in `lorarl-serve`, apart from HTTP (api.py turns requests and answers
into these calls): sessions, tenants and their ordered work, sampling, futures, checkpoints.

* A request that does work (create a model, forward_backward, optim_step, save, load, sample) is
  checked, recorded (store.py) and queued, and answered at once with its request id; the work runs in
  the trainer process (serve/rpc.py, one tenant's requests in order, the tenants in turn: scheduler.py)
  or on the vLLM workers (sampling.py), and its result is recorded for `retrieve_future`. The SDK waits
  60 s for a submit's answer, so nothing slow runs before it.
* A retried request (the same `seq_id` of a model, or `(session, seq)` of a new model or sampler) is
  answered with the first one's request id and applied once.
* A bad request is refused at once with one line naming the field (`BadRequest` → 400) where it can be
  seen before the work starts; the trainer and the sampler check again, and what they find fails the
  request's future with the same line. A server failure fails the future too, never leaves it pending.
* Sessions that stop sending heartbeats have their tenants saved and unloaded from the trainer
  (`serve.heartbeat_timeout`); the next request of such a tenant loads it again first.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from lorarl.config.serve import ServeConfig
from lorarl.serve import ops
from lorarl.serve.folder import ServeFolder, check_name, parse_tinker_path, tinker_path
from lorarl.serve.futures import Waiters
from lorarl.serve.ops import BadRequest
from lorarl.serve.sampling import Sampler, SamplerAdapter, SamplingParams
from lorarl.serve.scheduler import TenantQueues
from lorarl.serve.store import DONE, FAILED, Checkpoint, Store
from lorarl.serve.wire import PROTOBUF, encode_forward_backward, encode_sample
from lorarl.written_files import remove_folder

log = logging.getLogger("lorarl.serve")
JSON = "application/json"
UNLOADED = "_unloaded"  # the state a tenant is saved as when its session went silent


class NotFound(Exception):
    """An id this owner does not have (another owner's too); str() is one line."""


class SessionFinished(Exception):
    """A heartbeat of a session that was finished (HTTP 410, on which the SDK stops its heartbeat loop;
    on any other error it retries every 10 s and warns after two minutes, forever)."""


class Service:
    def __init__(
        self,
        cfg: ServeConfig,
        store: Store,
        folder: ServeFolder,
        engine: Any,  # serve.rpc.EngineClient: `await engine.acall(op)`
        sampler: Sampler,
        vocab_size: int,
    ) -> None:
        self.cfg, self.store, self.folder = cfg, store, folder
        self.engine, self.sampler, self.vocab_size = engine, sampler, vocab_size
        self.queues = TenantQueues()
        self.waiters = Waiters()
        self.base_names = {cfg.model.name, str(Path(cfg.model.name).resolve()), Path(cfg.model.name).name}
        self.tasks: set[asyncio.Task[None]] = set()

    # ---- background work ---------------------------------------------------------------------------

    def start(self) -> None:
        """The dispatcher of the trainer's queues and the heartbeat janitor, on the running loop."""
        for work in (self.queues.run(), self._unload_silent_sessions()):
            self._spawn(work)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def resume(self) -> int:
        """After a restart: pending requests fail (they cannot finish now), and every tenant that was held
        is reloaded, before its next request, from its last saved state. Returns the requests failed."""
        failed = self.store.fail_pending("lorarl-serve restarted before this request ran; nothing of it applied")
        for model_id in self.store.loaded_models():
            saved = [c for c in self.store.checkpoints_of_model(model_id) if c.kind == "weights"]
            self.store.set_loaded(model_id, False, saved[0].folder if saved else None)
        return failed

    # ---- sessions ----------------------------------------------------------------------------------

    def create_session(self, owner: str) -> dict[str, Any]:
        session = self.store.create_session(owner)
        return {
            "session_id": session,
            "info_message": f"lorarl-serve: {self.cfg.model.name}, LoRA ranks up to {self.cfg.serve.max_rank}",
            "warning_message": "lorarl-serve trains LoRA on attention and MLP; train_unembed is accepted and "
            "the output head stays frozen",
        }

    def heartbeat(self, session: str, owner: str) -> None:
        if not self.store.heartbeat(session, owner):
            if self.store.session_exists(session, owner):
                raise SessionFinished(f"session {session!r} has finished")
            raise NotFound(f"session {session!r} not found")

    def finish_session(self, session: str, owner: str) -> None:
        if not self.store.finish_session(session, owner):
            raise NotFound(f"session {session!r} not found")

    def capabilities(self) -> dict[str, Any]:
        model = {"model_name": self.cfg.model.name, "max_context_length": self.cfg.seq_len}
        return {"supported_models": [model | {"trainable": True, "sampleable": True}]}

    # ---- tenants -----------------------------------------------------------------------------------

    def _check_base(self, base: str | None) -> None:
        if base is not None and base not in self.base_names:
            raise BadRequest(f"base_model: {base!r} is not served here; this server serves {self.cfg.model.name!r}")

    def create_model(self, owner: str, req: Any) -> dict[str, Any]:
        """CreateModelRequest → a future of {"model_id"}."""
        if not self.store.session_exists(req.session_id, owner):
            raise NotFound(f"session {req.session_id!r} not found")
        self._check_base(req.base_model)
        lora = req.lora_config
        rank = lora.rank if lora is not None else 32
        if not 1 <= rank <= self.cfg.serve.max_rank:
            raise BadRequest(
                f"lora_config.rank: {rank}; this server serves ranks 1 to {self.cfg.serve.max_rank} (serve.max_rank)"
            )
        if len(self.store.loaded_models()) >= self.cfg.serve.max_tenants:
            raise BadRequest(
                f"this server holds {self.cfg.serve.max_tenants} training clients (serve.max_tenants): none free"
            )
        spec = (
            ops.LoraSpec(rank, lora.seed, lora.train_mlp, lora.train_attn, lora.train_unembed)
            if lora
            else ops.LoraSpec(rank)
        )
        if not (spec.train_mlp or spec.train_attn):
            raise BadRequest("lora_config: train_mlp and train_attn are both false: nothing would train")
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        request_id, new = self.store.submit(owner, "create_model", f"create:{model_id}")
        if new:
            self.store.add_model(model_id, owner, req.session_id, self.cfg.model.name, asdict(spec), req.user_metadata)
            self._queue(
                model_id,
                request_id,
                ops.CreateTenant(model_id, spec),
                lambda _: _json(model_id=model_id, type="create_model"),
            )
        return {"request_id": request_id, "model_id": model_id}

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        model = self._model(owner, model_id)
        tokenizer = (
            str(Path(self.cfg.model.name).resolve()) if Path(self.cfg.model.name).is_dir() else self.cfg.model.name
        )
        return {
            "model_id": model_id,
            "model_data": {"arch": "lorarl", "model_name": model.base_model, "tokenizer_id": tokenizer},
            "is_lora": True,
            "lora_rank": model.lora["rank"],
            "model_name": model.base_model,
            "type": "get_info",
        }

    def _model(self, owner: str, model_id: str) -> Any:
        if (model := self.store.model(model_id, owner)) is None:
            raise NotFound(f"model {model_id!r} not found")
        return model

    def forward_backward(self, owner: str, seq_id: int, op: ops.ForwardBackward) -> dict[str, Any]:
        self._model(owner, op.model_id)
        self._check_data(op.data)
        kind = "forward" if op.forward_only else "forward_backward"
        return self._ordered(owner, op.model_id, seq_id, kind, op, lambda r: (encode_forward_backward(r), PROTOBUF))

    def _check_data(self, data: tuple[ops.Datum, ...]) -> None:
        """What can be seen of the data before the trainer runs it: tokens in the vocabulary, lengths that
        agree and fit seq_len, finite numbers (the engine checks the rest: alignment, the loss's inputs)."""
        for i, d in enumerate(data):
            if not d.tokens or len(d.targets) != len(d.tokens):
                raise BadRequest(
                    f"data[{i}].loss_fn_inputs.target_tokens: {len(d.targets)} targets for {len(d.tokens)} input tokens"
                )
            if len(d.tokens) + 1 > self.cfg.seq_len:
                raise BadRequest(
                    f"data[{i}].model_input: {len(d.tokens)} tokens and a target do not fit seq_len {self.cfg.seq_len}"
                )
            for field, ids in (("model_input", d.tokens), ("loss_fn_inputs.target_tokens", d.targets)):
                if bad := [t for t in ids if not 0 <= t < self.vocab_size]:
                    raise BadRequest(
                        f"data[{i}].{field}: token {bad[0]} is outside the vocabulary (0 to {self.vocab_size - 1})"
                    )
            for field in ("weights", "advantages", "logprobs"):
                values = getattr(d, field)
                if values is not None and (
                    len(values) != len(d.tokens) or not all(abs(v) < float("inf") for v in values)
                ):
                    raise BadRequest(
                        f"data[{i}].loss_fn_inputs.{field}: one finite number per target ({len(d.tokens)})"
                    )

    def optim_step(self, owner: str, req: Any) -> dict[str, Any]:
        self._model(owner, req.model_id)
        params = req.optim_params
        if getattr(params, "type", "adamw") not in ("adamw", None) or not hasattr(params, "beta2"):
            raise BadRequest("optimizer_params: lorarl-serve trains with AdamW (AdamParams) only")
        adam = ops.AdamParams(
            params.learning_rate, params.beta1, params.beta2, params.eps, params.weight_decay, params.grad_clip_norm
        )
        if not all(abs(v) < float("inf") for v in asdict(adam).values()) or adam.learning_rate < 0:
            raise BadRequest("adam_params: finite numbers, learning_rate >= 0")
        op = ops.OptimStep(req.model_id, adam)
        return self._ordered(owner, req.model_id, req.seq_id, "optim_step", op, lambda r: _json(metrics=r.metrics))

    def save_state(self, owner: str, req: Any) -> dict[str, Any]:
        self._model(owner, req.model_id)
        name = check_name(req.path or f"state-{req.seq_id}", "path")
        folder = self.folder.tenant_state(req.model_id, "weights", name)
        path = tinker_path(req.model_id, "weights", name)
        if folder.exists() and not req.overwrite:
            raise BadRequest(f"path: {path} exists; save under another name, or pass overwrite")
        op = ops.SaveState(req.model_id, folder)
        saved = partial(self._checkpointed, owner, req.model_id, "weights", name, folder)
        return self._ordered(owner, req.model_id, req.seq_id, "save_weights", op, saved)

    def save_for_sampler(self, owner: str, req: Any) -> dict[str, Any]:
        model = self._model(owner, req.model_id)
        if req.path is not None:
            name = check_name(req.path, "path")
            folder = self.folder.tenant_state(req.model_id, "sampler_weights", name)
            op = ops.SaveForSampler(req.model_id, folder)
            saved = partial(self._checkpointed, owner, req.model_id, "sampler_weights", name, folder)
            return self._ordered(owner, req.model_id, req.seq_id, "save_weights_for_sampler", op, saved)
        if req.sampling_session_seq_id is None:
            raise BadRequest("path or sampling_session_seq_id: give one")
        sampler_id = f"{model.session_id}:sample:{req.sampling_session_seq_id}"
        folder = self.folder.tenant_state(req.model_id, "sampler_weights", f"_sampler-{req.sampling_session_seq_id}")

        def ephemeral(_: Any) -> tuple[bytes, str]:
            self.store.add_sampler(sampler_id, owner, model.session_id, model.base_model, None, str(folder))
            return _json(sampling_session_id=sampler_id)

        op = ops.SaveForSampler(req.model_id, folder)
        return self._ordered(owner, req.model_id, req.seq_id, "save_weights_for_sampler", op, ephemeral)

    def _checkpointed(self, owner: str, model_id: str, kind: str, name: str, folder: Path, _: Any) -> tuple[bytes, str]:
        """Record a state the trainer saved; the answer to its request."""
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        path = tinker_path(model_id, kind, name)
        self.store.add_checkpoint(Checkpoint(path, model_id, kind, name, str(folder), time.time(), size), owner)
        return _json(path=path, type="save_weights" if kind == "weights" else "save_weights_for_sampler")

    def load_state(self, owner: str, req: Any) -> dict[str, Any]:
        """LoadWeightsRequest: into a model of the session (create-via-load, the SDK's
        `create_training_client_from_state*`), or into an existing model (the older load_state)."""
        ckpt = self._checkpoint(owner, req.path)
        if ckpt.kind != "weights":
            raise BadRequest(f"path: {req.path} is sampler weights; load a state saved with save_state")
        if req.model_id is not None:
            self._model(owner, req.model_id)
            op = ops.LoadState(req.model_id, Path(ckpt.folder), req.optimizer)
            return self._ordered(
                owner, req.model_id, req.seq_id, "load_weights", op, lambda _: _json(path=req.path, type="load_weights")
            )
        if req.session_id is None or req.model_seq_id is None or not self.store.session_exists(req.session_id, owner):
            raise NotFound(f"session {req.session_id!r} not found")
        self._check_base(req.base_model)
        source = self._model(owner, ckpt.model_id)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        request_id, new = self.store.submit(owner, "load_weights", f"create:{model_id}")
        if new:
            self.store.add_model(model_id, owner, req.session_id, source.base_model, source.lora, req.user_metadata)
            op = ops.LoadState(model_id, Path(ckpt.folder), req.optimizer)
            self._queue(
                model_id, request_id, op, lambda _: _json(model_id=model_id, path=req.path, type="load_weights")
            )
        return {"request_id": request_id, "model_id": model_id}

    def _checkpoint(self, owner: str, path: str) -> Checkpoint:
        parse_tinker_path(path)
        if (ckpt := self.store.checkpoint(path, owner)) is None:
            raise NotFound(f"checkpoint {path} not found")
        self.folder.inside(Path(ckpt.folder))  # a symlink planted since it was saved
        return ckpt

    # ---- ordered work on the trainer --------------------------------------------------------------

    def _ordered(
        self,
        owner: str,
        model_id: str,
        seq_id: int | None,
        kind: str,
        op: ops.Op,
        answer: Callable[[Any], tuple[bytes, str]],
    ) -> dict[str, Any]:
        """Record and queue one request of a model, applied once whatever the retries."""
        request_id, new = self.store.submit(owner, kind, None if seq_id is None else f"{model_id}#{seq_id}")
        if new:
            self._queue(model_id, request_id, op, answer)
        return {"request_id": request_id, "model_id": model_id}

    def _queue(self, model_id: str, request_id: str, op: ops.Op, answer: Callable[[Any], tuple[bytes, str]]) -> None:
        async def job() -> None:
            await self._run(request_id, model_id, op, answer)

        self.queues.submit(model_id, job)

    async def _run(
        self, request_id: str, model_id: str, op: ops.Op, answer: Callable[[Any], tuple[bytes, str]]
    ) -> None:
        try:
            await self._ensure_loaded(model_id, op)
            result = await self.engine.acall(op)
            body, content_type = answer(result)
            self.store.finish(request_id, body, content_type)
            self.store.touch_model(model_id)
        except BadRequest as e:
            self.store.fail(request_id, str(e), "user")
        except Exception as e:  # the trainer's failure: the request fails, the server goes on
            log.exception("request %s of %s failed", request_id, model_id)
            self.store.fail(request_id, f"lorarl-serve: {type(e).__name__}: {e}", "server")
        finally:
            self.waiters.finished(request_id)

    async def _ensure_loaded(self, model_id: str, op: ops.Op) -> None:
        """Load a tenant that was unloaded (its session went silent, or the server restarted) from the state
        it was saved as, before its next request."""
        if isinstance(op, ops.CreateTenant | ops.LoadState):
            self.store.set_loaded(model_id, True)
            return
        row = self.store.db.execute("SELECT loaded, resume_from FROM models WHERE id = ?", (model_id,)).fetchone()
        if row is None or row[0]:
            return
        if row[1] is None:
            raise BadRequest(
                f"model {model_id} was unloaded (the server restarted) before it saved a state: nothing to go on "
                "from; create it again, or load a state with create_training_client_from_state"
            )
        await self.engine.acall(ops.LoadState(model_id, Path(row[1]), optimizer=True))
        self.store.set_loaded(model_id, True)
        log.info("%s loaded again from %s", model_id, row[1])

    async def _unload_silent_sessions(self) -> None:
        timeout = self.cfg.serve.heartbeat_timeout
        while True:
            await asyncio.sleep(min(10.0, timeout / 2))
            for session in self.store.silent_sessions(time.time() - timeout):
                for model_id in self.store.models_of_session(session):
                    self.queues.submit(model_id, partial(self._unload, model_id))

    async def _unload(self, model_id: str) -> None:
        row = self.store.db.execute("SELECT loaded FROM models WHERE id = ?", (model_id,)).fetchone()
        if row is None or not row[0]:
            return
        folder = self.folder.tenant_state(model_id, "weights", UNLOADED)  # replaces the previous unload's
        await self.engine.acall(ops.SaveState(model_id, folder))
        await self.engine.acall(ops.DropTenant(model_id))
        self.store.set_loaded(model_id, False, str(folder))
        log.info(
            "%s unloaded (no heartbeat for %.0f s); saved to %s", model_id, self.cfg.serve.heartbeat_timeout, folder
        )

    # ---- sampling ----------------------------------------------------------------------------------

    def create_sampler(self, owner: str, req: Any) -> dict[str, Any]:
        if not self.store.session_exists(req.session_id, owner):
            raise NotFound(f"session {req.session_id!r} not found")
        if (req.base_model is None) == (req.model_path is None):
            raise BadRequest("base_model or model_path: give exactly one")
        sampler_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        folder = None
        if req.model_path is not None:
            ckpt = self._checkpoint(owner, req.model_path)
            if ckpt.kind != "sampler_weights":
                raise BadRequest(
                    f"model_path: {req.model_path} is a training state; sample from save_weights_for_sampler's path"
                )
            folder = ckpt.folder
        else:
            self._check_base(req.base_model)
        self.store.add_sampler(sampler_id, owner, req.session_id, self.cfg.model.name, req.model_path, folder)
        return {"sampling_session_id": sampler_id}

    def get_sampler(self, owner: str, sampler_id: str) -> dict[str, Any]:
        if (sampler := self.store.sampler(sampler_id, owner)) is None:
            raise NotFound(f"sampler {sampler_id!r} not found")
        return {"sampler_id": sampler.id, "base_model": sampler.base_model, "model_path": sampler.model_path}

    def sample(self, owner: str, req: Any) -> dict[str, Any]:
        """SampleRequest → a future of a SampleResponse, and one sequence id per sample."""
        if req.sampling_session_id is None:
            raise BadRequest("sampling_session_id: required (create a sampling client first)")
        if (sampler := self.store.sampler(req.sampling_session_id, owner)) is None:
            raise NotFound(f"sampler {req.sampling_session_id!r} not found")
        for field in ("target_prompt_logprobs", "prompt_logprobs_last_n"):
            if getattr(req, field, None):
                raise BadRequest(f"{field}: not served by lorarl-serve")
        for field in ("prompt_alt_tokens_k", "topk_sample_logprobs", "record_stability_info"):
            if getattr(req, field, None):
                raise BadRequest(f"{field}: not served by lorarl-serve")
        prompt = _prompt_tokens(req.prompt)
        request_id, new = self.store.submit(owner, "sample", f"{sampler.id}#{req.seq_id}")
        if new:
            self._spawn(self._sample(request_id, sampler, prompt, req))
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}-{i}" for i in range(req.num_samples)]}

    async def _sample(self, request_id: str, sampler: Any, prompt: list[int], req: Any) -> None:
        try:
            p = req.sampling_params
            params = SamplingParams(p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop)
            adapter = None if sampler.folder is None else _adapter(sampler.folder)
            result = await self.sampler.sample(
                adapter, prompt, req.num_samples, params, bool(req.prompt_logprobs), req.topk_prompt_logprobs
            )
            sequences = [(s.tokens, s.logprobs, s.stop_reason) for s in result.sequences]
            topk = None if result.topk_prompt_logprobs is None else [r or [] for r in result.topk_prompt_logprobs]
            self.store.finish(request_id, encode_sample(sequences, result.prompt_logprobs, topk), PROTOBUF)
        except BadRequest as e:
            self.store.fail(request_id, str(e), "user")
        except Exception as e:
            log.exception("sample %s failed", request_id)
            self.store.fail(request_id, f"lorarl-serve: {type(e).__name__}: {e}", "server")
        finally:
            self.waiters.finished(request_id)

    # ---- futures -----------------------------------------------------------------------------------

    async def retrieve(self, owner: str, request_id: str) -> tuple[int, bytes, str]:
        """(status, body, content type) of a future: its result, its failure (200 with "error", which
        the SDK raises as RequestFailedError), or after `serve.long_poll` seconds 408 "try again"."""
        if (req := self.store.request(request_id, owner)) is None:
            raise NotFound(f"request {request_id!r} not found")
        if req.status not in (DONE, FAILED):
            await self.waiters.wait(request_id, self.cfg.serve.long_poll)
            req = self.store.request(request_id, owner)
            assert req is not None
        if req.status == DONE:
            assert req.result is not None and req.content_type is not None
            return 200, req.result, req.content_type
        if req.status == FAILED:
            return 200, *_json(error=req.error, category=req.category)
        return 408, *_json(type="try_again", request_id=request_id, queue_state="active")

    # ---- checkpoints (RestClient, `tinker checkpoint`) ---------------------------------------------

    def list_checkpoints(self, owner: str, model_id: str | None, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        if model_id is not None:
            self._model(owner, model_id)
        every = [c for c in self.store.checkpoints(owner, model_id) if not c.name.startswith("_")]
        page = every[offset : offset + limit]
        return {
            "checkpoints": [_checkpoint_json(c) for c in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(every)},
        }

    def weights_info(self, owner: str, path: str) -> dict[str, Any]:
        ckpt = self._checkpoint(owner, path)
        model = self._model(owner, ckpt.model_id)
        lora = model.lora
        return {
            "base_model": model.base_model,
            "is_lora": True,
            "lora_rank": lora["rank"],
            "train_unembed": lora["train_unembed"],
            "train_mlp": lora["train_mlp"],
            "train_attn": lora["train_attn"],
        }

    def training_run(self, owner: str, model_id: str) -> dict[str, Any]:
        model = self._model(owner, model_id)
        saved = self.store.checkpoints(owner, model_id)
        last = {kind: next((c for c in saved if c.kind == kind), None) for kind in ("weights", "sampler_weights")}
        return {
            "training_run_id": model_id,
            "base_model": model.base_model,
            "model_owner": owner,
            "is_lora": True,
            "lora_rank": model.lora["rank"],
            "last_request_time": _iso(model.last_request),
            "last_checkpoint": _checkpoint_json(last["weights"]) if last["weights"] else None,
            "last_sampler_checkpoint": _checkpoint_json(last["sampler_weights"]) if last["sampler_weights"] else None,
        }

    def delete_checkpoint(self, owner: str, path: str) -> None:
        ckpt = self._checkpoint(owner, path)
        remove_folder(Path(ckpt.folder))  # by the run folder's record of what lorarl wrote
        self.store.remove_checkpoint(path, owner)


def _adapter(folder: str) -> SamplerAdapter:
    """The vLLM adapter of a sampler folder: named by the folder alone, so that every sampling client of
    the same weights shares one loaded adapter, and new weights (a new folder) get a new name."""
    return SamplerAdapter(f"w{hashlib.sha256(folder.encode()).hexdigest()[:16]}", Path(folder))


def _prompt_tokens(prompt: Any) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            raise BadRequest(f"prompt: {getattr(chunk, 'type', 'this')} chunks are not served (text tokens only)")
        tokens += list(chunk.tokens)
    if not tokens:
        raise BadRequest("prompt: no tokens")
    return tokens


def _json(**fields: Any) -> tuple[bytes, str]:
    return json.dumps(fields).encode(), JSON


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


def _checkpoint_json(c: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": f"{c.kind}/{c.name}",
        "checkpoint_type": "training" if c.kind == "weights" else "sampler",
        "time": _iso(c.created),
        "tinker_path": c.path,
        "size_bytes": c.size_bytes,
        "public": False,
    }
