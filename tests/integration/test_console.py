"""The web console (broker/api/console/) in a real browser: Debian's headless chromium driven by selenium
through chromium-driver, against two broker nodes on a real Redis with real MQTT clients.

FLEETMQ_SCREENSHOTS=DIR also writes the screenshots the docs show into DIR (docs/images)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.integration.fleet_support import apikey, raw_connect
from tests.integration.harness import uid
from tests.integration.mqttraw import DISCONNECT

pytestmark = pytest.mark.redis

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        pytest.fail("chromium or chromium-driver missing: run `make deps` (scripts/system-deps.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900", f"--user-data-dir={tmp_path / 'chromium'}"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(
        options=options, service=Service(DRIVER, log_output=str(tmp_path / "driver.log"))
    )
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def shot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000
    target = os.environ.get("FLEETMQ_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)
    return path


def test_sign_in_find_a_client_open_its_page_kick_it_and_see_it_offline(fleet, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    keys = tmp_path / "keys.yaml"
    admin = apikey(keys, "ops", "admin")
    a, b = fleet(2, None, {"api": {"bind": "127.0.0.1:0", "keys_file": str(keys)}})
    tag = uid("web")
    device, _ = raw_connect(b, f"{tag}-device", 5)  # on node b; the console is node a's
    device.subscribe([(f"{tag}/cmd", 1)])
    others = [raw_connect(b, f"{tag}-other-{i}", 5)[0] for i in range(3)]
    wait = WebDriverWait(browser, 15)
    base = f"http://{a.host}:{a.ports['api']}/"

    browser.get(base)
    key_input = wait.until(ec.presence_of_element_located((By.ID, "key")))
    key_input.send_keys("fmq_wrong_key")
    browser.find_element(By.ID, "signin").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "sign-in refused"))
    key_input = browser.find_element(By.ID, "key")
    key_input.clear()
    key_input.send_keys(admin)
    browser.find_element(By.ID, "signin").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "total-nodes"), "2"))
    wait.until(lambda d: int(d.find_element(By.ID, "total-connections").text) >= 4)
    shot(browser, tmp_path, "console-overview")

    browser.get(base + "#/clients")
    search = wait.until(ec.presence_of_element_located((By.ID, "search")))
    search.send_keys(f"{tag}-dev")
    browser.find_element(By.ID, "find").click()
    row = (By.CSS_SELECTOR, f'tr[data-clientid="{tag}-device"]')
    wait.until(ec.presence_of_element_located(row))
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr[data-clientid]")) == 1  # the others filtered out
    browser.find_element(*row).find_element(By.TAG_NAME, "a").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "state"), "connected"))
    assert f"{tag}/cmd" in browser.find_element(By.TAG_NAME, "main").text  # its subscription
    assert "node-1" in browser.find_element(By.TAG_NAME, "main").text  # the node it is on
    shot(browser, tmp_path, "console-client")

    browser.find_element(By.ID, "kick").click()
    assert device.expect(DISCONNECT, timeout=10).reason == 0x98
    wait.until(ec.text_to_be_present_in_element((By.ID, "state"), "offline"))
    assert browser.find_element(By.ID, "error").get_attribute("hidden") is not None  # no error said
    for c in others:
        c.close()
