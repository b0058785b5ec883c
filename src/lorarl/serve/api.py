"""The Tinker API over HTTP (aiohttp): the routes the pinned `tinker` SDK (0.38) calls, each parsing its
request with the SDK's own types (JSON) or protobuf message (wire.py) and answering in the form the SDK
parses. The work is service.py's.

How errors reach a client, so that each is one clear line and never a hang (the SDK retries 408, 409,
429 and 5xx for minutes, and polls a future forever):
* a request it cannot be served as given: 400 `{"detail": "<field>: <why>"}` (BadRequestError at once);
* an id this key does not own, or an unknown route: 404 (NotFoundError at once);
* a key not accepted: 401 (AuthenticationError);
* a request that fails after it was accepted: its future answers `{"error", "category"}` (the SDK's
  RequestFailedError); a server error on a submit is a 400 too, naming it, rather than a 5xx the SDK
  would retry for five minutes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError
from tinker import types

from lorarl.serve.auth import Keys, Unauthorized
from lorarl.serve.ops import BadRequest
from lorarl.serve.service import NotFound, Service, SessionFinished
from lorarl.serve.wire import decode_forward_backward

log = logging.getLogger("lorarl.serve")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BODY = 256 * 1024**2  # a forward_backward chunk is up to ~5 MB; aiohttp's default is 1 MiB
OWNER = web.RequestKey("owner", str)
# What the SDK reads from client/config: no JWT exchange, uncompressed protobuf (aiohttp cannot read
# zstd on Python 3.11), and none of the endpoints lorarl-serve does not have.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


def app(service: Service, keys: Keys) -> web.Application:
    application = web.Application(client_max_size=MAX_BODY, middlewares=[_errors(keys)])
    application[SERVICE] = service
    v1 = "/api/v1"
    routes = [
        web.get(f"{v1}/healthz", _healthz),
        web.post(f"{v1}/client/config", _static(CLIENT_CONFIG)),
        web.post(f"{v1}/client/dynamic_config", _static({"sample_cancel_enabled": False})),
        web.post(f"{v1}/telemetry", _static({"status": "accepted"})),
        web.get(f"{v1}/get_server_capabilities", _capabilities),
        web.post(f"{v1}/create_session", _create_session),
        web.post(f"{v1}/session_heartbeat", _heartbeat),
        web.post(f"{v1}/sessions/{{session_id}}/finish", _finish),
        web.post(f"{v1}/create_model", _json_call(types.CreateModelRequest, Service.create_model)),
        web.post(f"{v1}/get_info", _get_info),
        web.post(f"{v1}/forward_backward", _forward_backward),
        web.post(f"{v1}/optim_step", _json_call(types.OptimStepRequest, Service.optim_step)),
        web.post(f"{v1}/save_weights", _json_call(types.SaveWeightsRequest, Service.save_state)),
        web.post(
            f"{v1}/save_weights_for_sampler", _json_call(types.SaveWeightsForSamplerRequest, Service.save_for_sampler)
        ),
        web.post(f"{v1}/load_weights", _json_call(types.LoadWeightsRequest, Service.load_state)),
        web.post(
            f"{v1}/create_sampling_session", _json_call(types.CreateSamplingSessionRequest, Service.create_sampler)
        ),
        web.get(f"{v1}/samplers/{{sampler_id}}", _get_sampler),
        web.post(f"{v1}/asample", _json_call(types.SampleRequest, Service.sample)),
        web.post(f"{v1}/retrieve_future", _retrieve),
        web.get(f"{v1}/training_runs/{{model_id}}/checkpoints", _run_checkpoints),
        web.get(f"{v1}/checkpoints", _checkpoints),
        web.post(f"{v1}/weights_info", _weights_info),
        web.get(f"{v1}/training_runs/{{model_id}}", _training_run),
        web.delete(f"{v1}/training_runs/{{model_id}}/checkpoints/{{kind}}/{{name}}", _delete_checkpoint),
    ]
    application.add_routes(routes)
    return application


SERVICE = web.AppKey("service", Service)


def _errors(keys: Keys) -> Any:
    """Authentication first, then every failure as one line in the status the SDK handles at once."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path != "/api/v1/healthz":
                request[OWNER] = keys.owner(request.headers.get("X-API-Key"))
            return await handler(request)
        except Unauthorized as e:
            return _detail(401, str(e))
        except (BadRequest, ValidationError) as e:
            return _detail(400, _one_line(e))
        except NotFound as e:
            return _detail(404, str(e))
        except SessionFinished as e:
            return _detail(410, str(e))
        except web.HTTPException as e:
            return _detail(e.status, e.reason or "")
        except Exception as e:  # a server error: said at once, not a 5xx the SDK would retry for minutes
            log.exception("%s %s failed", request.method, request.path)
            return _detail(400, f"lorarl-serve failed on {request.path}: {type(e).__name__}: {e} (see logs/serve.log)")

    return middleware


def _detail(status: int, text: str) -> web.Response:
    # Always a body with a length: the SDK takes an empty 400 for a proxy's and retries it.
    return web.json_response({"detail": text}, status=status)


def _one_line(error: Exception) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}" if where else first["msg"]
    return str(error).splitlines()[0]


def _service(request: web.Request) -> Service:
    return request.app[SERVICE]


async def _body(request: web.Request, model: type[BaseModel]) -> Any:
    return model.model_validate(await _json_body(request))


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise BadRequest("body: not JSON") from None


def _json_call(model: type[BaseModel], call: Callable[[Service, str, Any], dict[str, Any]]) -> Handler:
    """A route whose JSON body is `model` (the SDK's own request type) and whose answer is `call`'s."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(call(_service(request), request[OWNER], await _body(request, model)))

    return handler


def _static(answer: dict[str, Any]) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(answer)

    return handler


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _capabilities(request: web.Request) -> web.Response:
    return web.json_response(_service(request).capabilities())


async def _create_session(request: web.Request) -> web.Response:
    await _body(request, types.CreateSessionRequest)
    return web.json_response(_service(request).create_session(request[OWNER]))


async def _heartbeat(request: web.Request) -> web.Response:
    req = await _body(request, types.SessionHeartbeatRequest)
    _service(request).heartbeat(req.session_id, request[OWNER])
    return web.json_response({"type": "session_heartbeat"})


async def _finish(request: web.Request) -> web.Response:
    _service(request).finish_session(request.match_info["session_id"], request[OWNER])
    return web.json_response({})


async def _get_info(request: web.Request) -> web.Response:
    req = await _body(request, types.GetInfoRequest)
    return web.json_response(_service(request).get_info(request[OWNER], req.model_id))


async def _forward_backward(request: web.Request) -> web.Response:
    if "protobuf" not in request.headers.get("Content-Type", ""):
        raise BadRequest("forward_backward: send it as protobuf (the tinker SDK does)")
    seq_id, op = decode_forward_backward(await request.read())
    return web.json_response(_service(request).forward_backward(request[OWNER], seq_id, op))


async def _get_sampler(request: web.Request) -> web.Response:
    return web.json_response(_service(request).get_sampler(request[OWNER], request.match_info["sampler_id"]))


async def _retrieve(request: web.Request) -> web.Response:
    req = await _body(request, types.FutureRetrieveRequest)
    status, body, content_type = await _service(request).retrieve(request[OWNER], req.request_id)
    return web.Response(status=status, body=body, content_type=content_type)


async def _run_checkpoints(request: web.Request) -> web.Response:
    answer = _service(request).list_checkpoints(request[OWNER], request.match_info["model_id"])
    return web.json_response(answer)


async def _checkpoints(request: web.Request) -> web.Response:
    try:
        limit, offset = int(request.query.get("limit", 100)), int(request.query.get("offset", 0))
    except ValueError:
        raise BadRequest("limit, offset: whole numbers") from None
    return web.json_response(_service(request).list_checkpoints(request[OWNER], None, limit, offset))


async def _weights_info(request: web.Request) -> web.Response:
    data = await _json_body(request)
    path = data.get("tinker_path") if isinstance(data, dict) else None
    if not isinstance(path, str):
        raise BadRequest("tinker_path: required")
    return web.json_response(_service(request).weights_info(request[OWNER], path))


async def _training_run(request: web.Request) -> web.Response:
    return web.json_response(_service(request).training_run(request[OWNER], request.match_info["model_id"]))


async def _delete_checkpoint(request: web.Request) -> web.Response:
    info = request.match_info
    _service(request).delete_checkpoint(request[OWNER], f"tinker://{info['model_id']}/{info['kind']}/{info['name']}")
    return web.json_response({})
