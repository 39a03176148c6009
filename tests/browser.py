"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for the console's browser tests.

    with Browser.launch(tmp_path) as browser:
        page = browser.new_page()
        page.goto("http://127.0.0.1:8080/ui/")
        title = page.evaluate("document.title")
        page.screenshot(tmp_path / "page.png")
        assert page.errors == []      # console errors, uncaught exceptions, failed loads, CSP violations

One WebSocket to the browser in flat mode: every page is a target session on it. Calls are synchronous; the
events that arrive meanwhile are kept, so a test can wait for one (a load) or read them later (errors).
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root; the browser only visits the test's own localhost pages
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",  # else it tries Google's hosts, which this machine refuses
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--window-size=1360,900",
)
MAX_SCREENSHOT_HEIGHT = 8000


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, process: subprocess.Popen[bytes], socket: ClientConnection) -> None:
        self._process = process
        self._socket = socket
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    @classmethod
    @contextmanager
    def launch(cls, workdir: Path, timeout_s: float = 30) -> Iterator[Browser]:
        executable = chromium_path()
        if executable is None:
            raise RuntimeError("chromium is not installed (scripts/ensure-services.sh installs Debian's package)")
        profile = workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        log = (workdir / "chromium.log").open("wb")
        argv = [executable, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"]
        process = subprocess.Popen(argv, stdout=log, stderr=log)
        try:
            endpoint = _devtools_endpoint(profile / "DevToolsActivePort", process, timeout_s)
            with connect(endpoint, max_size=None, open_timeout=timeout_s) as socket:
                yield cls(process, socket)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float = 30) -> dict[str, Any]:  # fmt: skip
        """Send one command and return its result, keeping the events that arrive before it."""
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._socket.send(json.dumps(message))
        deadline = time.monotonic() + timeout_s
        while True:
            received = self._receive(deadline, method)
            if received.get("id") == message_id:
                if "error" in received:
                    raise RuntimeError(f"{method}: {received['error']}")
                return received.get("result", {})  # type: ignore[no-any-return]

    def wait_for(self, method: str, session: str, after: int, timeout_s: float = 30) -> dict[str, Any]:
        """The first event ``method`` of ``session`` at index ``after`` or later in ``events``."""
        deadline = time.monotonic() + timeout_s
        index = after
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            self._receive(deadline, method)

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no answer from chromium for {waiting_for}")
        received: dict[str, Any] = json.loads(self._socket.recv(timeout=remaining))
        if "id" not in received:
            self.events.append(received)
        return received

    def new_page(self) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        return page


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        self._errors_from = 0  # index into browser.events: errors before it were looked at (forget_errors)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def goto(self, url: str) -> None:
        """Open ``url`` and wait until it (after any redirects) has loaded."""
        mark = len(self.browser.events)
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise RuntimeError(f"navigating to {url}: {result['errorText']}")
        self.browser.wait_for("Page.loadEventFired", self.session, mark)

    def click_and_wait(self, selector: str) -> None:
        """Click ``selector`` (a link or a submit button) and wait for the page it leads to."""
        mark = len(self.browser.events)
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
        self.browser.wait_for("Page.loadEventFired", self.session, mark)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The whole page (up to ``MAX_SCREENSHOT_HEIGHT`` pixels) as a PNG at ``path``."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], MAX_SCREENSHOT_HEIGHT),
                "scale": 1}  # fmt: skip
        shot = self.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    @property
    def errors(self) -> list[str]:
        """Everything the page reported as an error: console.error, uncaught exceptions, and the browser's own
        error log (failed loads, Content-Security-Policy violations)."""
        found = []
        for event in self.browser.events[self._errors_from :]:
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
            elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in {"error", "assert"}:
                words = (str(arg.get("value", arg.get("description"))) for arg in params["args"])
                found.append("console.error: " + " ".join(words))
            elif event["method"] == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                found.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
        return found

    def forget_errors(self) -> None:
        """Start ``errors`` afresh (after a test looked at errors it caused on purpose)."""
        self._errors_from = len(self.browser.events)


def _devtools_endpoint(port_file: Path, process: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The browser's WebSocket URL, from the file Chromium writes once it listens (port, then path)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with {process.returncode} before listening")
        lines = port_file.read_text().split("\n") if port_file.exists() else []
        if len(lines) >= 2 and lines[0].strip() and lines[1].strip():
            return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        time.sleep(0.05)
    raise TimeoutError("chromium did not open its DevTools port")
