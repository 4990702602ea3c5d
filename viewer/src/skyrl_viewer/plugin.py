"""Hook implementations of skyrl-viewer: the ``skyrl view`` command (imports stay light until it runs: the
API and run readers use the standard library only; the server and the export load when asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from skyrl_core import hookimpl

from skyrl_viewer.api import DEFAULT_MAX_SAMPLE_CHARS
from skyrl_viewer.runs import DEFAULT_MAX_LINE_BYTES, Run

DEFAULT_PORT = 8765


@hookimpl
def register_commands(cli: Any) -> None:
    cli.command("view")(view_command)


def view_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders (each with metrics.jsonl, samples.jsonl) or "  # noqa: B008
                                          "results folders of skyrl eval (eval.json, samples.jsonl)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to serve on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; the default is this machine only."),
    allowed_hosts: list[str] | None = typer.Option(None, "--allowed-host", help="A name the page may be reached by "  # noqa: B008
                                                   "beyond the loopback ones and --host (the Host header); "
                                                   "repeatable. Other names get 421, as a DNS-rebinding web page "
                                                   "would."),
    export: Path | None = typer.Option(None, "--export", help="Write one self-contained HTML file instead of "  # noqa: B008
                                       "serving (data and chart library inlined; opens offline)."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
    max_sample_kb: int = typer.Option(DEFAULT_MAX_SAMPLE_CHARS >> 10, "--max-sample-kb", min=1,
                                      help="A sample whose texts hold more than this many KB (1,024 characters) "
                                           "is shown with its longest texts cut; the full sample is one link away."),
    max_line_mb: int = typer.Option(DEFAULT_MAX_LINE_BYTES >> 20, "--max-line-mb", min=1,
                                    help="Larger lines of metrics.jsonl/samples.jsonl are skipped and reported."),
) -> None:
    """Show runs in the browser: metrics charts (live), sample trajectories with tokens, RLM trees; and the
    results folders of `skyrl eval`: their summary and per-task tables, and their samples like a run's."""
    _check_folders(run_dirs)
    runs = [Run(path, max_line_bytes=max_line_mb << 20) for path in run_dirs]
    if export is not None:
        from skyrl_viewer.export import export_html

        typer.echo(f"wrote {export_html(runs, export, max_sample_chars=max_sample_kb << 10)}")
        return
    from skyrl_viewer.server import ViewerServer

    try:
        server = ViewerServer(runs, host=host, port=port, max_sample_chars=max_sample_kb << 10,
                              allowed_hosts=allowed_hosts or ())
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


def _check_folders(run_dirs: list[Path]) -> None:
    """Stop with an error naming each of ``run_dirs`` that is not a folder (a typo would otherwise serve a
    page with nothing on it while the console looks fine)."""
    problems = [f"{path} does not exist" if not path.exists() else f"{path} is not a folder"
                for path in run_dirs if not path.is_dir()]
    if problems:
        for problem in problems:
            typer.echo(f"error: {problem}; skyrl view takes run folders (skyrl run) or results folders "
                       "(skyrl eval)", err=True)
        raise typer.Exit(2)
