"""Sampling: creating a sampling session on a model's or a checkpoint's weights, reading it, and queued samples."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from skyrl_tinker.routes.common import API, Sampling, Tenant, read_json

router = APIRouter(prefix=API)


@router.post("/create_sampling_session")
async def create_sampling_session(request: Request, tenant: Tenant, sampling: Sampling) -> dict[str, Any]:
    return sampling.create_sampling_session(tenant, await read_json(request))


@router.get("/samplers/{sampling_id}")
async def sampler_info(sampling_id: str, tenant: Tenant, sampling: Sampling) -> dict[str, Any]:
    return sampling.sampler_info(tenant, sampling_id)


@router.post("/asample")
async def asample(request: Request, tenant: Tenant, sampling: Sampling) -> dict[str, Any]:
    future, sequence_ids = sampling.asample(tenant, await read_json(request))
    return {"request_id": future.request_id, "sample_sequence_ids": sequence_ids}
