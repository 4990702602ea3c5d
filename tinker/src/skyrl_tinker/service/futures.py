"""Futures of queued work (:mod:`skyrl_tinker.routes.futures`): a tenant polls its own, one at a time or a
sampling session's completions at once, and cancels its samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_core.http_hygiene import shown

from skyrl_tinker.fields import Fields, at_most
from skyrl_tinker.futures import Future
from skyrl_tinker.service.sampling import MAX_CLONES
from skyrl_tinker.service.state import RequestError, ServerState, owned

MAX_RETRIEVED_IDS = 4096  # ids one retrieve_futures call acknowledges (the client's are at most those it sent)


class FutureRequests:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def retrieve_future(self, tenant: str, body: Mapping[str, Any], wait: float) -> tuple[Future, bool]:
        """The tenant's future the body names, and whether it settled within ``wait`` seconds."""
        future = self._future(tenant, Fields(body).text("request_id"))
        return future, await self.state.futures.wait(future, wait)

    async def retrieve_futures(self, tenant: str, body: Mapping[str, Any], max_wait: float) -> dict[str, Any]:
        """Completions of one sampling session since the client's cursor (see ``futures.CompletionLog``)."""
        fields = Fields(body)
        target = fields.obj("target")
        kind = target.text("type", "sampling_session")
        if kind != "sampling_session":
            raise RequestError(400, f"retrieve_futures polls sampling sessions only, not {shown(kind)}")
        sampling_id = target.text("sampling_session_id")
        key = (sampling_id, target.integer("cloned_sampler_id", 0, lo=0, hi=MAX_CLONES - 1))
        wait = min(fields.number("timeout", max_wait, lo=0.0), max_wait)
        cursor = fields.integer("prev_cursor", 0)
        retrieved = [str(i) for i in at_most(fields.items("retrieved_request_ids"), MAX_RETRIEVED_IDS,
                                              "retrieved_request_ids")]
        self.state.sampling_session(tenant, sampling_id)
        found, cursor = await self.state.futures.completions(key, cursor, wait, retrieved)
        return {"completions": [_completion(f) for f in found], "cursor": cursor}

    def cancel_future(self, tenant: str, body: Mapping[str, Any]) -> None:
        """The client abandoned a sampling request: its future fails (``cancelled``) and its decoding stops."""
        future = self._future(tenant, Fields(body).text("request_id"))
        if future.kind != "sample":
            raise RequestError(400, f"only sampling requests can be cancelled; {future.request_id!r} is a "
                                    f"{future.kind} request")
        self.state.stop_sample(future, "cancelled by the client")

    def _future(self, tenant: str, request_id: str) -> Future:
        return owned(self.state.futures.get(request_id), tenant,
                     f"unknown request id {shown(request_id)} (never issued, or its session was reaped)")


def _completion(future: Future) -> dict[str, Any]:
    if future.error is not None:
        return {"state": "failed", "request_id": future.request_id}
    size = len(future.result) if isinstance(future.result, bytes) else None
    return {"state": "finished", "request_id": future.request_id, "response_payload_uncompressed_size": size}
