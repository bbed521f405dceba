"""Drive blazr's chat page in a real headless Chromium (Debian's `chromium` + `chromedriver`, selenium).

`chrome(width, height, mobile)` starts a fresh browser (a new profile each time: empty localStorage);
`ChatPage` wraps the page's stable ids (#prompt, #send, #stop, #model, …) with explicit waits
(WebDriverWait, generous timeouts: the model runs on a shared CPU) — never fixed sleeps. A missing
browser fails the test with the set-up command to run (the Makefile's test set-up installs both).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ANSWER_TIMEOUT = 240.0  # seconds: a few hundred tokens of SmolLM2 on two busy cores
FINISHED = ("done", "stopped", "error")

# Records every change of the last answer (its state and text length) from inside the page, so a test
# can tell that the text grew while streaming without polling from outside at a lucky moment.
STREAM_RECORDER = """
window.__samples = [];
const record = () => {
  const answers = document.querySelectorAll('#messages article.assistant');
  const a = answers[answers.length - 1];
  if (a) window.__samples.push([a.dataset.state, a.querySelector('.content').textContent.length]);
};
new MutationObserver(record).observe(document.querySelector('#messages'),
  {subtree: true, childList: true, characterData: true, attributes: true});
"""

# Wraps window.fetch to keep every chat-completions request body the page sends.
FETCH_SPY = """
window.__chatBodies = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (String(url).includes('/v1/chat/completions')) window.__chatBodies.push(JSON.parse(init.body));
  return realFetch(url, init);
};
"""


def chrome(width: int = 1280, height: int = 900, mobile: bool = False) -> webdriver.Chrome:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: run `make test` (its set-up installs them) or "
            "`apt-get install chromium chromium-driver`",
            pytrace=False,
        )
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    if mobile:  # the layout viewport of a phone, whatever the window's minimum size is
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 2, "mobile": True},
        )
    return driver


class ChatPage:
    """The chat page at `url` in `driver`; `key` (if any) is put in localStorage before the app starts."""

    def __init__(self, driver: webdriver.Chrome, url: str, key: str | None = None) -> None:
        self.driver = driver
        self.url = url
        driver.get(url + "/")
        if key:
            self.store("blazr.chat.apiKey", key)
            driver.refresh()

    # ------------------------------------------------------------------------------------------ waits

    def wait(self, condition: Callable[[Any], Any], timeout: float = 60.0, message: str = "") -> Any:
        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(condition, message)

    def wait_ready(self) -> None:
        """Until the models are listed (the app sets data-ready on #app)."""
        self.wait(lambda d: d.find_element(By.ID, "app").get_attribute("data-ready") == "true", 120,
                  "the page never listed the models")  # fmt: skip

    def wait_answer(self, timeout: float = ANSWER_TIMEOUT) -> WebElement:
        """Until the last answer has finished (done, stopped or error); returns it."""
        self.wait(lambda d: self.answers() and self.answers()[-1].get_attribute("data-state") in FINISHED,
                  timeout, "the answer never finished")  # fmt: skip
        return self.answers()[-1]

    # ------------------------------------------------------------------------------------------ parts

    def el(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def answers(self) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, "#messages article.assistant")

    def answer_text(self) -> str:
        """The rendered text of the last answer ("" if none)."""
        answers = self.answers()
        return answers[-1].find_element(By.CSS_SELECTOR, ".content").text if answers else ""

    def messages(self) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, "#messages article.msg")

    def conversations(self) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, "#conversations li")

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    # ------------------------------------------------------------------------------------------ actions

    def set_field(self, element_id: str, value: str) -> None:
        field = self.el(f"#{element_id}")
        field.clear()
        field.send_keys(value)

    def pick_model(self, name: str) -> None:
        Select(self.el("#model")).select_by_value(name)

    def model_options(self) -> list[str]:
        return [o.get_attribute("value") for o in Select(self.el("#model")).options]

    def send(self, text: str) -> None:
        self.el("#prompt").send_keys(text)
        self.el("#send").click()

    def chat_bodies(self) -> list[dict[str, Any]]:
        """The request bodies FETCH_SPY saw (installed by the test)."""
        return self.js("return window.__chatBodies")

    def stats(self, answer: WebElement) -> dict[str, str]:
        stats = answer.find_element(By.CSS_SELECTOR, ".stats")
        keys = ("ttftMs", "tokPerS", "promptTokens", "cachedTokens", "numTokens")
        return {k: self.js("return arguments[0].dataset[arguments[1]]", stats, k) for k in keys}

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        assert self.driver.save_screenshot(str(path)), f"no screenshot written to {path}"
        return path

    def store(self, key: str, value: Any) -> None:
        self.js("localStorage.setItem(arguments[0], arguments[1])", key, json.dumps(value))
