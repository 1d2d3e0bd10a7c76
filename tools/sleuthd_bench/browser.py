"""Debian's Chromium, headless, driven from Python by Playwright: for the HTML report's tests and its paint
benchmark. Playwright's own browser download is never used (none can be fetched here): it drives the
system's ``chromium`` (Makefile: APT_TOOLS) through the DevTools protocol.

Every page is watched: requests (each must be a file of the report, or data:/blob:), failed requests,
console errors and uncaught exceptions, so a test can say "nothing went to the network and nothing broke".
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Headless, and quiet on the network: no sandbox (we run as root in a container), no GPU, no QUIC, and none
# of the background services (updates, sync, component downloads) a fresh profile would start.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
)


class BrowserUnavailable(RuntimeError):
    """Chromium or Playwright is missing; the message says how to install them."""


def chromium_path() -> str:
    """$SLEUTHD_CHROMIUM, else ``chromium`` on PATH."""
    path = os.environ.get("SLEUTHD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise BrowserUnavailable("no chromium found: `apt-get install chromium chromium-driver` (make setup does it)")
    return path


@dataclass
class PageLog:
    """What a page did on the network and in its console."""

    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "URL: error"
    # Requests the browser dropped itself (net::ERR_ABORTED): a player removed while it was still reading,
    # when the page moved on to another view. Not a failure of the page.
    aborted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions

    def outside(self, *roots: Path) -> list[str]:
        """Requests that are neither a file under one of ``roots`` nor data:/blob: (would touch the network)."""
        allowed = (*(root.resolve().as_uri() + "/" for root in roots), "data:", "blob:")
        return [u for u in self.requests if not u.startswith(allowed)]


def watch(page: Any) -> PageLog:
    log = PageLog()
    page.on("request", lambda r: log.requests.append(r.url))
    page.on("requestfailed", lambda r: _failed(log, r.url, str(r.failure)))
    page.on("console", lambda m: log.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: log.errors.append(str(e)))
    return log


def _failed(log: PageLog, url: str, failure: str) -> None:
    (log.aborted if "ERR_ABORTED" in failure else log.failed).append(f"{url}: {failure}")


@asynccontextmanager
async def chromium(width: int = 1280, height: int = 800, scale: float = 1.0) -> AsyncIterator[Any]:
    """A headless Chromium context with a fresh profile (removed afterwards) and a ``width`` x ``height``
    CSS-pixel viewport; yields Playwright's BrowserContext."""
    try:
        from playwright.async_api import async_playwright
    except ModuleNotFoundError as exc:
        raise BrowserUnavailable("playwright is not installed: pip install 'sleuthd[dev]' (make setup)") from exc
    executable = chromium_path()
    with tempfile.TemporaryDirectory(prefix="sleuthd-chromium-") as profile:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=executable,
                headless=True,
                args=list(CHROMIUM_ARGS),
                viewport={"width": width, "height": height},
                device_scale_factor=scale,
            )
            try:
                yield context
            finally:
                await context.close()
