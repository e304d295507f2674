"""mkdocs hooks: the benchmark pages from bench/results/, and docstring examples as code.

The benchmark scripts write their tables and charts to bench/results/; the site shows those
files as they are (nothing is copied into docs/, so a rerun of `make bench` is the only
source of the numbers). Each table page gets its chart appended when one exists.
Docstrings hold their examples as bare doctest lines (pytest runs them); on the site they
are fenced as ``pycon`` code blocks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from markdown.extensions import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
PREFIX = "benchmarks"


# A guide's link to a file of the repository outside docs/ (../examples/x.py): the site has
# no copy of it, so it becomes the path, in code.
_OUTSIDE = re.compile(r"\[([^\]]+)\]\(\.\./(?!bench/results/)([^)#]+)\)")


def _as_repo_path(match: re.Match[str]) -> str:
    text, path = match.group(1), match.group(2)
    return f"`{path}`" if text.strip("`") == path else f"{text} (`{path}`)"


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(RESULTS.glob("*")):
        if path.suffix in (".md", ".png"):
            uri = f"{PREFIX}/{path.name}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    uri = page.file.src_uri
    if not uri.startswith(f"{PREFIX}/"):
        # Guides link to the results as the repository lays them out (../bench/results/x.md);
        # on the site those files live under benchmarks/.
        depth = "../" * uri.count("/")
        markdown = markdown.replace("](../bench/results/", f"]({depth}{PREFIX}/")
        return _OUTSIDE.sub(_as_repo_path, markdown)
    name = Path(uri).stem
    if not markdown.lstrip().startswith("# "):
        markdown = f"# {name.capitalize()} benchmark\n\n{markdown}"
    script = f"`bench/{name.split('-')[0]}.py`"  # insitu-chute.md comes from bench/insitu.py
    markdown += f"\n\n*Written by {script}; `make bench` reruns every benchmark.*\n"
    for chart in sorted(RESULTS.glob(f"{name}*.png")):  # store.png, store-small.png, ...
        if chart.stem != name and (RESULTS / f"{chart.stem}.md").exists():
            continue  # insitu-chute.png belongs to its own page, not to insitu's
        markdown += f"\n![{chart.stem} chart]({chart.name})\n"
    return markdown


# A doctest directive (`# doctest: +SKIP`) is for the test runner; the site leaves it out.
_DIRECTIVE = re.compile(r"\s*# doctest:.*$")


class _DoctestFences(Preprocessor):
    """Fence bare ``>>>`` examples (docstrings keep them plain, for doctest) as pycon code,
    without their doctest directives."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fenced = in_example = False
        for line in lines:
            stripped = line.lstrip()
            if stripped.startswith(("```", "~~~")) and not in_example:
                fenced = not fenced
            if not fenced and not in_example and stripped.startswith(">>>"):
                indent = line[: len(line) - len(stripped)]
                out += ["", f"{indent}```pycon"]
                in_example = True
            elif in_example and not stripped:
                out += [f"{indent}```", ""]
                in_example = False
            out.append(_DIRECTIVE.sub("", line) if in_example else line)
        if in_example:
            out += [f"{indent}```", ""]
        return out


class _DoctestExtension(Extension):
    def extendMarkdown(self, md: Any) -> None:
        md.preprocessors.register(_DoctestFences(md), "chute_doctest_fences", 27)


@event_priority(100)  # before mkdocstrings reads the extension list
def on_config(config: Any) -> Any:
    config.markdown_extensions.append(_DoctestExtension())
    return config
