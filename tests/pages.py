"""What a report page shows a person: its inline PNGs (decoded, with how much is drawn on them), and, loaded
in headless Chromium, each image's decoded size and every console error. Chromium is driven over the
DevTools protocol on a pipe (`--remote-debugging-pipe`: commands in on descriptor 3, replies out on 4, each
a JSON message ended by a NUL), so no websocket client is needed."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMAGE = re.compile(r'<img src="data:image/png;base64,([^"]+)" alt="([^"]*)" data-panels="([^"]*)">')
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
ERROR_EVENTS = ("Runtime.exceptionThrown", "Log.entryAdded", "Runtime.consoleAPICalled")


def inline_images(page: str) -> dict[str, tuple[bytes, str]]:
    """The page's plots by the start of their alt text (a stage's name): PNG bytes and panel titles."""
    return {alt.split(":")[0]: (base64.b64decode(data), panels) for data, alt, panels in IMAGE.findall(page)}


def ink(png: bytes) -> float:
    """Share of the image's pixels that are not white: 0 for a blank figure."""
    from matplotlib.image import imread

    assert png.startswith(PNG_SIGNATURE)
    pixels = imread(io.BytesIO(png), format="png")[..., :3]
    return float((pixels.min(axis=-1) < 0.95).mean())


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


@dataclass
class PageView:
    images: list[dict[str, Any]]  # alt, complete, width and height (natural: 0 when it failed to decode)
    errors: list[str]


class DevTools:
    """One Chromium process and its protocol pipe."""

    def __init__(self, binary: str, profile: str) -> None:
        self.commands_read, self.commands = os.pipe()
        self.replies, self.replies_write = os.pipe()
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe"]
        flags += [f"--user-data-dir={profile}", "--no-first-run", "about:blank"]
        # bash puts the two pipe ends on descriptors 3 and 4, where Chromium expects them
        wiring = f'exec "$0" "$@" 3<&{self.commands_read} 4>&{self.replies_write}'
        self.process = subprocess.Popen(
            ["bash", "-c", wiring, binary, *flags],
            pass_fds=(self.commands_read, self.replies_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(self.commands_read)
        os.close(self.replies_write)
        self.next_id, self.buffer, self.events = 0, b"", []

    def message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.replies], [], [], max(0.0, deadline - time.time()))
            chunk = os.read(self.replies, 65536) if ready else b""
            if not chunk:
                raise TimeoutError("Chromium sent nothing before the deadline (or exited)")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> Any:
        """Send a command and wait for its reply, keeping the events that arrive meanwhile."""
        self.next_id += 1
        command = {"id": self.next_id, "method": method, "params": params}
        if session:
            command["sessionId"] = session
        os.write(self.commands, json.dumps(command).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            found = self.message(deadline)
            if found.get("id") == self.next_id:
                if "error" in found:
                    raise RuntimeError(f"{method}: {found['error']}")
                return found["result"]
            self.events.append(found)

    def wait_for(self, event: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while not any(e.get("method") == event for e in self.events):
            self.events.append(self.message(deadline))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, TimeoutError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self.commands)
        os.close(self.replies)


def error_text(event: dict[str, Any]) -> str | None:
    """The console error an event carries, or None for one that is not an error."""
    params = event.get("params", {})
    if event["method"] == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return details.get("exception", {}).get("description") or details.get("text", "exception")
    if event["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
        return params["entry"]["text"]
    if event["method"] == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
        return " ".join(str(arg.get("value", arg.get("description"))) for arg in params["args"])
    return None


IMAGES = (
    "JSON.stringify([...document.images].map(i => "
    "({alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})))"
)


def view(page: Path, binary: str) -> PageView:
    """Open `page` in a fresh headless Chromium, wait for its load event, and read its images and errors."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        browser = DevTools(binary, profile)
        try:
            target = browser.call("Target.createTarget", url="about:blank")["targetId"]
            session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                browser.call(f"{domain}.enable", session)
            browser.call("Page.navigate", session, url=page.resolve().as_uri())
            browser.wait_for("Page.loadEventFired")
            found = browser.call("Runtime.evaluate", session, expression=IMAGES, returnByValue=True)
            images = json.loads(found["result"]["value"])
            errors = [
                text for e in browser.events if e.get("method") in ERROR_EVENTS if (text := error_text(e))
            ]
        finally:
            browser.close()
    return PageView(images, errors)
