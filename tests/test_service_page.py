"""The web page at `/`, driven in a real headless Chromium (Debian's, through Playwright)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

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
    others = {user: create_key(db, user) for user in ("page-bob", "page-phone")}
    server = Server(db, tmp, "--tools", "files", "--root", str(served))
    server.keys = others  # type: ignore[attr-defined]  # made before Playwright's loop runs
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


def sign_in_and_ask(page, key, query):
    """Use the key, send ``query`` and see the echo model answer it."""
    page.fill("#key", key)
    page.click("#save-key")
    page.fill("#query", query)
    page.click("#send")
    expect(page.locator(".msg.assistant").last).to_have_text(f"echo: {query}")


def test_chat_steps_profile_and_forget(browser_page):
    page, key, db, root = browser_page
    sign_in_and_ask(page, key, "hello page")
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
    # the profile, then forgetting it all (the page shows what was erased)
    page.click("#show-profile")
    expect(page.locator("#entries li").first).to_contain_text("communication_style: brief")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#forget")
    expect(page.locator("#profile")).to_contain_text("forgotten: profiles 1, entries 1")
    expect(page.locator("#entries li")).to_have_count(0)
    assert count(db, "SELECT COUNT(*) FROM conversations WHERE user_id = 'alice'") == 0
    assert count(db, "SELECT COUNT(*) FROM user_profiles WHERE user_id = 'alice'") == 0
    assert not root.exists()  # her tools' directory went with the rest


def test_each_profile_entry_has_why_edit_and_remove(browser_page):
    page, key, db, root = browser_page
    sign_in_and_ask(page, key, "hello <b>profile</b>")
    entries = page.locator("#entries li")
    for _ in range(100):  # learned in the background
        page.click("#show-profile")
        if entries.count():
            break
        page.wait_for_timeout(100)
    learned = entries.filter(has_text="communication_style: brief answers")
    expect(learned).to_contain_text("(learned ")
    # why? shows the message it was learned from, as text
    learned.locator("button.why-button").click()
    expect(learned.locator(".why")).to_contain_text("user: \u201chello <b>profile</b>\u201d")
    expect(learned.locator(".why")).to_contain_text("scripted")
    assert page.locator(".why b").count() == 0
    # edit: the user's value replaces it, and is marked as theirs
    page.once("dialog", lambda dialog: dialog.accept("terse answers"))
    learned.locator("button.edit-button").click()
    mine = entries.filter(has_text="communication_style: terse answers")
    expect(mine).to_contain_text("(yours)")
    # add one, then remove it
    page.select_option("#entry-field", "preferences")
    page.fill("#entry-key", "editor")
    page.fill("#entry-value", "helix")
    page.click("#add")
    helix = entries.filter(has_text="preferences.editor: helix")
    expect(helix).to_contain_text("(yours)")
    page.once("dialog", lambda dialog: dialog.accept())
    helix.locator("button.remove-button").click()
    expect(helix).to_have_count(0)
    assert count(db, "SELECT COUNT(*) FROM profile_entries WHERE user_id = 'alice' AND "
                     "value = 'helix' AND reason = 'removed'") == 1
    assert count(db, "SELECT COUNT(*) FROM profile_entries WHERE user_id = 'alice' AND "
                     "value = 'terse answers' AND origin = 'user' AND superseded_at IS NULL") == 1
    page.click("#show-history")
    expect(page.locator("#profile")).to_contain_text("communication_style: brief answers  (changed)")
    expect(page.locator("#profile")).to_contain_text("preferences.editor: helix  (removed)")
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["format"] == "cogency.user/1" and exported["user_id"] == "alice"


def test_a_wrong_key_is_said_plainly(browser_page):
    page = browser_page[0]
    page.fill("#key", "cog_not_a_key")
    page.click("#save-key")
    page.fill("#query", "hello")
    page.click("#send")
    expect(page.locator(".step.error").last).to_contain_text("not valid")


def test_use_key_checks_the_key_with_the_server(browser_page):
    page, key = browser_page[0], browser_page[1]
    page.fill("#key", "cog_not_a_key")
    page.click("#save-key")
    expect(page.locator("#who")).to_contain_text("key not accepted")
    expect(page.locator("#who")).to_have_class("bad")
    assert page.evaluate("sessionStorage.getItem('cogency.key')") is None
    page.fill("#key", key)
    page.click("#save-key")
    expect(page.locator("#who")).to_have_text("signed in as alice")


@contextlib.contextmanager
def signed_in(browser, user, **options):
    """A page of its own browser context, with ``user``'s key set (made by the fixture)."""
    chromium, server = browser[0], browser[1]
    context = chromium.new_context(**options)
    page = context.new_page()
    page.set_default_timeout(20_000)
    try:
        page.goto(server.url + "/")
        page.fill("#key", server.keys[user])
        page.click("#save-key")
        yield page
    finally:
        context.close()


def test_conversations_are_listed_and_a_reload_loses_nothing(browser):
    db = browser[3]
    with signed_in(browser, "page-bob") as page:
        expect(page.locator("#conversations")).to_contain_text("none yet")
        for query, answer in [("first words", "echo: first words"),
                              ("tool look", "listed: tool look")]:
            page.fill("#query", query)
            page.click("#send")
            expect(page.locator(".msg.assistant").last).to_have_text(answer)
        expect(page.locator("#conversations button")).to_have_count(1)
        page.reload()  # what was shown comes back from the server
        expect(page.locator("#who")).to_have_text("signed in as page-bob")
        expect(page.locator(".msg.user")).to_have_text(["first words", "tool look"])
        expect(page.locator(".msg.assistant")).to_have_text(
            ["echo: first words", "listed: tool look"])
        expect(page.locator(".step.action")).to_contain_text(["file_list"])
        expect(page.locator("#conversations button.current")).to_have_count(1)
        page.fill("#query", "recall")  # and the conversation goes on
        page.click("#send")
        expect(page.locator(".msg.assistant").last).to_have_text("you said: first words")
        page.click("#new-chat")
        page.fill("#query", "another")
        page.click("#send")
        expect(page.locator(".msg.assistant").last).to_have_text("echo: another")
        expect(page.locator("#conversations button")).to_have_count(2)
        page.locator("#conversations button").last.click()  # the older one, opened again
        expect(page.locator(".msg.user").first).to_have_text("first words")
        page.fill("#query", "more")
        page.click("#send")
        expect(page.locator(".msg.assistant").last).to_have_text("echo: more")
        with contextlib.closing(sqlite3.connect(db)) as connection:
            rows = connection.execute(
                "SELECT c.conversation_id, COUNT(m.seq) FROM conversations c JOIN "
                "conversation_messages m USING (conversation_id) WHERE c.user_id = 'page-bob' "
                "AND m.role = 'user' GROUP BY c.conversation_id ORDER BY COUNT(m.seq)"
            ).fetchall()
        assert [count for _, count in rows] == [1, 4]


def test_the_page_is_usable_390_px_wide(browser):
    with signed_in(browser, "page-phone", viewport={"width": 390, "height": 844},
                   is_mobile=True, has_touch=True) as page:
        page.fill("#query", "a long answer " + "word " * 80 + "x" * 300)
        page.click("#send")
        expect(page.locator(".msg.assistant").last).to_contain_text("echo: a long answer")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        for selector in ("#key", "#save-key", "#query", "#send", "#new-chat", "#forget",
                         ".msg.assistant"):
            box = page.locator(selector).last.bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, (selector, box)


def test_docs_and_favicon_work_without_internet(browser):
    chromium, server = browser[0], browser[1]
    context = chromium.new_context()
    outside: list[str] = []

    def only_the_server(route):
        if route.request.url.startswith(server.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_server)
    page = context.new_page()
    page.set_default_timeout(20_000)
    try:
        page.goto(server.url + "/docs")
        expect(page.locator(".opblock").first).to_be_visible()
        expect(page.locator("#swagger-ui")).to_contain_text("/api/runs")
        assert outside == []
        icon = page.request.get(server.url + "/favicon.ico")
        assert icon.status == 200 and icon.headers["content-type"] == "image/x-icon"
        assert icon.body()[:4] == b"\x00\x00\x01\x00"
        assert page.request.get(server.url + "/docs/swagger-ui/..%2Fapp.js").status == 404
    finally:
        context.close()


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
