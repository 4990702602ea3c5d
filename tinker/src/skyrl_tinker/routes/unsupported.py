"""Every other ``/api/v1`` path: a 404 naming the feature the tinker client asked for (not 501: the client
retries every 5xx for minutes). Its router must be included last: it matches any path under the prefix."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from skyrl_core.http_hygiene import error_body, shown

from skyrl_tinker.routes.common import API

UNSUPPORTED = {
    "copy_weights": "copying weights between projects",
    "create_custom_loss": "server-side custom losses (forward_backward_custom runs client-side)",
    "save_weights_external": "external weight exports",
    "join_sampling_session": "joining sampling sessions",
    "auth/token": "JWT authentication",
}

router = APIRouter(prefix=API)


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
async def unsupported(rest: str) -> Response:
    feature = UNSUPPORTED.get(rest)
    what = f"{feature} ({API}/{rest})" if feature else f"the endpoint {shown(f'{API}/{rest}')}"
    return Response(error_body(f"skyrl-tinker does not implement {what}"), status_code=404,
                    media_type="application/json")
