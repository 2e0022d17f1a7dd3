"""The docs site opened from disk (`site/index.html`, no server, no network): every link of every page leads to a
file, and no page loads a script, a style or a font from another host."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []  # what a click opens
        self.loads: list[str] = []  # what the page loads by itself

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "a" and found.get("href"):
            self.links.append(str(found["href"]))
        elif tag in ("script", "img") and found.get("src"):
            self.loads.append(str(found["src"]))
        elif tag == "link" and found.get("href") and found.get("rel") != "canonical":
            self.loads.append(str(found["href"]))


def test_the_site_works_opened_from_disk(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        check=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=540,
    )
    # 404.html is a web server's page, with absolute links
    pages = sorted(set(site.rglob("*.html")) - {site / "404.html"})
    assert (site / "index.html") in pages and (site / "getting-started.html") in pages
    broken, remote = [], []
    for page in pages:
        parser = _Links()
        parser.feed(page.read_text())
        for url in parser.links + parser.loads:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme or parts.netloc:
                if url in parser.loads:
                    remote.append(f"{page.relative_to(site)}: {url}")
                continue
            if not parts.path:
                continue  # an anchor on the same page
            target = (page.parent / urllib.parse.unquote(parts.path)).resolve()
            if not target.is_file():  # a folder opens as a listing from disk
                broken.append(f"{page.relative_to(site)}: {url}")
    assert not broken, broken[:20]
    assert not remote, remote[:20]
    # Search from disk: the offline plugin's inlined index, and the Web Worker shim it needs, served locally.
    assert (site / "search" / "search_index.js").is_file()
    assert "iframe-worker-shim.js" in (site / "index.html").read_text()
