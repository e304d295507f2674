"""The front door lists every extra the package declares, each spelled one way."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_install_section_lists_every_extra(page: str) -> None:
    text = (ROOT / page).read_text()
    section = text[text.index("## Install") :]
    section = section[: section.index("\n## ", 3)]
    listed = set(re.findall(r"^\| ((?:`[\w-]+`(?:, )?)+) \|", section, re.M))
    names = {n for cell in listed for n in re.findall(r"`([\w-]+)`", cell)}
    assert names == set(EXTRAS)
    assert "pip install 'chute[x]'" in section and "pip install -e '.[x]'" in section


def test_every_page_spells_an_extra_one_way() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        for line in page.read_text().splitlines():
            for spelling in re.findall(r"pip install [^`\n#]*\[[\w,-]+\][^`\n#\s]*", line):
                assert re.fullmatch(r"pip install (-e )?'(chute|\.)\[[\w,-]+\]'", spelling), (
                    page.name,
                    spelling,
                )
