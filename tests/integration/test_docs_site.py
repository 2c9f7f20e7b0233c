"""The documentation site as CI builds it: `mkdocs build --strict` (mkdocs.yml: every page in the
nav, every link to a page or a heading that exists, no link out of docs/), then served on
127.0.0.1 and read in headless Chromium: the home page and the recipe-key reference render, the
reference's key table is there, and every link of the site to itself leads somewhere.

The site is built once for the module (a few seconds), so its tests share one xdist worker."""

from __future__ import annotations

import functools
import html.parser
import os
import posixpath
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.browser import CHROMIUM, CHROMIUM_FLAGS

pytestmark = pytest.mark.xdist_group("docs-site")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (
        "mkdocs build --strict failed (a page that names a file outside docs/ does so as a code "
        "span, not a link; every page goes in mkdocs.yml's nav):\n" + done.stdout + done.stderr
    )
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1, on a port the system picks."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_the_site_has_every_page_and_the_reference(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "cnn/index.html",
                 "tracking/index.html", "reference/recipe-keys/index.html",
                 "reference/settings/index.html", "reference/cli/index.html",
                 "benchmarks/index.html"):  # fmt: skip
        assert (site / page).is_file(), page
    for page in ROOT.glob("docs/**/*.md"):  # every page of docs/ is built (and in the nav)
        built = page.relative_to(ROOT / "docs").with_suffix("")
        built = Path() if built.name == "index" else built
        assert (site / built / "index.html").is_file(), page


def test_every_link_within_the_site_leads_to_a_page_and_its_heading(site: Path) -> None:
    """Every href and src of every built page that stays on the site: the file it names exists,
    and the element its #fragment names is in that page."""
    broken, followed = broken_links(site)
    assert not broken, "\n".join(broken)
    assert followed > 500  # every page's nav, assets and content links


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text(
        '<h2 id="here">x</h2><a href="#here">ok</a><a href="../">ok</a><a href="#gone">1</a>'
        '<a href="../b/">2</a><a href="../a/#gone">3</a><a href="../../x.md">4</a>'
        '<a href="https://example.org/">elsewhere</a><img src="/a/missing.png">'
    )
    (tmp_path / "index.html").write_text('<a href="a/#here">ok</a>')
    broken, followed = broken_links(tmp_path)
    assert [line.split(" (")[0] for line in broken] == [
        "a/index.html: #gone", "a/index.html: ../b/", "a/index.html: ../a/#gone",
        "a/index.html: ../../x.md", "a/index.html: /a/missing.png",
    ]  # fmt: skip
    assert followed == 8


def broken_links(site: Path) -> tuple[list[str], int]:
    """The links of the built site's pages to the site that lead nowhere, and how many links
    to the site there are."""
    pages = {page: _Page.parse(page.read_text(encoding="utf-8")) for page in site.rglob("*.html")}
    broken, followed = [], 0
    for page in sorted(pages):
        for link in pages[page].links:
            target, fragment = _target(site, page, link)
            if target is None:
                continue
            followed += 1
            if not target.is_file():
                broken.append(f"{page.relative_to(site)}: {link} (no such file)")
            elif fragment and target in pages and fragment not in pages[target].ids:
                broken.append(f"{page.relative_to(site)}: {link} (no #{fragment} there)")
    return broken, followed


@pytest.mark.slow
def test_home_and_recipe_keys_in_headless_chromium(served: str) -> None:
    """Each page loads with nothing failing and nothing asked of another host; the reference
    shows its key table; every link of the two pages to the site answers 200, its #fragment an
    element of the page it leads to."""
    from playwright.sync_api import sync_playwright

    failures: list[str] = []
    elsewhere: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda error: failures.append(f"script error: {error}"))
            page.on("requestfailed", lambda request: failures.append(f"failed: {request.url}"))
            page.on("response", lambda response: response.status >= 400
                    and failures.append(f"{response.status}: {response.url}"))  # fmt: skip
            page.on("request", lambda request: not request.url.startswith(served)
                    and elsewhere.append(request.url))  # fmt: skip

            page.goto(served, wait_until="networkidle")
            assert page.title().startswith("trainforge")
            page.locator("article h1#trainforge").wait_for()
            home_links = _links(page)
            page.locator("article").get_by_role("link", name="Recipe keys").click()
            page.wait_for_url(f"{served}reference/recipe-keys/", wait_until="networkidle")
            page.locator("article h1#recipe-keys").wait_for()
            table = page.locator("table", has=page.locator("th", has_text="allowed values"))
            headers = table.first.locator("th").all_inner_texts()
            lr_key = page.locator("td code", has_text=re.compile(r"^train\.lr$"))
            lr = page.locator("tr", has=lr_key)
            cells = lr.locator("td").all_inner_texts()
            key_rows = page.locator("td:first-child code").all_inner_texts()
            reference_links = _links(page)
        finally:
            browser.close()
    assert headers == ["key", "type", "default", "allowed values", "meaning"]
    assert cells == ["train.lr", "float", "0.001", "", "Peak learning rate."]
    assert {"run.name", "train.epochs", "workload.kind", "workload.simulation.num_simulations",
            "workload.entry"} <= set(key_rows)  # fmt: skip
    assert not failures, failures
    assert not elsewhere, f"the pages asked other hosts: {elsewhere}"
    internal = sorted({link for link in home_links + reference_links if link.startswith(served)})
    assert f"{served}getting-started/" in internal and f"{served}reference/cli/" in internal
    broken = [f"{link}: {problem}" for link in internal if (problem := _fetch_problem(link))]
    assert not broken, "\n".join(broken)


def _links(page) -> list[str]:
    """Every link's address on the page, as the browser resolves it."""
    return page.eval_on_selector_all("a[href]", "anchors => anchors.map(a => a.href)")


def _fetch_problem(link: str) -> str | None:
    address, _, fragment = link.partition("#")
    try:
        with urllib.request.urlopen(address, timeout=10) as response:
            body = response.read().decode()
    except urllib.error.URLError as exc:
        return str(exc)
    if fragment and urllib.parse.unquote(fragment) not in _Page.parse(body).ids:
        return f"no #{fragment} in the page"
    return None


def _target(site: Path, page: Path, link: str) -> tuple[Path | None, str]:
    """The file of the built site that ``link`` of ``page`` names (None: another site, or no
    file at all), and its fragment."""
    parts = urllib.parse.urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
        return None, ""
    fragment = urllib.parse.unquote(parts.fragment)
    if not parts.path:  # "#heading" within the page
        return page, fragment
    path = urllib.parse.unquote(parts.path)
    if path.startswith("/"):  # from the site's root, where it is served (404.html's links)
        path = posixpath.normpath(path.lstrip("/"))
    else:
        folder = page.parent.relative_to(site).as_posix()
        path = posixpath.normpath(posixpath.join(folder, path))
    if path.startswith(".."):  # above the site's root: nothing is served there
        return site / "__outside_the_site__", fragment
    target = site / path
    if parts.path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, fragment


class _Page(html.parser.HTMLParser):
    """The ids and the links (href, src) of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value and tag in ("a", "link", "script", "img"):
                self.links.append(value)

    @classmethod
    def parse(cls, text: str) -> _Page:
        parser = cls()
        parser.feed(text)
        return parser
