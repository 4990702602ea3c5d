"""Models and training: creating and unloading LoRA models, forward(-backward) passes, optimizer steps, and
saving and loading their weights. All of it is queued: a route answers ``{"request_id": ...}`` at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from skyrl_core.http_hygiene import parse_json, shown

from skyrl_tinker.config import ServerConfig
from skyrl_tinker.fields import Fields, integers
from skyrl_tinker.futures import Future
from skyrl_tinker.routes.common import API, Config, Tenant, Training, read_json
from skyrl_tinker.service.training import TrainingRequests
from skyrl_tinker.wire import (
    Bounds,
    DatumIn,
    ForwardBackwardIn,
    decompress,
    parse_forward_backward,
    tensor_from_json,
)

MAX_TOKENS_WITHOUT_CONTEXT = 1 << 17  # a datum's bound when the model's config states no context length

router = APIRouter(prefix=API)


@router.post("/create_model")
async def create_model(request: Request, tenant: Tenant, training: Training) -> dict[str, Any]:
    future, model_id = training.create_model(tenant, await read_json(request))
    return _queued(future, model_id)


@router.post("/get_info")
async def get_info(request: Request, tenant: Tenant, training: Training) -> dict[str, Any]:
    return training.get_info(tenant, await read_json(request))


@router.post("/unload_model")
async def unload_model(request: Request, tenant: Tenant, training: Training) -> dict[str, Any]:
    return await _queue_for_model(request, partial(training.unload_model, tenant))


@router.post("/forward_backward")
async def forward_backward(request: Request, tenant: Tenant, training: Training, config: Config) -> dict[str, Any]:
    parsed = await _forward_backward_body(request, config, training, forward_only=False)
    return _queued(training.forward_backward(tenant, parsed), parsed.model_id)


@router.post("/forward")
async def forward(request: Request, tenant: Tenant, training: Training, config: Config) -> dict[str, Any]:
    parsed = await _forward_backward_body(request, config, training, forward_only=True)
    return _queued(training.forward_backward(tenant, parsed), parsed.model_id)


@router.post("/optim_step")
async def optim_step(request: Request, tenant: Tenant, training: Training) -> dict[str, Any]:
    return await _queue_for_model(request, partial(training.optim_step, tenant))


@router.post("/save_weights")
async def save_weights(request: Request, tenant: Tenant, training: Training) -> dict[str, Any]:
    return await _queue_for_model(request, partial(training.save_weights, tenant))


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request, tenant: Tenant, training: Training) -> dict[str, Any]:
    return await _queue_for_model(request, partial(training.save_weights_for_sampler, tenant))


@router.post("/load_weights")
async def load_weights(request: Request, tenant: Tenant, training: Training) -> dict[str, Any]:
    return {"request_id": training.load_weights(tenant, await read_json(request)).request_id}


def _queued(future: Future, model_id: str) -> dict[str, Any]:
    return {"request_id": future.request_id, "model_id": model_id}


async def _queue_for_model(request: Request, queue: Callable[[dict[str, Any]], Future]) -> dict[str, Any]:
    """Queues the work of a body that names its ``model_id``."""
    body = await read_json(request)
    return _queued(queue(body), body["model_id"])


async def _forward_backward_body(request: Request, config: ServerConfig, training: TrainingRequests, *,
                                 forward_only: bool) -> ForwardBackwardIn:
    """The batch of a (zstd-compressed) protobuf or JSON body, decoded in a thread: a large body must not hold
    up the other clients' requests while it is decompressed and parsed."""
    bounds = Bounds(config.max_batch_datums, training.state.backend.max_context or MAX_TOKENS_WITHOUT_CONTEXT)
    body, headers = await request.body(), request.headers
    parsed = await asyncio.to_thread(_decode_forward_backward, body, headers.get("content-type", ""),
                                     headers.get("content-encoding"), bounds, config)
    parsed.forward_only = parsed.forward_only or forward_only
    return parsed


def _decode_forward_backward(body: bytes, content_type: str, encoding: str | None, bounds: Bounds,
                             config: ServerConfig) -> ForwardBackwardIn:
    limits = config.http_limits()
    raw = decompress(body, encoding, min(4 * limits.max_body_bytes, max(limits.max_body_bytes, bounds.largest_body())))
    if "protobuf" in content_type:
        return parse_forward_backward(raw, bounds)
    body_fields = Fields(parse_json(raw or b"{}", limits))
    fb = body_fields.obj("forward_backward_input", required=True)
    raw_data = fb.items("data")
    bounds.check_datums(len(raw_data))
    data = [_json_datum(raw_datum, i, bounds) for i, raw_datum in enumerate(raw_data)]
    return ForwardBackwardIn(body_fields.text("model_id"), body_fields.integer("seq_id", None), data, fb.text("loss_fn"),
                             dict(fb.obj("loss_fn_config").data), False)


def _json_datum(raw: Any, i: int, bounds: Bounds) -> DatumIn:
    datum = Fields(raw, f"forward_backward_input.data[{i}]")
    chunks = [Fields(raw_chunk, f"{datum.where}.model_input.chunks[{j}]")
              for j, raw_chunk in enumerate(datum.obj("model_input").items("chunks"))]
    bounds.check_tokens(sum(len(chunk.items("tokens")) for chunk in chunks), i)
    tokens = [token for chunk in chunks for token in integers(chunk.items("tokens"), f"{chunk.where}.tokens")]
    inputs = {k: tensor_from_json(v, f"datum {i} loss_fn_inputs[{shown(k)}]", bounds.max_tokens)
              for k, v in datum.obj("loss_fn_inputs").data.items()}
    return DatumIn(tokens, inputs)
