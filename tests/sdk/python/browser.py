"""A headless Chromium driven by Selenium, and a recall with its console on,
for the console's browser tests (test_console_browser.py).

The browser is Debian's `chromium` with its `chromium-driver`
(`/usr/bin/chromium`, `/usr/bin/chromedriver`; .ci/run installs them).
Both paths are given to Selenium, so Selenium Manager is never asked to
find or download anything. RECALL_CHROMIUM and RECALL_CHROMEDRIVER
override them.

Without a browser, a driver or Selenium, the browser tests are skipped
with the reason, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from launch import REPO, Stack

# Selenium Manager reads SE_* settings from the environment: it must never
# go online (it is not even started, as both paths are given).
os.environ.setdefault("SE_OFFLINE", "true")

WINDOW = (1280, 900)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def unavailable(reason: str):
    """Skips the test on a developer's machine; fails it in CI."""
    if in_ci():
        pytest.fail(f"CI=true and the browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(f"browser tests: {reason}")


def _find(env: str, names: tuple[str, ...], fallbacks: tuple[str, ...]) -> str | None:
    if os.environ.get(env):
        path = os.environ[env]
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    for path in fallbacks:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def chromium_path() -> str | None:
    return _find("RECALL_CHROMIUM", ("chromium", "chromium-browser"),
                 ("/usr/bin/chromium", "/usr/lib/chromium/chromium"))


def chromedriver_path() -> str | None:
    return _find("RECALL_CHROMEDRIVER", ("chromedriver",),
                 ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"))


def tools() -> tuple[str, str]:
    """(Chromium, chromedriver), or the test is skipped (failed in CI)."""
    try:
        import selenium  # noqa: F401
    except ImportError as e:
        unavailable(f"selenium is not installed ({e}): pip install -r tests/sdk/python/requirements.txt")
    browser = chromium_path()
    if browser is None:
        unavailable("no Chromium (apt-get install chromium, or set RECALL_CHROMIUM)")
    driver_path = chromedriver_path()
    if driver_path is None:
        unavailable("no chromedriver (apt-get install chromium-driver, or set RECALL_CHROMEDRIVER)")
    return browser, driver_path


def new_driver():
    """A headless Chromium with a 1280x900 page, or the test is skipped
    (failed in CI)."""
    browser, driver_path = tools()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(arg)
    # Chromium's own log goes to the driver's log file, read when it fails.
    fd, name = tempfile.mkstemp(prefix="recall-chromedriver-", suffix=".log")
    os.close(fd)
    log = Path(name)
    service = Service(executable_path=driver_path, log_output=str(log))
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except Exception as e:  # the browser does not start: not a console failure
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        log.unlink(missing_ok=True)
        if in_ci():
            pytest.fail(f"Chromium ({browser}) with {driver_path} did not start: {e}\n{tail}", pytrace=False)
        pytest.skip(f"browser tests: Chromium ({browser}) did not start: {e}")
    driver.recall_driver_log = log  # removed by quit_driver()
    driver.set_window_size(*WINDOW)
    # The page itself is 1280x900 (the window's frame would take some of
    # it), so the screenshots have the same size everywhere.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
    driver.set_page_load_timeout(30)
    return driver


def quit_driver(driver):
    driver.quit()
    driver.recall_driver_log.unlink(missing_ok=True)


class ConsoleRecall(Stack):
    """recall alone on the shipped config/demo.toml (its built-in mock
    upstream, mock://echo, and the console on); `extra` is appended to the
    config, `env` added to recall's environment."""

    def __init__(self, extra: str = "", env: dict | None = None):
        super().__init__("scripted", env=env)
        self.upstream = "mock"
        self.extra = extra

    def start(self) -> "ConsoleRecall":
        try:
            self._start_recall()
        except BaseException:
            self.stop()
            raise
        return self

    def config(self, port: int) -> str:
        """The shipped config/demo.toml, as the README's Console section
        runs it, on a free port, with the overview sampled every second so
        that its charts fill within the test run."""
        demo = (REPO / "config" / "demo.toml").read_text()
        demo, n = re.subn(r'(?m)^listen = .*$', f'listen = "127.0.0.1:{port}"', demo)
        assert n == 1, "config/demo.toml has one listen line"
        demo, n = re.subn(r"(?m)^\[console\]\nenabled = true.*$",
                          "[console]\nenabled = true\nsample_secs = 1", demo)
        assert n == 1, "config/demo.toml turns the console on"
        return f"# config/demo.toml, as written by tests/sdk/python/browser.py\n{demo}\n{self.extra}\n"


def screenshot_dir(tmp_factory) -> Path:
    """docs/console/ with RECALL_SCREENSHOTS set, else a temporary directory
    (CI must leave the repository as it found it)."""
    if os.environ.get("RECALL_SCREENSHOTS"):
        out = REPO / "docs" / "console"
        out.mkdir(parents=True, exist_ok=True)
        return out
    return tmp_factory.mktemp("console-screenshots")


def wait_for(pred, within: float, what: str, every: float = 0.1):
    """Polls `pred()` until it returns something truthy, which it returns."""
    deadline = time.monotonic() + within
    last_error = None
    while True:
        try:
            value = pred()
            if value:
                return value
        except Exception as e:  # a stale element during a reload, say
            last_error = e
        if time.monotonic() > deadline:
            extra = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {within}s waiting for {what}{extra}")
        time.sleep(every)
