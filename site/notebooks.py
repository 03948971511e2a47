"""Execute a chapter's jupytext notebook on the CPU and render it as markdown for its page.

Why this exists: the book shows each day's experiment *run*, with the outputs the code produces
today, not outputs pasted in when the chapter was written. A cell that raises fails the build.

The notebook runs in a fresh ipykernel with the repository root as its working directory (as
`python chapters/<day>/notebook.py` from the root would). Its figures use matplotlib's inline
backend, which renders through Agg like MPLBACKEND=Agg does but also hands each figure back as a
PNG output; MPLBACKEND=Agg itself would silently drop them. Images are written as files next to
the page; nothing is embedded as base64 and no JavaScript output is kept.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbconvert import MarkdownExporter

HEADING = re.compile(r"#{1,4} ")
TEMPLATE = Path(__file__).resolve().parent / "notebook.md.j2"  # outputs fenced as .nb-output


class NotebookFailed(RuntimeError):
    pass


def execute(source: Path, root: Path, timeout: int = 900) -> nbformat.NotebookNode:
    """Run every cell of ``source`` (py:percent) in a new python3 kernel; raise on any error."""
    nb = jupytext.read(source)
    env = dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline")
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            extra_arguments=["--IPKernelApp.log_level=ERROR"],
                            resources={"metadata": {"path": str(root)}})
    try:
        client.execute(env=env)
    except CellExecutionError as e:
        raise NotebookFailed(f"{source}: a cell raised\n{e}") from None
    return nb


def demote_headings(nb: nbformat.NotebookNode, levels: int) -> None:
    """Push markdown headings down ``levels`` so that the notebook nests under the page's own.

    >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Setup")])
    >>> demote_headings(nb, 2)
    >>> nb.cells[0].source
    '### Setup'
    """
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        lines, in_fence = [], False
        for line in cell.source.split("\n"):
            if line.lstrip().startswith(("```", "~~~")):
                in_fence = not in_fence
            elif not in_fence and HEADING.match(line):
                line = "#" * levels + line
            lines.append(line)
        cell.source = "\n".join(lines)


def to_markdown(nb: nbformat.NotebookNode, page_dir: Path, files_dir: str = "notebook_files"
                ) -> str:
    """Markdown for ``nb``; its images are written under ``page_dir/files_dir``."""
    exporter = MarkdownExporter(template_file=str(TEMPLATE))
    exporter.exclude_raw = True
    body, resources = exporter.from_notebook_node(
        nb, resources={"output_files_dir": files_dir, "unique_key": "notebook"})
    for name, data in resources.get("outputs", {}).items():
        path = page_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return body
