"""``skyrl-tinker serve`` (also ``skyrl tinker serve``): run the Tinker API server."""

from __future__ import annotations

from enum import Enum

import typer

DEFAULT_PORT = 8000


class SamplerEngine(str, Enum):
    hf = "hf"
    vllm = "vllm"


SAMPLER_ENGINE_OPTION = typer.Option(
    SamplerEngine.hf, "--sampler-engine", help="hf: transformers on --device; vllm: vLLM on the first visible GPU "
    "(pip install 'skyrl-trainers\\[vllm]', Linux with CUDA).")


def serve(
    base_model: str = typer.Option("tiny-random", "--base-model",
                                   help="Built-in name (tiny-random, smollm2-135m), local HF folder or hub id."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (without --api-key there is no "
                             "authentication: keep it on loopback or a trusted network)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to listen on."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    checkpoint_dir: str = typer.Option("~/.cache/skyrl/tinker", "--checkpoint-dir",
                                       help="Where tinker:// checkpoints are written (kept across restarts)."),
    session_timeout: float = typer.Option(300.0, "--session-timeout",
                                          help="Seconds without a heartbeat before a session is reaped."),
    max_batch_datums: int = typer.Option(1024, "--max-batch-datums",
                                         help="Most datums accepted in one forward_backward request."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="SKYRL_TINKER_API_KEY",
                                       help="Require this key (the client's api_key, starting with tml-) on "
                                       "every request. Default: no check."),
    sampler_engine: SamplerEngine = SAMPLER_ENGINE_OPTION,
    sampler_gpu_memory_utilization: float = typer.Option(
        0.4, "--sampler-gpu-memory-utilization", min=0.05, max=0.95,
        help="vllm only: the share of the GPU's memory vLLM reserves; the rest is left to the trainer."),
) -> None:
    """Serve the Tinker API for one base model; clients train LoRA adapters on it and sample from them."""
    import uvicorn
    from skyrl_core.engine import EngineError

    from skyrl_tinker.app import ServerConfig, create_app

    config = ServerConfig(base_model=base_model, device=device, checkpoint_dir=checkpoint_dir,
                          session_timeout=session_timeout, max_batch_datums=max_batch_datums, api_key=api_key,
                          sampler_engine=sampler_engine.value,
                          sampler_gpu_memory_utilization=sampler_gpu_memory_utilization)
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
    # long-polls (40 s) must not hold up Ctrl-C
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)


def build_app() -> typer.Typer:
    app = typer.Typer(help="A Tinker API server on skyrl-trainers.", no_args_is_help=True, add_completion=False)
    app.callback()(_group)  # keeps ``serve`` a sub-command (typer collapses a one-command app)
    app.command("serve")(serve)
    return app


def _group() -> None:
    """A Tinker API server on skyrl-trainers."""


def main() -> None:
    build_app()()
