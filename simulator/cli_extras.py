"""Extra CLI commands, registered onto the main typer app by `register(app)`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `plot RESULT_DIR [--out DIR]` to `app`."""

    @app.command("plot")
    def plot_cmd(
        result_dir: Annotated[Path, typer.Argument(help="folder written by save_result")],
        out: Annotated[
            Path | None,
            typer.Option("--out", help="folder for the PNGs (default: RESULT_DIR)"),
        ] = None,
    ) -> None:
        """Draw the standard plots of a saved result as PNG files and print their paths."""
        from .cli import _guarded

        def go() -> None:
            from .metrics.persistence import load_result
            from .metrics.plots import write_plots

            result = load_result(result_dir)
            for path in write_plots(result, out if out is not None else result_dir):
                typer.echo(str(path))

        _guarded(go)
