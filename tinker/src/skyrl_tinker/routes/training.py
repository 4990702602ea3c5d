"""Models and training: creating and unloading LoRA models, forward(-backward) passes, optimizer steps, and
saving and loading their weights. All of it is queued: a route answers ``{"request_id": ...}`` at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from skyrl_core.http_hygiene import check_json_structure

from skyrl_tinker.config import ServerConfig
from skyrl_tinker.fields import Fields, integers
from skyrl_tinker.futures import Future
from skyrl_tinker.routes.common import API, Config, Service, Tenant, read_json
from skyrl_tinker.service import RequestError
from skyrl_tinker.wire import DatumIn, ForwardBackwardIn, decompress, parse_forward_backward, tensor_from_json

router = APIRouter(prefix=API)


@router.post("/create_model")
async def create_model(request: Request, tenant: Tenant, svc: Service) -> dict[str, Any]:
    future, model_id = svc.create_model(tenant, await read_json(request))
    return _queued(future, model_id)


@router.post("/get_info")
async def get_info(request: Request, tenant: Tenant, svc: Service) -> dict[str, Any]:
    return svc.get_info(tenant, await read_json(request))


@router.post("/unload_model")
async def unload_model(request: Request, tenant: Tenant, svc: Service) -> dict[str, Any]:
    return await _queue_for_model(request, partial(svc.unload_model, tenant))


@router.post("/forward_backward")
async def forward_backward(request: Request, tenant: Tenant, svc: Service, config: Config) -> dict[str, Any]:
    parsed = await _forward_backward_body(request, config, forward_only=False)
    return _queued(svc.forward_backward(tenant, parsed), parsed.model_id)


@router.post("/forward")
async def forward(request: Request, tenant: Tenant, svc: Service, config: Config) -> dict[str, Any]:
    parsed = await _forward_backward_body(request, config, forward_only=True)
    return _queued(svc.forward_backward(tenant, parsed), parsed.model_id)


@router.post("/optim_step")
async def optim_step(request: Request, tenant: Tenant, svc: Service) -> dict[str, Any]:
    return await _queue_for_model(request, partial(svc.optim_step, tenant))


@router.post("/save_weights")
async def save_weights(request: Request, tenant: Tenant, svc: Service) -> dict[str, Any]:
    return await _queue_for_model(request, partial(svc.save_weights, tenant))


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request, tenant: Tenant, svc: Service) -> dict[str, Any]:
    return await _queue_for_model(request, partial(svc.save_weights_for_sampler, tenant))


@router.post("/load_weights")
async def load_weights(request: Request, tenant: Tenant, svc: Service) -> dict[str, Any]:
    return {"request_id": svc.load_weights(tenant, await read_json(request)).request_id}


def _queued(future: Future, model_id: str) -> dict[str, Any]:
    return {"request_id": future.request_id, "model_id": model_id}


async def _queue_for_model(request: Request, queue: Callable[[dict[str, Any]], Future]) -> dict[str, Any]:
    """Queues the work of a body that names its ``model_id``."""
    body = await read_json(request)
    return _queued(queue(body), body["model_id"])


async def _forward_backward_body(request: Request, config: ServerConfig, *, forward_only: bool) -> ForwardBackwardIn:
    """The batch of a (zstd-compressed) protobuf or JSON body."""
    raw = decompress(await request.body(), request.headers.get("content-encoding"), config.max_decompressed_bytes)
    if "protobuf" in request.headers.get("content-type", ""):
        parsed = parse_forward_backward(raw)
        parsed.forward_only = parsed.forward_only or forward_only
        return parsed
    check_json_structure(raw, config.http_limits())  # what a zstd body decompressed to has not been checked yet
    try:
        body = Fields(json.loads(raw or b"{}"))
    except ValueError as exc:
        raise RequestError(400, f"body is neither protobuf (Content-Type) nor JSON: {exc}") from None
    fb = body.obj("forward_backward_input", required=True)
    data = [_json_datum(raw_datum, i) for i, raw_datum in enumerate(fb.items("data"))]
    return ForwardBackwardIn(body.text("model_id"), body.integer("seq_id", None), data, fb.text("loss_fn"),
                             dict(fb.obj("loss_fn_config").data), forward_only)


def _json_datum(raw: Any, i: int) -> DatumIn:
    datum = Fields(raw, f"forward_backward_input.data[{i}]")
    tokens = []
    for j, raw_chunk in enumerate(datum.obj("model_input").items("chunks")):
        chunk = Fields(raw_chunk, f"{datum.where}.model_input.chunks[{j}]")
        tokens += integers(chunk.items("tokens"), f"{chunk.where}.tokens")
    inputs = {k: tensor_from_json(v, f"datum {i} loss_fn_inputs[{k!r}]")
              for k, v in datum.obj("loss_fn_inputs").data.items()}
    return DatumIn(tokens, inputs)
