"""mkdocs hook: publish bench/results/*.md and *.png as the site's benchmark pages.

The benchmark scripts write their tables and charts to bench/results/; the site shows those
files as they are (nothing is copied into docs/, so a rerun of `make bench` is the only
source of the numbers). Each table page gets its chart appended when one exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
PREFIX = "benchmarks"


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(RESULTS.glob("*")):
        if path.suffix in (".md", ".png"):
            uri = f"{PREFIX}/{path.name}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    uri = page.file.src_uri
    if not uri.startswith(f"{PREFIX}/"):
        return markdown
    name = Path(uri).stem
    if not markdown.lstrip().startswith("# "):
        markdown = f"# {name.capitalize()} benchmark\n\n{markdown}"
    script = f"`bench/{name}.py`"
    markdown += f"\n\n*Written by {script}; `make bench` reruns every benchmark.*\n"
    if (RESULTS / f"{name}.png").exists():
        markdown += f"\n![{name} benchmark chart]({name}.png)\n"
    return markdown
