"""`mgit serve` in a real headless Chromium (Debian's, driven by playwright, as the graph
page's tests do): a real uvicorn server on 127.0.0.1 and a free port, every page reached by
clicking from the models list, with every request that does not go to the server blocked and
recorded (none may be attempted), console errors collected (none may happen), and a
screenshot of the page saved when a test fails. MGIT_NO_BROWSER=1 skips them."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
import uvicorn  # noqa: E402
from conftest import HOSTILE  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.web.app import create_app  # noqa: E402


def start_server(app: object) -> tuple[str, uvicorn.Server]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))  # type: ignore[arg-type]
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    for _ in range(200):  # bounded: 10 s
        if server.started:
            return f"http://127.0.0.1:{sock.getsockname()[1]}", server
        time.sleep(0.05)
    raise AssertionError("the server did not start")


@pytest.fixture(scope="module")
def served(web_family: Repo) -> Iterator[str]:
    base, server = start_server(create_app(web_family))
    yield base
    server.should_exit = True


@pytest.fixture
def open_page(
    browser: object, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[object]:
    """`open_page(base)` -> a new page that may talk to `base` only; checked when the test ends
    (`expected`: a console error the test causes on purpose)."""
    problems: list[str] = []
    pages = []
    failed_before = request.session.testsfailed

    def opener(base: str, *, expected: str | None = None) -> object:
        page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
        page.set_default_timeout(15_000)
        page.on(
            "console",
            lambda m: (
                problems.append(f"console: {m.text}")
                if m.type in ("error", "warning") and not (expected and expected in m.text)
                else None
            ),
        )
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

        def route(r: object) -> None:
            url = r.request.url  # type: ignore[attr-defined]
            if url.startswith(base + "/") or url == base:
                r.continue_()  # type: ignore[attr-defined]
            else:
                problems.append(f"request left the machine: {url}")
                r.abort()  # type: ignore[attr-defined]

        page.route("**/*", route)
        pages.append(page)
        return page

    yield opener
    if request.session.testsfailed > failed_before:
        folder = Path(os.environ.get("MGIT_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
        for i, page in enumerate(pages):
            shot = folder / f"{request.node.name}-{i}.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
    for page in pages:
        assert page.evaluate("window.pwned") is None
        page.close()
    assert problems == []


def test_every_page_by_clicking_from_the_models_list(served: str, web_family: Repo, open_page: object) -> None:
    page = open_page(served)  # type: ignore[operator]
    page.goto(served + "/")
    assert page.url == served + "/models"
    assert page.locator("#models tbody tr[data-model]").count() == 4
    assert HOSTILE in page.locator('tr[data-model="base"]').inner_text()  # the tag, as text

    page.fill("#search", "ft")  # search (Enter submits the form)
    page.press("#search", "Enter")
    page.wait_for_url("**/models?q=ft*")
    assert page.locator("#models tbody tr[data-model]").count() == 1
    page.select_option('select[name="relation"]', "quantize")  # a filter submits on change
    page.wait_for_url("**relation=quantize*")
    assert page.locator("#models tbody tr[data-model]").count() == 0
    page.click("text=clear")
    page.wait_for_url("**/models")
    page.click('a[data-sort="size"]')  # sort by a column
    page.wait_for_url("**sort=size*")
    sizes = [n.logical_bytes for n in sorted(web_family.lineage.nodes.values(), key=lambda n: -n.logical_bytes)]
    assert sizes[0] > sizes[-1] and page.locator("#models tbody tr[data-model]").first.get_attribute("data-model") in [
        n.name for n in web_family.lineage.nodes.values() if n.logical_bytes == sizes[0]
    ]

    page.click('a.model-link:text-is("org/ft")')  # a model
    assert page.locator("#model-name").inner_text().startswith("org/ft")
    card = page.locator("#card")
    assert card.locator("table").count() == 1 and card.locator("script, img, iframe").count() == 0
    assert "window.pwned = 4" in card.inner_text()  # raw HTML shown as text, never run
    assert page.locator("#files").inner_text().count('<img src=x onerror="window.pwned=8">.txt') == 1
    assert "stale: base is now at @2" in page.locator("#parents").inner_text()
    assert page.locator("#tensors tr").count() == 1 + len(web_family.manifest("org/ft").tensors())

    page.click("#lineage-link")  # the graph, centred on the model
    assert page.locator("#panel h2").inner_text() == "org/ft"
    assert page.locator(".node").count() == 3
    page.focus('.node[data-model="q8"]')  # another model in the graph (by keyboard: the panel covers it)
    page.keyboard.press("Enter")
    assert page.locator("#panel h2").inner_text() == "q8"
    page.click("#model-page")
    assert page.locator("#model-name").inner_text().startswith("q8")
    page.go_back()
    page.click("#links a:text-is('back to org/ft')")
    assert page.locator("#model-name").inner_text().startswith("org/ft")

    page.click('#parents a:text-is("diff")')  # a diff: progress, then the heatmap
    page.wait_for_selector("#heatmap", timeout=30_000)
    groups = web_family.diff("base@1", "org/ft@1").groups
    assert page.locator("#heatmap .heat-row").count() == len(groups)
    assert page.locator("#groups tr[data-group]").count() == len(groups)
    assert "config.json only b" in page.locator("#files").inner_text().replace("\t", " ")

    page.click("header.top nav a:text-is('Tests')")  # the matrix with the planted failure
    page.wait_for_url("**/tests")
    cell = page.locator('#matrix tr[data-model="q8"] td[data-test="acc"]')
    assert cell.get_attribute("data-status") == "fail" and "broke" in cell.inner_text()
    assert page.locator('#matrix td[data-status="pass"]').count() == 3
    cell.locator("a.result-link").click()
    assert "acc 0.2 < 0.5" in page.locator("#reasons").inner_text()
    assert "<script>window.pwned = 7</script>" in page.locator("#output").inner_text()

    page.click("header.top nav a:text-is('Storage')")
    page.wait_for_url("**/storage")
    assert page.locator("#storage tr[data-model]").count() == 4
    assert page.locator('#storage rect[data-kind="delta"]').count() >= 1
    page.locator('#storage a:text-is("q8")').click()
    assert page.locator("#model-name").inner_text().startswith("q8")


def test_the_token_is_enforced_off_localhost(web_family: Repo, open_page: object) -> None:
    # A token given on the loopback is enforced as it is on any other address.
    base, server = start_server(create_app(web_family, token="tok-123"))
    try:
        page = open_page(base, expected="status of 401")  # type: ignore[operator]
        response = page.goto(base + "/models")
        assert response.status == 401 and "token" in page.inner_text("body")
        page.goto(base + "/models?token=wrong")
        assert "wrong token" in page.inner_text("body")
        page.goto(base + "/models?q=q8&token=tok-123")
        assert page.url == base + "/models?q=q8"  # the token left the address for a cookie
        assert page.locator("#models tbody tr[data-model]").count() == 1
        assert page.evaluate("fetch('/api/models').then(r => r.status)") == 200
    finally:
        server.should_exit = True
