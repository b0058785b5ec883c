"""The Tinker API's protobuf messages, read and written with the SDK's own generated module
(`tinker.proto.tinker_public_pb2`), so that what lorarl-serve answers is exactly what the pinned SDK
parses. Three messages cross as protobuf only: a forward_backward request, and the results of
forward_backward and of a sample (the SDK refuses those as JSON). Everything else is JSON, read with
the SDK's pydantic request types in api.py.

Token lists are little-endian int32, floats little-endian float32, tensors dense (a sparse or 2-D
tensor is the SDK's top-K cross entropy, which lorarl does not serve: refused naming the field).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from lorarl.serve.ops import BadRequest, Datum, ForwardBackward, ForwardBackwardResult

PROTOBUF = "application/x-protobuf"
# The loss inputs a datum may carry, and which Datum field each fills.
_INPUTS = {"weights": "weights", "advantages": "advantages", "logprobs": "logprobs"}
_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


def decode_forward_backward(body: bytes) -> tuple[int, ForwardBackward]:
    """The `seq_id` and the operation of a ForwardBackwardRequest (forward too: `forward_only`)."""
    request = pb.ForwardBackwardRequest()
    try:
        request.ParseFromString(body)
    except Exception as e:  # protobuf's DecodeError, or worse for garbage
        raise BadRequest(f"body: not a ForwardBackwardRequest ({type(e).__name__})") from None
    config: dict[str, float] = dict(request.loss_fn_config)
    for key, value in request.loss_fn_config_v2.items():
        if value.WhichOneof("value") != "number":
            raise BadRequest(f"loss_fn_config.{key}: a number, not {value.text!r}")
        config[key] = value.number
    data = tuple(_datum(i, d) for i, d in enumerate(request.data))
    if not data:
        raise BadRequest("data: no datum")
    op = ForwardBackward(request.model_id, data, request.loss_fn, config, request.forward_only)
    return request.seq_id, op


def _datum(i: int, datum: pb.Datum) -> Datum:
    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise BadRequest(f"data[{i}].model_input: {kind} chunks are not served (text tokens only)")
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").tolist()
    inputs = dict(datum.loss_fn_inputs)
    if "target_tokens" not in inputs:
        raise BadRequest(f"data[{i}].loss_fn_inputs.target_tokens: required")
    targets = [int(t) for t in _tensor(f"data[{i}].loss_fn_inputs.target_tokens", inputs.pop("target_tokens"))]
    fields: dict[str, list[float]] = {}
    for key, tensor in inputs.items():
        if key not in _INPUTS:
            raise BadRequest(f"data[{i}].loss_fn_inputs.{key}: not served (give {', '.join(_INPUTS)})")
        fields[_INPUTS[key]] = [float(v) for v in _tensor(f"data[{i}].loss_fn_inputs.{key}", tensor)]
    return Datum(tokens, targets, **fields)


def _tensor(where: str, tensor: pb.Tensor) -> list[float] | list[int]:
    if tensor.WhichOneof("encoding") != "dense":
        raise BadRequest(f"{where}: a sparse tensor (top-K targets) is not served")
    if len(tensor.shape) != 1:
        raise BadRequest(f"{where}: shape {list(tensor.shape)}; lorarl serves one value per target ([N])")
    if tensor.dtype not in _NUMPY:
        raise BadRequest(f"{where}: dtype {pb.DType.Name(tensor.dtype)} is not served")
    values = np.frombuffer(tensor.dense, dtype=np.dtype(_NUMPY[tensor.dtype]).newbyteorder("<"))
    if values.size != tensor.shape[0]:
        raise BadRequest(f"{where}: {values.size} values for shape [{tensor.shape[0]}]")
    return values.tolist()


def encode_forward_backward(result: ForwardBackwardResult) -> bytes:
    """A ForwardBackwardOutput: per datum `logprobs` and `elementwise_loss`, and the metrics."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(result.logprobs))
    for name, rows in (("logprobs", result.logprobs), ("elementwise_loss", result.elementwise_loss)):
        record.fields[name].CopyFrom(_batched(rows))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for key, value in result.metrics.items():
        out.metrics[key] = value
    return bytes(out.SerializeToString())


def _batched(rows: Sequence[Sequence[float]]) -> pb.BatchedTensor:
    """Rows of float32 values as one BatchedTensor: the values end to end, and the byte offset of each row."""
    arrays = [np.asarray(row, dtype="<f4") for row in rows]
    offsets = np.cumsum([0, *(a.nbytes for a in arrays)]).astype("<i8")
    data = b"".join(a.tobytes() for a in arrays)
    return pb.BatchedTensor(data=data, offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)


def encode_sample(
    sequences: Sequence[tuple[Sequence[int], Sequence[float], str]],
    prompt_logprobs: Sequence[float | None] | None = None,
    topk_prompt_logprobs: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> bytes:
    """A SampleResponse: each sequence's (tokens, logprobs, stop reason "stop" | "length"), the prompt's
    logprobs (None where there is none: position 0) and top-k prompt logprobs, when asked for."""
    out = pb.SampleResponse()
    for tokens, logprobs, stop in sequences:
        out.sequences.append(
            pb.SampledSequence(
                stop_reason=pb.STOP_REASON_STOP if stop == "stop" else pb.STOP_REASON_LENGTH,
                tokens=np.asarray(tokens, dtype="<i4").tobytes(),
                logprobs=np.asarray(logprobs, dtype="<f4").tobytes(),
            )
        )
    if prompt_logprobs is not None:
        values = [math.nan if v is None else v for v in prompt_logprobs]
        out.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    if topk_prompt_logprobs is not None:
        out.topk_prompt_logprobs.CopyFrom(_topk(topk_prompt_logprobs))
    return bytes(out.SerializeToString())


def _topk(rows: Sequence[Sequence[tuple[int, float]]]) -> pb.TopkLogprobs:
    """[length, k] token ids and logprobs; a position with fewer than k (position 0: none) is filled
    with token 0 and -99999, which the SDK reads as no entry."""
    k = max((len(row) for row in rows), default=0)
    ids = np.zeros((len(rows), k), dtype="<i4")
    logprobs = np.full((len(rows), k), -99999.0, dtype="<f4")
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate(row):
            ids[i, j], logprobs[i, j] = token, logprob
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=logprobs.tobytes(), k=k, length=len(rows))
