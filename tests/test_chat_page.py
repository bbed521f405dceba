"""The chat page at `/` (server/chat_page.py, server/static/): first over plain HTTP — the page and its
assets are served with their content types and revalidation headers, the page is public while /v1/*
still needs the `--api-key`, and the static files ship in the wheel (package-data) — then in a real
headless Chromium against `blazr serve` (the bundled SmolLM2, served as `alpha` and `beta`, behind a
key): type, send, watch the stream grow, time to first token / tok/s / prompt and cached tokens,
regenerate, stop mid-stream (the server's request ends too), switch model (the next request names it),
edit and resend, conversations kept across reloads, the key prompt, a phone-sized screen without
sideways scrolling (and a code block's copy button), reasoning and tool calls shown, and the markdown
renderer (code blocks, no HTML from model text). Screenshots go to pytest's tmp dir;
BLAZR_CHAT_SCREENSHOT=PATH also writes the README's (docs/chat-page.png).
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from blazr.server.chat_page import STATIC_DIR
from tests.browser import FETCH_SPY, STREAM_RECORDER, ChatPage, chrome
from tests.server_util import REPO_ROOT, ServerProcess

KEY = "sk-chat-page"
ASSETS = {
    "app.js": "javascript",
    "api.js": "javascript",
    "store.js": "javascript",
    "markdown.js": "javascript",
    "app.css": "text/css",
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--served-model-name", "alpha", "beta", "--max-model-len", "2048", "--max-num-seqs", "4"]
    with ServerProcess(args, api_key=KEY) as s:
        yield s


@pytest.fixture
def driver() -> Iterator:
    d = chrome()
    yield d
    d.quit()


@pytest.fixture
def page(driver, server) -> ChatPage:
    p = ChatPage(driver, server.url, key=KEY)
    p.wait_ready()
    return p


# ---------------------------------------------------------------------------------------------- HTTP


def test_the_page_and_its_assets_are_served_with_types_and_revalidation(server):
    r = httpx.get(f"{server.url}/")  # no key
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-cache"
    assert '<script type="module" src="/static/app.js">' in r.text
    assert 'id="prompt"' in r.text and 'id="model"' in r.text and 'id="stop"' in r.text
    for name, kind in ASSETS.items():
        a = httpx.get(f"{server.url}/static/{name}")
        assert a.status_code == 200, name
        assert kind in a.headers["content-type"], (name, a.headers["content-type"])
        assert a.headers["cache-control"] == "no-cache"
        assert a.content == (STATIC_DIR / name).read_bytes()
        again = httpx.get(f"{server.url}/static/{name}", headers={"If-None-Match": a.headers["etag"]})
        assert again.status_code == 304, name
    assert httpx.get(f"{server.url}/static/nope.js").status_code == 404
    assert httpx.get(f"{server.url}/static/..%2Fchat_page.py").status_code == 404
    # every module the page imports is served
    for line in (STATIC_DIR / "app.js").read_text().splitlines():
        if line.startswith("import "):
            target = line.split('"./', 1)[1].split('"', 1)[0]
            assert httpx.get(f"{server.url}/static/{target}").status_code == 200, target


def test_the_page_is_public_but_the_api_needs_the_key(server):
    assert httpx.get(f"{server.url}/").status_code == 200
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/docs").status_code == 401
    models = server.get("/v1/models")
    assert [m["id"] for m in models.json()["data"]] == ["alpha", "beta"]
    assert server.get("/docs").status_code == 200
    assert "/" not in server.get("/openapi.json").json()["paths"]


def test_the_static_files_ship_as_package_data():
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = meta["tool"]["setuptools"]["package-data"]["blazr.server"]
    files = sorted(p.relative_to(STATIC_DIR.parent).as_posix() for p in STATIC_DIR.iterdir())
    assert {"static/index.html", "static/app.js", "static/app.css", "static/markdown.js"} <= set(files)
    for f in files:
        assert any(fnmatch.fnmatch(f, pat) for pat in patterns), f"{f} is not in blazr.server's package-data"


# ---------------------------------------------------------------------------------------------- browser


def _screenshot(page: ChatPage, tmp_path: Path, name: str) -> None:
    shot = page.screenshot(tmp_path / name)
    assert shot.stat().st_size > 10_000  # a rendered page, not an empty image
    if target := os.environ.get("BLAZR_CHAT_SCREENSHOT"):
        page.screenshot(Path(target))


def test_type_send_stream_stats_and_regenerate(page, server, tmp_path):
    page.set_field("max-tokens", "160")
    page.js(STREAM_RECORDER)
    page.el("#prompt").send_keys("Write a Python function that reverses a string.", Keys.ENTER)
    answer = page.wait_answer()
    assert answer.get_attribute("data-state") == "done"
    text = answer.find_element(By.CSS_SELECTOR, ".content").text
    assert len(text) > 20
    # the text grew over several renders while the answer was still streaming (not always by each: an
    # opening ``` or ** turns into markup and leaves the rendered text)
    samples = page.js("return window.__samples")
    streaming = [n for state, n in samples if state == "streaming" and n > 0]
    assert len(set(streaming)) >= 3, samples
    assert streaming[-1] > streaming[0], samples
    assert answer.find_element(By.CSS_SELECTOR, ".model-name").text == "alpha"
    stats = page.stats(answer)
    ttft, tok_s = float(stats["ttftMs"]), float(stats["tokPerS"])
    assert ttft > 0 and tok_s > 0
    assert int(stats["promptTokens"]) > 10 and int(stats["cachedTokens"]) >= 0
    assert 1 < int(stats["numTokens"]) <= 160
    assert "TTFT" in answer.find_element(By.CSS_SELECTOR, ".stats").text
    assert page.js("return window.blazrChat.lastStats.ttftMs") == pytest.approx(ttft, abs=0.1)
    print(f"\nchat page: browser-side TTFT {ttft:.0f} ms, {tok_s:.1f} tok/s, {stats['numTokens']} tokens")
    title = page.conversations()[0].find_element(By.CSS_SELECTOR, ".conv-open").text
    assert title.startswith("Write a Python function")

    # Regenerate: the same prompt again, so the prefix cache serves most of it; still one answer
    page.el("#regenerate").click()
    again = page.wait_answer()
    assert again.get_attribute("data-state") == "done"
    assert len(page.answers()) == 1 and len(page.messages()) == 2
    regen = page.stats(again)
    assert regen["promptTokens"] == stats["promptTokens"]
    assert int(regen["cachedTokens"]) > 0
    _screenshot(page, tmp_path, "chat-page.png")


def test_stop_mid_stream_ends_the_answer_and_the_server_request(page, server):
    page.set_field("max-tokens", "1500")
    page.send("Tell me a very long story about a dragon, a knight and a wizard, with many chapters.")
    page.wait(lambda d: len(page.answer_text()) > 10, 120, "no text streamed")
    assert page.answers()[-1].get_attribute("data-state") == "streaming"
    assert page.el("#stop").is_displayed() and not page.el("#send").is_displayed()
    page.el("#stop").click()
    answer = page.wait_answer(60)
    assert answer.get_attribute("data-state") == "stopped"
    assert answer.find_element(By.CSS_SELECTOR, ".note").text == "Stopped."
    assert page.el("#send").is_displayed() and not page.el("#stop").is_displayed()
    assert int(page.stats(answer)["numTokens"]) < 1500
    length = len(page.answer_text())
    # the server dropped the request when the browser closed the stream
    server.wait_metric("blazr:num_requests_running", lambda v: v == 0, timeout=60)
    assert len(page.answer_text()) == length


def test_switching_model_names_it_in_the_next_request(page, driver, server):
    assert page.model_options() == ["alpha", "beta"]
    page.js(FETCH_SPY)
    page.set_field("max-tokens", "24")
    page.send("Hi!")
    assert page.wait_answer().find_element(By.CSS_SELECTOR, ".model-name").text == "alpha"
    page.pick_model("beta")
    page.send("And who are you?")
    answer = page.wait_answer()
    assert answer.get_attribute("data-state") == "done"
    assert answer.find_element(By.CSS_SELECTOR, ".model-name").text == "beta"
    bodies = page.chat_bodies()
    assert [b["model"] for b in bodies] == ["alpha", "beta"]
    assert bodies[1]["max_tokens"] == 24 and bodies[1]["stream"] is True
    assert [m["content"] for m in bodies[1]["messages"] if m["role"] == "user"] == ["Hi!", "And who are you?"]
    driver.refresh()  # the choice is kept
    page.wait_ready()
    assert page.el("#model").get_attribute("value") == "beta"


def test_edit_resend_settings_and_conversations_kept(page, driver, server):
    page.set_field("max-tokens", "24")
    page.set_field("system-prompt", "You answer in one short sentence.")
    page.set_field("temperature", "0")
    page.send("Say hello.")
    page.wait_answer()
    page.send("Now say goodbye.")
    page.wait_answer()
    assert len(page.messages()) == 4
    page.js(FETCH_SPY)
    page.messages()[0].find_element(By.CSS_SELECTOR, ".edit").click()
    box = page.el(".edit-box")
    box.clear()
    box.send_keys("Say good morning.")
    page.el(".edit-save").click()
    answer = page.wait_answer()
    assert answer.get_attribute("data-state") == "done"
    assert [m.get_attribute("data-role") for m in page.messages()] == ["user", "assistant"]
    assert page.messages()[0].find_element(By.CSS_SELECTOR, ".content").text == "Say good morning."
    (body,) = page.chat_bodies()
    assert body["messages"] == [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Say good morning."},
    ]
    assert body["temperature"] == 0 and body["max_tokens"] == 24

    page.el("#new-chat").click()
    page.wait(lambda d: not page.messages())
    page.send("A second chat.")
    page.wait_answer()
    driver.refresh()
    page.wait_ready()
    titles = [c.find_element(By.CSS_SELECTOR, ".conv-open").text for c in page.conversations()]
    assert titles == ["A second chat.", "Say hello."]
    assert page.el("#system-prompt").get_attribute("value") == "You answer in one short sentence."
    page.conversations()[1].find_element(By.CSS_SELECTOR, ".conv-open").click()
    page.wait(lambda d: len(page.messages()) == 2)
    assert page.messages()[0].find_element(By.CSS_SELECTOR, ".content").text == "Say good morning."
    page.conversations()[0].find_element(By.CSS_SELECTOR, ".conv-delete").click()
    page.wait(lambda d: len(page.conversations()) == 1)


def test_the_page_asks_for_the_key(driver, server):
    page = ChatPage(driver, server.url)  # no key in localStorage
    page.wait(lambda d: page.el("#key-dialog").get_attribute("open") is not None, 60, "no key prompt")
    page.el("#api-key").send_keys("wrong-key", Keys.ENTER)
    page.wait(lambda d: page.el("#key-error").is_displayed(), 60, "a wrong key was not refused")
    assert "refused" in page.el("#key-error").text
    page.el("#api-key").clear()
    page.el("#api-key").send_keys(KEY)
    page.el("#key-save").click()
    page.wait_ready()
    assert page.el("#key-dialog").get_attribute("open") is None
    assert page.model_options() == ["alpha", "beta"]
    assert page.js("return JSON.parse(localStorage.getItem('blazr.chat.apiKey'))") == KEY


def test_a_phone_sized_screen_has_no_sideways_scrolling(server, tmp_path):
    driver = chrome(375, 812, mobile=True)
    try:
        page = ChatPage(driver, server.url, key=KEY)
        long_line = "x = " + "+".join(["value"] * 80)
        conversation = {
            "id": "c1", "title": "A long conversation title that does not fit", "updated": 1,
            "messages": [
                {"role": "user", "content": "averyveryverylongwordwithoutanyspaces" * 6},
                {"role": "assistant", "state": "done", "model": "alpha",
                 "content": f"Here:\n\n```python\n{long_line}\n```\n\nand https://example.com/{'a' * 200}"},
            ],
        }  # fmt: skip
        page.store("blazr.chat.conversations", [conversation])
        page.store("blazr.chat.current", "c1")
        driver.refresh()
        page.wait_ready()
        assert page.js("return window.innerWidth") == 375
        assert page.el("pre code").text == long_line

        def no_overflow() -> bool:
            return page.js("return document.documentElement.scrollWidth <= window.innerWidth"
                           " && document.body.scrollWidth <= window.innerWidth")  # fmt: skip

        assert no_overflow()
        for css in ("#prompt", "#send", "#toggle-sidebar", "#messages"):
            rect = page.js("return arguments[0].getBoundingClientRect().toJSON()", page.el(css))
            assert rect["left"] >= 0 and rect["right"] <= 375, (css, rect)
        assert not page.el("#model").is_displayed()  # the sidebar is folded away
        page.el("#toggle-sidebar").click()
        slid_in = "return document.querySelector('#sidebar').getBoundingClientRect().left === 0"
        page.wait(lambda d: page.el("#model").is_displayed() and page.js(slid_in))
        assert no_overflow()
        page.screenshot(tmp_path / "chat-page-phone.png")
        page.el("#close-sidebar").click()
        page.wait(lambda d: not page.el("#model").is_displayed())
        page.screenshot(tmp_path / "chat-page-phone-chat.png")
        # the code block's copy button puts the code on the clipboard
        driver.execute_cdp_cmd(
            "Browser.grantPermissions",
            {"origin": server.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
        )
        page.el(".copy-code").click()
        page.wait(lambda d: page.el(".copy-code").text == "Copied")
        copied = driver.execute_async_script("navigator.clipboard.readText().then(arguments[0])")
        assert copied == long_line
    finally:
        driver.quit()


# A canned stream in the server's chunk format, answered by a stubbed fetch, to show how the page renders
# reasoning (folded) and a tool call (name + arguments) — SmolLM2 produces neither without a parser.
CANNED_STREAM = r"""
const chunks = [
  {choices: [{index: 0, delta: {role: 'assistant', reasoning_content: 'The user wants '}}]},
  {choices: [{index: 0, delta: {reasoning_content: 'the weather.'}}]},
  {choices: [{index: 0, delta: {content: 'Let me check.'}}]},
  {choices: [{index: 0, delta: {tool_calls: [{index: 0, id: 'call_1', type: 'function',
    function: {name: 'get_weather', arguments: '{"city": '}}]}}]},
  {choices: [{index: 0, delta: {tool_calls: [{index: 0, function: {arguments: '"Oslo"}'}}]},
    finish_reason: 'tool_calls'}]},
  {choices: [], usage: {prompt_tokens: 12, completion_tokens: 9, total_tokens: 21,
    prompt_tokens_details: {cached_tokens: 8}}},
];
const text = chunks.map((c) => `data: ${JSON.stringify({model: 'alpha', ...c})}\n\n`).join('')
  + 'data: [DONE]\n\n';
const realFetch = window.fetch;
window.fetch = (url, init) => String(url).includes('/v1/chat/completions')
  ? Promise.resolve(new Response(text, {headers: {'content-type': 'text/event-stream'}}))
  : realFetch(url, init);
"""


def test_reasoning_is_folded_and_tool_calls_are_shown(page):
    page.js(CANNED_STREAM)
    page.send("Weather in Oslo?")
    answer = page.wait_answer(60)
    reasoning = answer.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert reasoning.is_displayed() and reasoning.get_attribute("open") is None
    assert page.js("return arguments[0].textContent", reasoning).endswith("The user wants the weather.")
    assert answer.find_element(By.CSS_SELECTOR, ".content").text == "Let me check."
    assert answer.find_element(By.CSS_SELECTOR, ".tool-name").text == "get_weather"
    assert answer.find_element(By.CSS_SELECTOR, ".tool-args").text == '{\n  "city": "Oslo"\n}'
    stats = page.stats(answer)
    assert (stats["promptTokens"], stats["cachedTokens"], stats["numTokens"]) == ("12", "8", "9")


def test_markdown_renders_code_blocks_and_never_model_html(page):
    render = "const d = document.createElement('div');"
    render += "d.innerHTML = window.blazrChat.renderMarkdown(arguments[0]);"
    source = "Before\n\n```python\nprint('<b>hi</b>')\nx = a * b\n```\nafter"
    code = page.js(
        render + "const c = d.querySelector('pre > code');"
        "return [d.querySelectorAll('pre > code').length, c.className, c.textContent,"
        " !!d.querySelector('.copy-code')]",
        source,
    )
    assert code == [1, "language-python", "print('<b>hi</b>')\nx = a * b", True]
    hostile = '<script>window.__xss = 1</script> <img src=x onerror="window.__xss = 1"> [a](javascript:x)'
    shown = page.js(render + "document.body.append(d);"
                    "return [d.querySelectorAll('script, img, b').length, d.querySelectorAll('a').length,"
                    " d.textContent]", hostile)  # fmt: skip
    assert shown[:2] == [0, 0]
    assert "<script>window.__xss = 1</script>" in shown[2] and 'onerror="window.__xss = 1"' in shown[2]
    source = "# Head\n\n**bold** *it* `co<de>`\n\n- one\n- two\n\n1. a\n2. b"
    marks = page.js(render + "return d.innerHTML", source)
    for tag in ("<h1>Head</h1>", "<strong>bold</strong>", "<em>it</em>", "<code>co&lt;de&gt;</code>",
                "<ul><li>one</li><li>two</li></ul>", "<ol><li>a</li><li>b</li></ol>"):  # fmt: skip
        assert tag in marks
    assert page.js("return window.__xss === undefined")


def test_a_refused_request_shows_the_servers_error(page):
    page.set_field("max-tokens", "100000")  # more than --max-model-len 2048
    page.send("Hello?")
    answer = page.wait_answer(60)
    assert answer.get_attribute("data-state") == "error"
    note = answer.find_element(By.CSS_SELECTOR, ".note").text
    assert note.startswith("Error: ") and "2048" in note, note
    assert page.el("#send").is_displayed()
    # the failed answer is not sent back as history: Regenerate retries the user's message
    page.set_field("max-tokens", "16")
    page.js(FETCH_SPY)
    page.el("#regenerate").click()
    assert page.wait_answer().get_attribute("data-state") == "done"
    assert [m["role"] for m in page.chat_bodies()[0]["messages"]] == ["user"]


def test_the_picker_shows_each_models_state_on_a_multi_model_server(driver, tmp_path):
    """Two models behind one server (two links to the bundled SmolLM2, one loaded at a time): the picker
    names each with its state, and opening it after a chat shows the model used as loaded."""
    from blazr.model_ref import default_model_path

    for name in ("smol-a", "smol-b"):
        (tmp_path / f"{name}.gguf").symlink_to(default_model_path())
    args = ["--models-dir", str(tmp_path), "--max-loaded-models", "1", "--max-model-len", "1024"]
    with ServerProcess(args) as server:
        page = ChatPage(driver, server.url)
        page.wait_ready()
        picker = Select(page.el("#model"))
        assert [o.text for o in picker.options] == ["smol-a (unloaded)", "smol-b (unloaded)"]
        page.js(FETCH_SPY)
        page.pick_model("smol-b")
        page.set_field("max-tokens", "4")
        page.send("Hi!")
        assert page.wait_answer().get_attribute("data-state") == "done"
        assert page.chat_bodies()[-1]["model"] == "smol-b"
        page.js("document.querySelector('#model').dispatchEvent(new Event('focus'))")  # labels read again
        labels = ["smol-a (unloaded)", "smol-b"]
        page.wait(lambda d: [o.text for o in picker.options] == labels, 30, "the labels never changed")
