"""The server itself: health, the client's configuration flags, capabilities and (discarded) telemetry."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from skyrl_tinker.routes.common import API, Config, Service

router = APIRouter(prefix=API)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/client/config")
async def client_config(config: Config) -> dict[str, Any]:
    return {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": True,
            "parallel_fwdbwd_chunks": False, "fwdbwd_max_chunk_len": config.max_batch_datums,
            "sample_use_retrieve_futures": True, "custom_loss_server_side": False,
            "sample_join_sampling_session": False}


@router.post("/client/dynamic_config")
async def client_dynamic_config() -> dict[str, Any]:
    return {"sample_cancel_enabled": True}  # an abandoned sample future is cancelled on the server


@router.get("/get_server_capabilities")
async def capabilities(svc: Service) -> dict[str, Any]:
    return svc.capabilities()


@router.post("/telemetry")
async def telemetry() -> dict[str, str]:
    return {"status": "accepted"}  # the client reports its own telemetry; nothing is kept
