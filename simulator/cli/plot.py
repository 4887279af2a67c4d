"""`servesim plot`: the standard plots of a saved result, registered onto the main typer app
by `register(app)`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import check_folder_writable, check_writable, guarded


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

        def go() -> None:
            from ..metrics.persistence import load_result
            from ..metrics.plots import PLOT_NAMES, write_plots

            folder = out if out is not None else result_dir
            flag = "--out" if out is not None else "RESULT_DIR"
            check_folder_writable(flag, folder)
            for name in PLOT_NAMES:
                check_writable(flag, folder / f"{name}.png")
            result = load_result(result_dir)
            for path in write_plots(result, folder):
                typer.echo(str(path))

        guarded(go)
