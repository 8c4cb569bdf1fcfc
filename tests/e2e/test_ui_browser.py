"""The web page (/ui) in a real browser: headless Chromium (Debian's, installed by `make setup`)
driven by Playwright against a live `kiln serve` on the default model, with --data-dir and an
API key. The page asks for the key, a reply streams in token by token, a stop ends the request
on the server, a reload finds the conversation again, the logprob view colours tokens, edit and
regenerate rewrite the conversation, and a message's provenance downloads as JSON. Screenshots
land in build/test-artifacts/ui/ (ignored by git) for a person to look at.

Every wait is a hang bound (HANG_S), never a speed verdict."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from kiln.testing import ServerProcess, running_server
from tests import HANG_S

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts" / "ui"
KEY = "ui-test-key"
WAIT_MS = HANG_S * 1000


def chromium() -> str | None:
    """Debian's Chromium (`make setup` installs it), or KILN_CHROMIUM."""
    named = os.environ.get("KILN_CHROMIUM")
    return named or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if chromium() is None:
        pytest.skip("Chromium is not installed: `make setup` installs Debian's chromium with "
                    "apt-get, which could not run on this machine")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    data = tmp_path_factory.mktemp("data")
    args = ["--data-dir", str(data), "--api-key", KEY]
    with running_server(args, log_path=ARTIFACTS / "server.log") as s:
        yield s


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield b
        b.close()


def new_page(browser: Browser, url: str, *, key: str | None = KEY) -> Page:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    if key is not None:  # as if the key had been given before (the page keeps it)
        context.add_init_script(f"localStorage.setItem('kiln.apiKey', {json.dumps(key)})")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(url + "/ui")
    page.wait_for_selector("body[data-ready=true]")
    return page


def settings(page: Page, **values: Any) -> None:
    for name, value in values.items():
        page.fill(f"#{name}", str(value))


def send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.click("#send")


def wait_reply(page: Page) -> None:
    page.wait_for_selector("#stop", state="hidden")
    page.wait_for_selector("#send", state="visible")


def metrics(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=HANG_S).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def finished(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.startswith("kiln_requests_finished_total{"))


def test_the_page_asks_for_the_key_then_carries_it(browser: Browser, server: ServerProcess) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(server.url + "/ui")
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", KEY)
    page.click("#key-ok")
    page.wait_for_selector("body[data-ready=true]")
    note = page.inner_text("#storage-note")
    assert "SQLite" in note, note  # --data-dir: kept on the server, across restarts
    assert page.evaluate("localStorage.getItem('kiln.apiKey')") == KEY
    context.close()


def test_a_reply_streams_in_and_the_conversation_survives_a_reload(
        browser: Browser, server: ServerProcess) -> None:
    page = new_page(browser, server.url)
    # every text the streaming message showed, recorded by the page itself as it changed
    page.evaluate("""() => { window.seen = [];
        new MutationObserver(() => { const m = document.querySelector('article.streaming .content');
          if (m && m.textContent && window.seen.at(-1) !== m.textContent) window.seen.push(m.textContent); })
        .observe(document.getElementById('messages'), {childList: true, subtree: true}); }""")
    settings(page, max_tokens=48, temperature=0, seed=1)
    send(page, "Write three sentences about the sea.")
    # (not the streaming element itself: on a fast machine the reply may be done before a wait
    # for it starts; the record above is kept either way. Polled from here: the page's policy
    # refuses the string evaluation wait_for_function makes)
    deadline = time.monotonic() + HANG_S
    while not page.evaluate("window.seen.length"):
        assert time.monotonic() < deadline, "nothing streamed into the message"
        time.sleep(0.05)
    page.screenshot(path=str(ARTIFACTS / "streaming.png"))
    wait_reply(page)
    seen: list[str] = page.evaluate("window.seen")
    final = page.inner_text("article.msg.assistant .content")
    assert len(seen) >= 3 and len(set(seen)) == len(seen), seen  # it grew in steps
    stats = page.inner_text("article.msg.assistant .stats")
    assert "TTFT" in stats and "tokens" in stats and "tok/s" in stats, stats
    page.screenshot(path=str(ARTIFACTS / "reply.png"))
    conv_id = page.evaluate("location.hash.slice(1)")
    assert conv_id.startswith("conv_")

    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_selector(f"#conversations li[data-id='{conv_id}']")
    assert page.inner_text("article.msg.assistant .content") == final  # the open one, restored
    other = new_page(browser, server.url)  # another browser window: the list is the server's
    other.click(f"#conversations li[data-id='{conv_id}'] .open")
    other.wait_for_selector("article.msg.assistant")
    assert other.inner_text("article.msg.user .content") == "Write three sentences about the sea."
    page.screenshot(path=str(ARTIFACTS / "reloaded.png"))
    other.context.close()
    page.context.close()


def test_stop_ends_the_request_on_the_server(browser: Browser, server: ServerProcess) -> None:
    page = new_page(browser, server.url)
    before = metrics(server)
    settings(page, max_tokens=1500, temperature=0)
    send(page, "Count from 1 to 1000, one number per line.")
    page.wait_for_selector("article.streaming .content:not(:empty)")
    page.click("#stop")
    wait_reply(page)
    assert "stopped" in page.inner_text("article.msg.assistant .stats")
    page.screenshot(path=str(ARTIFACTS / "stopped.png"))
    deadline = time.monotonic() + HANG_S
    while metrics(server)['kiln_engine{name="running"}'] != 0:  # the server let it go
        assert time.monotonic() < deadline, "the stopped request still runs"
        time.sleep(0.1)
    after = metrics(server)
    # an aborted request is never counted as finished (stop, length); one that ran to its end is
    assert finished(after) == finished(before)
    generated = after['kiln_tokens_total{kind="generation"}'] - before.get(
        'kiln_tokens_total{kind="generation"}', 0.0)
    assert generated < 1500
    page.reload()  # the stopped message was kept, marked stopped
    page.wait_for_selector("article.msg.assistant .stats")
    assert "stopped" in page.inner_text("article.msg.assistant .stats")
    page.context.close()


def test_logprob_view_edit_regenerate_and_provenance(browser: Browser, server: ServerProcess,
                                                      tmp_path: Path) -> None:
    page = new_page(browser, server.url)
    page.check("#logprobs")
    settings(page, max_tokens=12, temperature=0)
    send(page, "Say hello.")
    wait_reply(page)
    tokens = page.locator("article.msg.assistant .tok")
    assert tokens.count() > 0
    first = tokens.first
    title = first.get_attribute("title") or ""
    assert "%" in title and len(title.splitlines()) >= 3, title  # its own and the alternatives
    colours = page.evaluate("""[...document.querySelectorAll('article.msg.assistant .tok')]
        .map((t) => [Number(t.dataset.p), getComputedStyle(t).backgroundColor])""")
    assert all(0 < p <= 1 and c.startswith("rgb(") for p, c in colours), colours  # painted
    likely, unlikely = max(colours)[1], min(colours)[1]
    assert likely != unlikely or max(colours)[0] == min(colours)[0]  # by probability
    page.screenshot(path=str(ARTIFACTS / "logprobs.png"))

    with page.expect_download() as download:
        page.click("article.msg.assistant .provenance")
    record = json.loads(Path(download.value.path()).read_text())
    assert record["object"] == "kiln.ui.message_provenance"
    assert record["request"]["messages"][-1] == {"role": "user", "content": "Say hello."}
    response = record["response"]
    assert response["token_ids"] and len(response["token_ids"]) == len(response["logprobs"])
    assert response["prompt_token_ids"] and response["usage"]["completion_tokens"] == len(
        response["token_ids"])

    page.click("article.msg.user .edit")  # edit the question: the answer after it is redone
    page.fill("article.msg.user .edit-area", "Say goodbye.")
    page.click("article.msg.user .save-edit")
    wait_reply(page)
    assert page.locator("article.msg").count() == 2
    assert page.inner_text("article.msg.user .content") == "Say goodbye."

    page.check("#exact")  # regenerate without streaming, with the server's rollout provenance
    page.click("article.msg.assistant .regenerate")
    wait_reply(page)
    assert page.locator("article.msg").count() == 2
    with page.expect_download() as download:
        page.click("article.msg.assistant .provenance")
    exact = json.loads(Path(download.value.path()).read_text())
    rollout = exact["rollout_provenance"]
    assert rollout is not None and rollout["prompt_token_count"] > 0, exact
    assert rollout["action_tokens"] and exact["request"]["rollout_provenance"] is True
    page.uncheck("#exact")
    page.context.close()


def test_the_markdown_renderer_escapes_html(browser: Browser, server: ServerProcess) -> None:
    page = new_page(browser, server.url)
    html = page.evaluate("""KilnMarkdown.render(
        '<img src=x onerror=alert(1)> **bold** `<b>`\\n```py\\nif a < b: pass\\n```\\n'
        + '[ok](https://example.org) [bad](javascript:alert(1))')""")
    assert "<img" not in html and "&lt;img" in html
    assert "<strong>bold</strong>" in html and "<code>&lt;b&gt;</code>" in html
    assert '<code class="lang-py">if a &lt; b: pass</code>' in html
    assert 'href="https://example.org"' in html and 'href="javascript' not in html
    page.context.close()


def test_tools_tool_results_and_structured_output(browser: Browser,
                                                  server: ServerProcess) -> None:
    page = new_page(browser, server.url)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    page.fill("#tools", json.dumps(tools))
    page.select_option("#tool_choice", "required")  # forced: the grammar makes it call
    settings(page, max_tokens=200, temperature=0)
    send(page, "What is the weather in Paris?")
    wait_reply(page)
    calls = page.inner_text("article.msg.assistant .code")
    assert "get_weather(" in calls, calls
    assert "finish: tool_calls" in page.inner_text("article.msg.assistant .stats")
    page.fill("#tools", "")
    page.select_option("#tool_choice", "")
    settings(page, max_tokens=8)
    calls_made = len(calls.strip().splitlines()) - 1  # the block's label, then one per call

    def answer(dialog: Any) -> None:  # one prompt per call
        dialog.accept('{"temp_c": 18}')

    page.on("dialog", answer)
    page.click("article.msg.assistant .tool-result")
    page.wait_for_selector("article.msg.tool")
    wait_reply(page)
    page.remove_listener("dialog", answer)
    roles = page.eval_on_selector_all("article.msg", "(ms) => ms.map((m) => m.className)")
    assert roles == ["msg user", "msg assistant", *["msg tool"] * calls_made,
                     "msg assistant"], (roles, calls)
    page.screenshot(path=str(ARTIFACTS / "tools.png"))

    page.click("#new-chat")
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    page.fill("#schema", json.dumps(schema))
    settings(page, max_tokens=40)
    send(page, "Pick a color.")
    wait_reply(page)
    picked = json.loads(page.inner_text("article.msg.assistant .content"))
    assert picked["color"] in ("red", "green", "blue")
    page.fill("#schema", "{not json")
    send(page, "Again.")
    assert "not JSON" in page.inner_text("#error")  # refused before anything is sent
    page.context.close()


def test_rename_export_and_delete_from_the_list(browser: Browser, server: ServerProcess) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    made = [httpx.post(server.url + "/v1/conversations", headers=auth, timeout=HANG_S,
                       json={"title": title, "messages": [{"role": "user", "content": title}]}
                       ).json()["id"] for title in ("first", "second")]
    page = new_page(browser, server.url)
    row = f"#conversations li[data-id='{made[0]}']"
    page.once("dialog", lambda dialog: dialog.accept("Renamed here"))
    page.click(f"{row} .rename")
    page.wait_for_selector(f"{row} .open:text('Renamed here')")
    with page.expect_download() as download:
        page.click(f"{row} .export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["object"] == "conversation.export" and exported["title"] == "Renamed here"
    assert exported["messages"] == [{"role": "user", "content": "first"}]
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#conversations li[data-id='{made[1]}'] .delete")
    page.wait_for_selector(f"#conversations li[data-id='{made[1]}']", state="detached")
    got = httpx.get(f"{server.url}/v1/conversations/{made[1]}", headers=auth, timeout=HANG_S)
    assert got.status_code == 404
    page.context.close()


def test_reasoning_apart_and_the_thinking_budget_in_the_request(browser: Browser,
                                                                server: ServerProcess) -> None:
    page = new_page(browser, server.url)  # the default model does not reason: the page's parts
    html = page.evaluate("""() => KilnRender.message({role: 'assistant', content: 'Four.',
        reasoning_content: '2 + 2 is 4 <b>', meta: {completion_tokens: 9, ttft_ms: 12,
        tokens_per_s: 50, finish_reason: 'stop'}}, 1, {}, {last: true}).outerHTML""")
    assert '<details class="reasoning">' in html and "2 + 2 is 4 &lt;b&gt;" in html
    assert html.index("reasoning") < html.index("Four.")  # apart, before the answer
    assert "TTFT 12 ms · 50.0 tok/s · 9 tokens" in html
    body = page.evaluate("""KilnChat.requestBody([{role: 'user', content: 'hi'}],
        {budget: '32', budgetUnit: 'tokens', max_tokens: '64', temperature: '0.5', top_p: '',
         top_k: '20', seed: '7', preset: 'greedy'})""")
    assert body["thinking_budget_tokens"] == 32 and "top_p" not in body
    assert (body["max_tokens"], body["temperature"], body["top_k"], body["seed"]) == (64, 0.5, 20, 7)
    assert body["sampling_preset"] == "greedy" and body["stream"] is True
    ms = page.evaluate("""KilnChat.requestBody([], {budget: '1500', budgetUnit: 'ms'})""")
    assert ms["thinking_budget_ms"] == 1500 and "thinking_budget_tokens" not in ms
    mix = page.evaluate("""KilnChat.requestBody([], {compose: 'style=0.5, math'})""")
    assert mix["adapters"] == [{"name": "style", "scale": 0.5}, {"name": "math", "scale": 1}]
    refused = page.evaluate("""(() => { try { KilnChat.requestBody([], {compose: 'a=x'}); }
        catch (e) { return e.message; } })()""")
    assert refused == "not an adapter and its scale: a=x"
    page.context.close()


def test_reasoning_streams_apart_under_a_thinking_budget(browser: Browser,
                                                         tmp_path: Path) -> None:
    """The default model behind a thinking template (its prompt opens the reasoning): what it
    thinks streams into the Thinking block, the budget set on the page closes it after that many
    tokens, and the answer follows apart."""
    template = Path(__file__).resolve().parents[1] / "fixtures" / "thinking_chat_template.jinja"
    with running_server(["--chat-template", str(template)],
                        log_path=ARTIFACTS / "thinking-server.log") as thinking:
        page = new_page(browser, thinking.url, key=None)
        # the reasoning text as the streaming message showed it (recorded by the page, so a
        # reply done before any wait here starts is seen too)
        page.evaluate("""() => { window.thought = [];
            new MutationObserver(() => {
              const m = document.querySelector('article.streaming .reasoning-text');
              if (m && m.textContent) window.thought.push(m.textContent); })
            .observe(document.getElementById('messages'), {childList: true, subtree: true}); }""")
        settings(page, budget=6, max_tokens=24, temperature=0)
        send(page, "Think about the number seven.")
        wait_reply(page)
        assert page.evaluate("window.thought.length") > 0  # it streamed into the block
        reasoning = page.text_content("article.msg.assistant .reasoning-text") or ""  # folded
        answer = page.inner_text("article.msg.assistant .content")
        assert reasoning.strip() and answer.strip(), (reasoning, answer)
        assert "<think>" not in answer and "</think>" not in answer
        page.screenshot(path=str(ARTIFACTS / "thinking.png"))
        with page.expect_download() as download:
            page.click("article.msg.assistant .provenance")
        record = json.loads(Path(download.value.path()).read_text())
        assert record["request"]["thinking_budget_tokens"] == 6
        outcome = record["response"]["kiln_metadata"]["thinking_budget"]
        assert outcome["triggered"] is True, outcome  # the budget closed the reasoning
        page.context.close()
