"""The console under test: ``meteor console`` in a process of its own against the grid under test, and a real
headless browser (Debian's chromium through its chromedriver, as .ci/dev installs them) to drive its pages.

Selenium, not Playwright: chromedriver comes from the same Debian source package as chromium, so driver and browser
always match, and nothing downloads a browser; Playwright pins the Chromium build it speaks to and would drive
Debian's through executable_path on a best-effort basis only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module, its console log kept (``driver.get_log("browser")``)."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        message = f"{CHROMIUM} and {CHROMEDRIVER} are missing: `bash .ci/dev test` installs them (apt chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1100,900",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $METEOR_TEST_ARTEFACTS/console, or a temporary directory (printed)."""
    root = os.environ.get("METEOR_TEST_ARTEFACTS")
    folder = Path(root) / "console" if root else tmp_path_factory.mktemp("console-shots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots in {folder}")
    return folder
