"""The web UI in a real headless Chromium: upload, ask, watch tokens stream in, ask a follow-up."""

from __future__ import annotations

import shutil

import pytest

from tests.integration.conftest import png_bytes
from tests.prereq import require

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    require(shutil.which("chromium") is not None, "needs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def test_upload_ask_stream_and_follow_up(browser, service, tmp_path):
    image = tmp_path / "red.png"
    image.write_bytes(png_bytes((320, 200), (220, 30, 30)))
    page = browser.new_page()
    page.goto(service.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.length > 0", timeout=15000)
    page.set_input_files("#file", str(image))
    page.wait_for_selector("#preview", state="visible", timeout=15000)  # the file is read asynchronously

    # The image budget is the client's choice, as image_url.detail is on the API.
    assert page.locator("#detail option").evaluate_all("os => os.map(o => o.value)") == ["auto", "low", "high"]
    page.select_option("#detail", "low")
    page.fill("#question", "What is in this image?")
    page.click("#send")
    page.wait_for_selector("#stats[data-first-token]", timeout=60000)
    first_answer = page.inner_text("#log li.assistant")
    assert first_answer.strip()
    assert float(page.get_attribute("#stats", "data-first-token")) > 0
    assert "tokens/s" in page.inner_text("#stats")

    page.evaluate("delete document.getElementById('stats').dataset.firstToken")
    page.fill("#question", "And what colour is it?")
    page.click("#send")
    page.wait_for_selector("#stats[data-first-token]", timeout=60000)
    entries = page.locator("#log li")
    assert entries.count() == 4  # two questions, two answers
    assert "continued the conversation" in page.inner_text("#stats")
    assert not page.is_visible("#error")
    page.screenshot(path=str(tmp_path / "webui.png"))
    page.close()


def test_ui_shows_server_error_message(browser, service, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    page = browser.new_page()
    page.goto(service.url + "/")
    page.set_input_files("#file", str(bad))  # the browser trusts the .png name; the server does not
    page.fill("#question", "What is this?")
    page.click("#send")
    page.wait_for_selector("#error:not([hidden])", timeout=30000)
    assert "image" in page.inner_text("#error").lower()
    page.close()
