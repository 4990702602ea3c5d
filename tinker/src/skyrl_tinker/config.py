"""The server's settings (:class:`ServerConfig`): what ``skyrl-tinker serve`` and tests configure, read by
:func:`skyrl_tinker.app.create_app` and, through a dependency, by the routes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from skyrl_core.http_hygiene import JSON_TYPES, HttpLimits

from skyrl_tinker.sampler import SamplerEngineKind
from skyrl_tinker.tenants import DEFAULT_TENANT, Limits, TenantConfigError, check_key

BODY_TYPES = JSON_TYPES | {"application/x-protobuf"}  # what the tinker client sends
BODY_ENCODINGS = frozenset({"zstd"})  # the client compresses forward_backward bodies; routes decompress them


@dataclass
class ServerConfig:
    base_model: str = "tiny-random"
    device: str = "cpu"
    checkpoint_dir: str = "~/.cache/skyrl/tinker"
    session_timeout: float = 300.0
    max_batch_datums: int = 1024
    max_sample_batch: int = 64
    api_key: str | None = None  # when set, every request must carry it as X-API-Key (one tenant, "default")
    api_keys: Mapping[str, str] | None = None  # key -> tenant (serve --api-keys FILE); not with api_key
    # hf: transformers on ``device``; vllm: vLLM on the first visible GPU (needs skyrl-trainers[vllm] and CUDA)
    sampler_engine: SamplerEngineKind = "hf"
    sampler_gpu_memory_utilization: float = 0.4  # vllm only: the share of the GPU vLLM reserves (rest: trainer)
    max_sessions: int = Limits.sessions  # per tenant
    max_adapters: int = Limits.adapters  # per tenant
    max_queued_requests: int = Limits.queued  # per tenant
    max_sampling_sessions: int = Limits.sampling_sessions  # per tenant
    max_body_mb: int = 64  # the largest request body; a zstd forward_backward body may decompress to at most 4x this
    allowed_hosts: tuple[str, ...] = ()  # Host names answered beyond loopback and bound_host (serve --allowed-host)
    bound_host: str | None = None  # the address the server listens on (serve --host)
    seed: int | None = None  # seeds what requests leave unseeded: sampling, LoRA init (serve --seed; see seeds.py)

    def tenant_keys(self) -> dict[str, str] | None:
        """API key -> tenant; None in single-user mode (no keys: every request is ``DEFAULT_TENANT``). Every key
        passes :func:`~skyrl_tinker.tenants.check_key` (:class:`TenantConfigError` otherwise)."""
        if self.api_key is not None and self.api_keys is not None:
            raise TenantConfigError("give api_key (one shared key) or api_keys (a key per tenant), not both")
        if self.api_keys is not None:
            if not self.api_keys:
                raise TenantConfigError("api_keys is empty: give at least one key, or none for single-user mode")
            for key, tenant in self.api_keys.items():
                check_key(key, f"the key of tenant {tenant!r}")
            return dict(self.api_keys)
        if self.api_key is None:
            return None
        check_key(self.api_key, "--api-key")
        return {self.api_key: DEFAULT_TENANT}

    def limits(self) -> Limits:
        """What one tenant may hold at once."""
        return Limits(sessions=self.max_sessions, adapters=self.max_adapters, queued=self.max_queued_requests,
                      sampling_sessions=self.max_sampling_sessions)

    def http_limits(self) -> HttpLimits:
        """What a request may be before a route reads it. A JSON value costs the parser up to ~60 bytes, so at
        most 4 million values (forward_backward batches travel as protobuf, whose size alone is checked)."""
        return HttpLimits(max_body_bytes=self.max_body_mb * 1024 * 1024, max_json_items=4_000_000,
                          allowed_hosts=self.allowed_hosts, body_types=BODY_TYPES, body_encodings=BODY_ENCODINGS)
