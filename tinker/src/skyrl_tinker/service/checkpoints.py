"""Training runs and their checkpoints (:mod:`skyrl_tinker.routes.checkpoints`): a tenant lists and reads its
own runs, publishes, unpublishes and deletes its own checkpoints, and reads the ``weights_info`` of any
checkpoint it may load."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from skyrl_tinker.checkpoints import CheckpointError, TinkerPath
from skyrl_tinker.fields import Fields
from skyrl_tinker.service.state import RequestError, ServerState, parse_path


class CheckpointRequests:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def list_checkpoints(self, tenant: str, run_id: str) -> dict[str, Any]:
        self.state.own_run(tenant, run_id)
        return {"checkpoints": self.state.checkpoints.list(run_id), "cursor": None}

    def training_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        return self._training_run(run_id, self.state.own_run(tenant, run_id))

    def training_runs(self, tenant: str, limit: int, offset: int) -> dict[str, Any]:
        """The tenant's own runs only."""
        mine = self.state.checkpoints.runs(tenant)
        page = [self._training_run(run_id, run) for run_id, run in mine[offset:offset + limit]]
        return {"training_runs": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(mine)}}

    def _training_run(self, run_id: str, run: Mapping[str, Any]) -> dict[str, Any]:
        checkpoints = self.state.checkpoints.list(run_id)
        last = {ctype: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == ctype), None)
                for ctype in ("training", "sampler")}
        return {"training_run_id": run_id, "base_model": run["base_model"], "model_owner": run["owner"],
                "is_lora": True, "lora_rank": run["lora"]["rank"], "corrupted": False,
                "last_request_time": datetime.fromtimestamp(run["created"], UTC).isoformat(),
                "last_checkpoint": last["training"], "last_sampler_checkpoint": last["sampler"],
                "user_metadata": None}

    def delete_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str) -> None:
        path = self._own_checkpoint(tenant, run_id, checkpoint_id)
        try:
            self.state.checkpoints.delete(path)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def publish_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str, public: bool) -> None:
        """Publish (every tenant may then load and sample it, by its path) or unpublish one of the
        tenant's checkpoints. Idempotent (the client retries a 409 for minutes)."""
        path = self._own_checkpoint(tenant, run_id, checkpoint_id)
        try:
            self.state.checkpoints.set_public(path, public)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def _own_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str) -> TinkerPath:
        path = parse_path(f"tinker://{run_id}/{checkpoint_id}")
        self.state.own_run(tenant, path.run_id)
        return path

    def weights_info(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        run = self.state.readable(tenant, parse_path(Fields(body).text("tinker_path")))
        return {"base_model": run["base_model"], "is_lora": True, "lora_rank": run["lora"]["rank"],
                "train_attn": run["lora"]["train_attn"], "train_mlp": run["lora"]["train_mlp"],
                "train_unembed": False}
