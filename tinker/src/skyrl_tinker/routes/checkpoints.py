"""Training runs and their checkpoints: listing and reading runs, listing, publishing, unpublishing and deleting
checkpoints, and the ``weights_info`` of a checkpoint path."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from skyrl_tinker.routes.common import API, Checkpoints, Tenant, read_json

router = APIRouter(prefix=API)


@router.get("/training_runs")
async def training_runs(tenant: Tenant, checkpoints: Checkpoints, limit: int = 20, offset: int = 0) -> dict[str, Any]:
    return checkpoints.training_runs(tenant, max(limit, 0), max(offset, 0))


@router.get("/training_runs/{run_id}")
async def training_run(run_id: str, tenant: Tenant, checkpoints: Checkpoints) -> dict[str, Any]:
    return checkpoints.training_run(tenant, run_id)


@router.get("/training_runs/{run_id}/checkpoints")
async def list_checkpoints(run_id: str, tenant: Tenant, checkpoints: Checkpoints) -> dict[str, Any]:
    return checkpoints.list_checkpoints(tenant, run_id)


# before the DELETE below, whose checkpoint_id:path would take ".../publish" too
@router.api_route("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/publish", methods=["POST", "DELETE"])
async def publish_checkpoint(request: Request, run_id: str, checkpoint_id: str, tenant: Tenant,
                             checkpoints: Checkpoints) -> None:
    checkpoints.publish_checkpoint(tenant, run_id, checkpoint_id, public=request.method == "POST")


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(run_id: str, checkpoint_id: str, tenant: Tenant, checkpoints: Checkpoints) -> None:
    checkpoints.delete_checkpoint(tenant, run_id, checkpoint_id)


@router.post("/weights_info")
async def weights_info(request: Request, tenant: Tenant, checkpoints: Checkpoints) -> dict[str, Any]:
    return checkpoints.weights_info(tenant, await read_json(request))
