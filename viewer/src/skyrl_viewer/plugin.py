"""Hook implementations of skyrl-viewer: the ``skyrl view`` command (imports stay light until it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from skyrl_core import hookimpl

DEFAULT_PORT = 8765


@hookimpl
def register_commands(cli: Any) -> None:
    cli.command("view")(view_command)


def view_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders (each with metrics.jsonl, samples.jsonl)."),  # noqa: B008
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to serve on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; the default is this machine only."),
    export: Path | None = typer.Option(None, "--export", help="Write one self-contained HTML file instead of "  # noqa: B008
                                       "serving (data and chart library inlined; opens offline)."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
) -> None:
    """Show runs in the browser: metrics charts (live), sample trajectories with tokens, RLM trees."""
    from skyrl_viewer.runs import Run

    runs = [Run(path) for path in run_dirs]
    if export is not None:
        from skyrl_viewer.export import export_html

        typer.echo(f"wrote {export_html(runs, export)}")
        return
    from skyrl_viewer.server import ViewerServer

    try:
        server = ViewerServer(runs, host=host, port=port)
    except OSError as exc:
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port)", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"skyrl view: serving {len(runs)} run(s) at {server.url} (Ctrl-C to stop)")
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
