"""``skyrl-tinker serve`` (also ``skyrl tinker serve``): run the Tinker API server."""

from __future__ import annotations

import os
from enum import Enum
from typing import NoReturn

import typer

from skyrl_tinker.tenants import DEFAULT_TENANT, Limits, TenantConfigError, load_api_keys

DEFAULT_PORT = 8000
API_KEY_VARIABLE = "SKYRL_TINKER_API_KEY"


class SamplerEngine(str, Enum):
    hf = "hf"
    vllm = "vllm"


SAMPLER_ENGINE_OPTION = typer.Option(
    SamplerEngine.hf, "--sampler-engine", help="hf: transformers on --device; vllm: vLLM on the first visible GPU "
    "(pip install 'skyrl-trainers[vllm]', Linux with CUDA).")


def serve(
    base_model: str = typer.Option("tiny-random", "--base-model",
                                   help="Built-in name (tiny-random, smollm2-135m), local HF folder or hub id."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (without --api-key or --api-keys "
                             "there is no authentication: keep it on loopback or a trusted network)."),
    allowed_hosts: list[str] | None = typer.Option(None, "--allowed-host", help="A name clients reach the server by "  # noqa: B008
                                                   "beyond the loopback ones and --host (their Host header); "
                                                   "repeatable. Other names get 421, as a DNS-rebinding web page "
                                                   "would."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to listen on."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    checkpoint_dir: str = typer.Option("~/.cache/skyrl/tinker", "--checkpoint-dir",
                                       help="Where tinker:// checkpoints are written (kept across restarts)."),
    session_timeout: float = typer.Option(300.0, "--session-timeout",
                                          help="Seconds without a heartbeat before a session is reaped."),
    max_batch_datums: int = typer.Option(1024, "--max-batch-datums",
                                         help="Most datums accepted in one forward_backward request."),
    api_key: str | None = typer.Option(None, "--api-key", envvar=API_KEY_VARIABLE,
                                       help="One shared key (the client's api_key: tml- and at least 16 more "
                                       "characters) every request must carry; all clients are one tenant. An empty "
                                       "key is an error. Default: no check."),
    api_keys: str | None = typer.Option(None, "--api-keys", help="A file of '<tenant> <key>' lines, readable "
                                         "by its owner only (chmod 600): each tenant sees only its own sessions, "
                                         "models, samplers and checkpoints."),
    max_sessions: int = typer.Option(Limits.sessions, "--max-sessions", min=1,
                                     help="Most open sessions (ServiceClients) per tenant."),
    max_adapters: int = typer.Option(Limits.adapters, "--max-adapters", min=1,
                                     help="Most live training models (LoRA adapters) per tenant."),
    max_queued_requests: int = typer.Option(Limits.queued, "--max-queued-requests", min=1,
                                            help="Most requests queued or running per tenant."),
    max_sampling_sessions: int = typer.Option(Limits.sampling_sessions, "--max-sampling-sessions", min=1,
                                              help="Most open sampling sessions (SamplingClients) per tenant; "
                                              "past it, the tenant's least recently used idle one is closed."),
    max_body_mb: int = typer.Option(64, "--max-body-mb", min=1, help="Largest request body in MB; a "
                                    "zstd-compressed forward_backward body may decompress to at most 4x this (and "
                                    "to no more than the largest valid batch needs)."),
    sampler_engine: SamplerEngine = SAMPLER_ENGINE_OPTION,
    sampler_gpu_memory_utilization: float = typer.Option(
        0.4, "--sampler-gpu-memory-utilization", min=0.05, max=0.95,
        help="vllm only: the share of the GPU's memory vLLM reserves; the rest is left to the trainer."),
    seed: int | None = typer.Option(None, "--seed", help="Seed what requests leave unseeded (sampling without a "
                                    "seed, LoRA adapters without one), so a script run against a fresh server "
                                    "repeats itself. Default: fresh randomness."),
) -> None:
    """Serve the Tinker API for one base model; clients train LoRA adapters on it and sample from them."""
    import uvicorn
    from skyrl_core.engine import EngineError
    from skyrl_core.http_serving import uvicorn_config

    from skyrl_tinker.app import ServerConfig, create_app

    if api_key is None and api_keys is None and os.environ.get(API_KEY_VARIABLE) == "":
        api_key = ""  # click reads an empty variable as unset; here it is a key that went missing (checked below)
    if api_key is not None and api_keys is not None:
        _fail("give --api-key (one shared key; also read from SKYRL_TINKER_API_KEY) or --api-keys FILE "
              "(a key per tenant), not both")
    try:
        keys = None if api_keys is None else load_api_keys(api_keys)
    except TenantConfigError as exc:
        _fail(str(exc))
    config = ServerConfig(base_model=base_model, device=device, checkpoint_dir=checkpoint_dir,
                          session_timeout=session_timeout, max_batch_datums=max_batch_datums, api_key=api_key,
                          api_keys=keys, sampler_engine=sampler_engine.value,
                          sampler_gpu_memory_utilization=sampler_gpu_memory_utilization, max_sessions=max_sessions,
                          max_adapters=max_adapters, max_queued_requests=max_queued_requests,
                          max_sampling_sessions=max_sampling_sessions, max_body_mb=max_body_mb,
                          allowed_hosts=tuple(allowed_hosts or ()), bound_host=host, seed=seed)
    try:
        config.tenant_keys()  # an unusable key (an empty --api-key: an unset variable) fails before the model loads
    except TenantConfigError as exc:
        _fail(str(exc))
    try:
        app = create_app(config)
    except EngineError as exc:  # e.g. --sampler-engine vllm without vLLM or a GPU: the reason, no traceback
        typer.echo(f"skyrl-tinker: {exc}", err=True)
        if sampler_engine is SamplerEngine.vllm:
            typer.echo("skyrl-tinker: serve with --sampler-engine hf (the default) to sample with transformers.",
                       err=True)
        raise typer.Exit(1) from None
    typer.echo(f"skyrl-tinker: serving {base_model} on http://{host}:{port} (checkpoints in {checkpoint_dir}, "
               f"sampling with {sampler_engine.value})")
    if keys is not None:
        typer.echo(f"skyrl-tinker: {len(keys)} API keys for {len(set(keys.values()))} tenants ({api_keys}); each "
                   "tenant sees only its own sessions, models, samplers, requests and checkpoints", err=True)
    elif api_key is not None:
        typer.echo("skyrl-tinker: one shared API key (--api-key): every client is the one tenant "
                   f"{DEFAULT_TENANT!r}", err=True)
    else:
        typer.echo("skyrl-tinker: single-user mode: no --api-key or --api-keys, so no authentication and every "
                   f"client is the one tenant {DEFAULT_TENANT!r}; keep --host on loopback or a trusted network",
                   err=True)
    # long-polls (40 s) must not hold up Ctrl-C
    uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)).run()


def _fail(message: str) -> NoReturn:
    typer.echo(f"skyrl-tinker: {message}", err=True)
    raise typer.Exit(1)


def build_app() -> typer.Typer:
    from skyrl_core.cli_help import help_format

    app = typer.Typer(help="A Tinker API server on skyrl-trainers.", no_args_is_help=True, add_completion=False,
                      **help_format())
    app.callback()(_group)  # keeps ``serve`` a sub-command (typer collapses a one-command app)
    app.command("serve")(serve)
    return app


def _group() -> None:
    """A Tinker API server on skyrl-trainers."""


def main() -> None:
    build_app()()
