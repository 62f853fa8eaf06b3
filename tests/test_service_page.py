"""The web page at `/`, driven in a real headless Chromium (Debian's, through Playwright)."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from cogency.tools.rooms import user_directory
from serverutil import Server, create_key

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")
CHROMIUM = "/usr/bin/chromium"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
if not IN_CI:
    pytest.importorskip("playwright", reason="pip install -e '.[test]'; under CI=true this fails")
    if not shutil.which(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it); under CI=true "
                    "this fails", allow_module_level=True)
from playwright.sync_api import expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    served = tmp / "root"
    root = user_directory(served, "alice")  # alice's tools work in her own directory
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("hi\n")
    db = str(tmp / "page.db")
    key = create_key(db, "alice")
    server = Server(db, tmp, "--tools", "files", "--root", str(served))
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                  args=["--no-sandbox"])
            try:
                yield chromium, server, key, db, root
            finally:
                chromium.close()
    finally:
        server.stop()


@pytest.fixture
def browser_page(browser):
    chromium, server, key, db, root = browser
    context = chromium.new_context()  # its own storage: no key carried over between tests
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(server.url + "/")
    yield page, key, db, root
    context.close()


def count(db, sql):
    connection = sqlite3.connect(db)
    try:
        return connection.execute(sql).fetchone()[0]
    finally:
        connection.close()


def test_chat_steps_profile_and_forget(browser_page):
    page, key, db, root = browser_page
    page.fill("#key", key)
    page.click("#save-key")
    page.fill("#query", "hello page")
    page.click("#send")
    expect(page.locator(".msg.assistant").last).to_have_text("echo: hello page")
    # the steps of a run show as they happen: the tool call and its result
    page.fill("#query", "tool look around")
    page.click("#send")
    expect(page.locator(".msg.assistant").last).to_have_text("listed: tool look around")
    expect(page.locator(".step.action").last).to_contain_text("file_list")
    expect(page.locator(".step.result").last).to_contain_text("notes.txt")
    # the same conversation goes on
    page.fill("#query", "recall")
    page.click("#send")
    expect(page.locator(".msg.assistant").last).to_have_text("you said: hello page")
    # what the server sends is text, never markup
    page.fill("#query", "<img src=x id=injected>")
    page.click("#send")
    expect(page.locator(".msg.assistant").last).to_have_text("echo: <img src=x id=injected>")
    assert page.locator("#injected").count() == 0
    assert count(db, "SELECT COUNT(*) FROM conversations WHERE user_id = 'alice'") == 1
    # a tool call that needs approval: denied, then approved
    answers = page.locator(".msg.assistant").count()
    page.fill("#query", "write denied.txt")
    page.click("#send")
    expect(page.locator(".approval").last).to_contain_text("file_write")
    page.locator(".approval button.deny").last.click()
    expect(page.locator(".msg.assistant")).to_have_count(answers + 1)
    expect(page.locator(".msg.assistant").last).to_contain_text("denied")
    assert not (root / "denied.txt").exists()
    answers = page.locator(".msg.assistant").count()
    page.fill("#query", "write approved.txt")
    page.click("#send")
    expect(page.locator(".approval").last).to_contain_text('"path":"approved.txt"')
    page.locator(".approval button.approve").last.click()
    expect(page.locator(".msg.assistant")).to_have_count(answers + 1)
    expect(page.locator(".msg.assistant").last).to_contain_text("the tool said")
    assert (root / "approved.txt").read_text() == "written"
    # the profile, then forgetting it all
    page.click("#show-profile")
    expect(page.locator("#profile")).to_contain_text('"user_id": "alice"')
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#forget")
    expect(page.locator("#profile")).to_have_text("forgotten")
    assert count(db, "SELECT COUNT(*) FROM conversations WHERE user_id = 'alice'") == 0
    assert count(db, "SELECT COUNT(*) FROM user_profiles WHERE user_id = 'alice'") == 0
    assert not root.exists()  # her tools' directory went with the rest


def test_a_wrong_key_is_said_plainly(browser_page):
    page = browser_page[0]
    page.fill("#key", "cog_not_a_key")
    page.click("#save-key")
    page.fill("#query", "hello")
    page.click("#send")
    expect(page.locator(".step.error").last).to_contain_text("not valid")


def test_an_approval_shows_the_whole_call_escaped_before_it_can_be_approved(browser_page):
    """The call's arguments are shown whole (they were cut at 400 characters, so a long
    harmless-looking start hid what came after), with bidi and control characters escaped
    as the command line escapes them; Approve works only once the call was scrolled to its
    end."""
    import json

    from cogency.cli import visible

    page, key, db, root = browser_page
    page.fill("#key", key)
    page.click("#save-key")
    page.fill("#query", "write-long tidy.txt")
    page.click("#send")
    box = page.locator(".approval").last
    shown = box.locator("pre.call")
    expect(shown).to_contain_text("and then: touch pwned")
    content = "Tidying notes… " + "." * 1600 + " \u202e and then: touch pwned"
    call = {"path": "tidy.txt", "content": content}
    text = shown.text_content()
    assert "\u202e" not in text and "\\u202e and then: touch pwned" in text
    arguments = json.dumps(call, ensure_ascii=False, separators=(",", ":"))
    assert text == visible(f"file_write({arguments})", keep="")  # as the CLI escapes it
    approve = box.locator("button.approve")
    expect(approve).to_be_disabled()
    expect(box.locator(".hint")).to_contain_text("Scroll to the end")
    approve.click(force=True)  # a click on the disabled button decides nothing
    assert not (root / "tidy.txt").exists()
    shown.evaluate("element => { element.scrollTop = element.scrollHeight; }")
    expect(approve).to_be_enabled()
    approve.click()
    expect(page.locator(".msg.assistant").last).to_contain_text("the tool said")
    assert (root / "tidy.txt").read_text() == content
