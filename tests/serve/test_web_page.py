"""The web chat page that ``torchburn serve`` answers at ``/``, driven in headless Chromium against the running
server: it names the model, streams an answer with its stats, stops one midway, sends the system prompt and the
settings with the whole conversation, shows server errors, and shows model output as text, never as HTML.

``TORCHBURN_SCREENSHOT=1`` also saves ``docs/images/serve-chat.png`` (1100x800) after an answer."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "needs Chromium and its driver (Debian: apt-get install chromium chromium-driver)", allow_module_level=True
    )

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "serve-chat.png"
# a whole answer on the CPU, the first one included (it may wait for the model's warm-up)
ANSWER_TIMEOUT = 240.0
POLL = 0.05

# records every value <body data-state> takes from now on, so that a quick answer's "generating" is not missed
RECORD_STATES = """
window.__states = [document.body.dataset.state];
new MutationObserver(() => window.__states.push(document.body.dataset.state))
  .observe(document.body, {attributes: true, attributeFilter: ["data-state"]});
"""

# records the URL and body of every fetch the page makes, then makes it
RECORD_FETCHES = """
window.__requests = [];
const realFetch = window.fetch;
window.fetch = function (input, init) {
  const headers = Object.fromEntries(new Headers((init && init.headers) || {}));
  window.__requests.push({url: String(input), headers, body: init && init.body ? String(init.body) : null});
  return realFetch.apply(this, arguments);
};
"""


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def model_id(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as response:
        return str(json.load(response)["data"][0]["id"])


@pytest.fixture
def page(driver: WebDriver, server: Any) -> WebDriver:
    """The chat page freshly loaded, its model name shown, and the browser log read up to here."""
    driver.get(f"{server.url}/")
    expected = model_id(server.url)
    WebDriverWait(driver, 30, POLL).until(lambda d: d.find_element(By.ID, "model-name").text == expected)
    driver.get_log("browser")
    return driver


def state(driver: WebDriver) -> str:
    return str(driver.execute_script("return document.body.dataset.state"))


def wait_idle(driver: WebDriver, timeout: float = ANSWER_TIMEOUT) -> None:
    WebDriverWait(driver, timeout, POLL).until(lambda d: state(d) == "idle")


def assistant_messages(driver: WebDriver) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")


def ask(driver: WebDriver, question: str) -> WebElement:
    """Types the question (Shift+Enter between its lines), presses Enter and returns the new assistant message
    once it is there."""
    before = len(assistant_messages(driver))
    driver.execute_script(RECORD_STATES)
    prompt = driver.find_element(By.ID, "prompt")
    for i, line in enumerate(question.split("\n")):
        if i:
            ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
        prompt.send_keys(line)
    prompt.send_keys(Keys.ENTER)
    WebDriverWait(driver, 10, POLL).until(lambda d: len(assistant_messages(d)) == before + 1)
    return assistant_messages(driver)[-1]


def open_settings(driver: WebDriver) -> None:
    panel = driver.find_element(By.ID, "settings")
    if not panel.is_displayed():
        driver.find_element(By.ID, "settings-toggle").click()
    WebDriverWait(driver, 5, POLL).until(lambda d: panel.is_displayed())


def set_field(driver: WebDriver, element_id: str, value: str) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(value)


def chat_requests(driver: WebDriver) -> list[dict[str, Any]]:
    """The bodies of the chat requests recorded by RECORD_FETCHES, with their headers under "headers"."""
    recorded = driver.execute_script("return window.__requests")
    return [
        {**json.loads(r["body"]), "headers": r["headers"]}
        for r in recorded
        if r["url"].endswith("/v1/chat/completions")
    ]


def content(message: WebElement) -> str:
    return str(message.find_element(By.CLASS_NAME, "content").get_attribute("textContent"))


def test_page_loads_names_the_model_with_nothing_from_elsewhere(driver: WebDriver, server: Any) -> None:
    driver.get_log("browser")  # only this page's messages count
    driver.get(f"{server.url}/")
    expected = model_id(server.url)
    WebDriverWait(driver, 30, POLL).until(lambda d: d.find_element(By.ID, "model-name").text == expected)
    assert state(driver) == "idle"
    for element_id in ("prompt", "send", "messages", "new-chat", "settings", "model-name"):
        assert driver.find_element(By.ID, element_id)
    assert not driver.find_element(By.ID, "stop").is_displayed()
    assert not driver.find_element(By.ID, "error").is_displayed()

    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    loaded = driver.execute_script(
        "return performance.getEntries().filter(e => e.entryType === 'navigation' || e.entryType === 'resource')"
        ".map(e => e.name)"
    )
    origin = urlsplit(server.url)
    elsewhere = [
        url
        for url in loaded
        if urlsplit(url).scheme not in ("data", "blob") and urlsplit(url)[:2] != (origin.scheme, origin.netloc)
    ]
    assert elsewhere == []
    assert any(url.endswith("/static/chat.js") for url in loaded)
    assert any(url.endswith("/static/chat.css") for url in loaded)


def test_a_question_streams_an_answer_with_stats(page: WebDriver) -> None:
    screenshot = os.environ.get("TORCHBURN_SCREENSHOT") == "1"
    if screenshot:  # greedy, for the same picture each time; the panel opened and closed without the mouse
        toggle = "document.getElementById('settings-toggle').click()"
        page.execute_script(toggle)
        set_field(page, "temperature", "0")
        page.execute_script(toggle)
    question = "What is the capital of France?"
    answer = ask(page, question)
    wait_idle(page)

    assert "generating" in page.execute_script("return window.__states")
    user = page.find_elements(By.CSS_SELECTOR, "#messages .message.user")[-1]
    assert content(user) == question
    assert content(answer).strip()
    stats = answer.find_element(By.CLASS_NAME, "stats").text
    assert "tok/s" in stats and "token" in stats
    assert not page.find_element(By.ID, "error").is_displayed()
    assert not answer.find_elements(By.CLASS_NAME, "stopped")

    if screenshot:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        # the page itself 1100x800: the window's size less the browser's own frame
        frame = page.execute_script("return [outerWidth - innerWidth, outerHeight - innerHeight]")
        page.set_window_size(1100 + frame[0], 800 + frame[1])
        WebDriverWait(page, 5, POLL).until(
            lambda d: d.execute_script("return [innerWidth, innerHeight]") == [1100, 800]
        )
        assert page.save_screenshot(str(SCREENSHOT))


def test_stop_keeps_the_partial_answer_and_the_server_answers_again(page: WebDriver) -> None:
    open_settings(page)
    set_field(page, "max-tokens", "400")
    answer = ask(page, "Write a long story about a dragon who learns to bake bread. Make it very detailed.")
    WebDriverWait(page, ANSWER_TIMEOUT, POLL).until(lambda d: len(content(answer)) > 0)
    assert state(page) == "generating"
    page.find_element(By.ID, "stop").click()
    wait_idle(page, timeout=5)

    partial = content(answer)
    assert partial
    with pytest.raises(TimeoutException):  # nothing more arrives
        WebDriverWait(page, 1.5, POLL).until(lambda d: content(answer) != partial)
    assert "stopped" in answer.text
    assert not page.find_element(By.ID, "stop").is_displayed()
    assert not page.find_element(By.ID, "error").is_displayed()

    set_field(page, "max-tokens", "32")
    second = ask(page, "Say hello.")
    wait_idle(page)
    assert content(second).strip()
    assert "tok/s" in second.find_element(By.CLASS_NAME, "stats").text
    assert not second.find_elements(By.CLASS_NAME, "stopped")
    assert not page.find_element(By.ID, "error").is_displayed()


def test_the_system_prompt_settings_and_conversation_are_sent(page: WebDriver, server: Any) -> None:
    page.execute_script(RECORD_FETCHES)
    open_settings(page)
    system = "You are a terse assistant. Answer in a few words."
    set_field(page, "system-prompt", system)
    set_field(page, "temperature", "0.3")
    set_field(page, "top-p", "0.8")
    set_field(page, "max-tokens", "24")
    set_field(page, "seed", "1234")
    # a server without a key takes any; one with a key would have asked for it before showing the page
    set_field(page, "api-key", "sk-page-test" + Keys.TAB)
    stored = "return localStorage.getItem('torchburn.apiKey')"
    WebDriverWait(page, 5, POLL).until(lambda d: d.execute_script(stored) == "sk-page-test")

    first = ask(page, "Name a color.")
    wait_idle(page)
    reply = content(first)
    second = ask(page, "And another one?")
    wait_idle(page)
    assert content(second).strip()

    one, two = chat_requests(page)
    assert one["model"] == model_id(server.url)
    assert one["stream"] is True
    assert one["stream_options"] == {"include_usage": True}
    assert one["headers"]["authorization"] == two["headers"]["authorization"] == "Bearer sk-page-test"
    assert one["headers"]["content-type"] == "application/json"
    assert (one["temperature"], one["top_p"], one["max_tokens"], one["seed"]) == (0.3, 0.8, 24, 1234)
    assert one["messages"] == [{"role": "system", "content": system}, {"role": "user", "content": "Name a color."}]
    assert two["messages"] == [
        {"role": "system", "content": system},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And another one?"},
    ]

    # a new chat starts from the system prompt alone; an empty system prompt is not sent
    page.find_element(By.ID, "new-chat").click()
    assert page.find_elements(By.CSS_SELECTOR, "#messages .message") == []
    set_field(page, "system-prompt", "")
    set_field(page, "api-key", Keys.TAB)
    WebDriverWait(page, 5, POLL).until(lambda d: d.execute_script(stored) is None)
    ask(page, "Hi!")
    wait_idle(page)
    last = chat_requests(page)[-1]
    assert last["messages"] == [{"role": "user", "content": "Hi!"}]
    assert "authorization" not in last["headers"]


# A stand-in fetch for /v1/chat/completions: an error answer, or an event stream cut at awkward places
STUB_FETCH = """
const [kind, pieces] = arguments;
const realFetch = window.fetch;
window.fetch = async function (input, init) {
  if (!String(input).endsWith("/v1/chat/completions")) return realFetch.apply(this, arguments);
  if (kind === "error") {
    const body = {error: {message: "max_tokens is <b>too</b> large", type: "invalid_request_error", code: null}};
    return new Response(JSON.stringify(body), {status: 400, headers: {"Content-Type": "application/json"}});
  }
  const bytes = new TextEncoder().encode(pieces.join(""));
  const stream = new ReadableStream({
    start(controller) {
      for (let i = 0; i < bytes.length; i += 7) controller.enqueue(bytes.slice(i, i + 7));
      controller.close();
    },
  });
  return new Response(stream, {status: 200, headers: {"Content-Type": "text/event-stream"}});
};
"""


def test_a_server_error_is_shown(page: WebDriver) -> None:
    page.execute_script(STUB_FETCH, "error", [])
    question = "Hello?\n  second line"
    ask(page, question)
    wait_idle(page, timeout=10)
    notice = page.find_element(By.ID, "error")
    assert notice.is_displayed()
    assert "max_tokens is <b>too</b> large" in notice.text
    assert content(page.find_elements(By.CSS_SELECTOR, "#messages .message.user")[-1]) == question
    # the turn that failed is not kept: the next question goes out alone
    page.execute_script(RECORD_FETCHES)
    ask(page, "Hello again?")
    wait_idle(page, timeout=10)
    assert [m["content"] for m in chat_requests(page)[-1]["messages"]] == ["Hello again?"]


def test_model_output_is_text_not_html(page: WebDriver) -> None:
    def chunk(delta: dict[str, str]) -> str:
        body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return f"data: {json.dumps(body)}\r\n\r\n"

    hostile = '<img src="x" onerror="window.__owned = 1">'
    usage = {"object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 4}}
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Here:\n  "}),
        chunk({"content": hostile}),
        chunk({"content": " <script>window.__owned = 2</script>"}),
        chunk({"content": " é ✓"}),
        f"data: {json.dumps(usage)}\n\n",
        "data: [DONE]\n\n",
    ]
    page.execute_script(STUB_FETCH, "stream", events)
    answer = ask(page, "Show me some HTML.")
    wait_idle(page, timeout=10)
    assert content(answer) == f"Here:\n  {hostile} <script>window.__owned = 2</script> é ✓"
    assert answer.find_elements(By.CSS_SELECTOR, "img, script") == []
    assert page.execute_script("return window.__owned") is None
    assert "4 tokens" in answer.find_element(By.CLASS_NAME, "stats").text
    assert not page.find_element(By.ID, "error").is_displayed()


def test_thinking_shows_apart_and_stays_out_of_the_history(page: WebDriver) -> None:
    def chunk(delta: dict[str, str]) -> str:
        body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return f"data: {json.dumps(body)}\n\n"

    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "The user asks <b>which</b> city."}),
        chunk({"reasoning_content": " France's capital is Paris."}),
        chunk({"content": "Paris."}),
        "data: [DONE]\n\n",
    ]
    page.execute_script(STUB_FETCH, "stream", events)
    answer = ask(page, "Capital of France?")
    wait_idle(page, timeout=10)
    thinking = answer.find_element(By.CSS_SELECTOR, "details.thinking")
    assert thinking.get_attribute("open") is None  # folded once the answer started
    text = answer.find_element(By.CLASS_NAME, "thinking-text").get_attribute("textContent")
    assert text == "The user asks <b>which</b> city. France's capital is Paris."
    assert answer.find_elements(By.CSS_SELECTOR, ".thinking-text b") == []
    assert content(answer) == "Paris."
    page.execute_script(RECORD_FETCHES)
    ask(page, "And of Spain?")
    wait_idle(page)
    sent = chat_requests(page)[-1]["messages"]
    assert [m["content"] for m in sent] == ["Capital of France?", "Paris.", "And of Spain?"]
