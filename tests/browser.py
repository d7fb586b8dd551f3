"""Fill in the guestbook's form in headless Chromium, as a visitor would,
and report what the browser then shows. Run by tests/test_browser.py with
a Python that has Selenium (`tools/python selenium`: Debian's
python3-selenium), since the pytest interpreter may not have it.

    browser.py URL < {"name": "...", "remark": "...", "force": false}

Types the name and the remark through the DevTools protocol's
Input.insertText (what an IME does: the text goes through the browser's
editing, so maxlength applies, and unlike WebDriver's send_keys it takes
characters outside the BMP such as emoji). With "force", the remark is set
by script instead, past maxlength, as only a script or curl could. Then it
clicks Sign, waits for the next page, and prints JSON: the remark's length
in UTF-16 units before sending ("typed"), and on the page that came back
the name and remark fields' values, the message (or null) and the guest
entries' text.

Chromium runs with no network at all beyond 127.0.0.1: the flags keep it
from calling Google (first run, sync, component updates, QUIC), and a fresh
profile directory is made for each run and removed after it.
"""

import json
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"  # Debian's packages: chromium, chromium-driver
CHROMEDRIVER = "/usr/bin/chromedriver"
PAGE_TIMEOUT = 30  # seconds for a page to load or come back (ASan, 2 cores)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")


def start(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + (f"--user-data-dir={profile}",):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER),
                              options=options)
    driver.set_page_load_timeout(PAGE_TIMEOUT)
    return driver


def type_into(driver, element, text):
    """Focus the field and insert text as typed input (maxlength holds)."""
    element.click()
    if text:
        driver.execute_cdp_cmd("Input.insertText", {"text": text})


def fill_and_sign(driver, url, name, remark, force):
    driver.get(url)
    remark_field = driver.find_element(By.ID, "guest-remarks")
    type_into(driver, driver.find_element(By.ID, "guest-name"), name)
    if force:
        driver.execute_script("arguments[0].value = arguments[1];",
                              remark_field, remark)
    else:
        type_into(driver, remark_field, remark)
    typed = driver.execute_script("return arguments[0].value.length;",
                                  remark_field)
    # A mark on this page's window: gone once the next page has loaded.
    # Mid-navigation the driver may fail a call outright: wait through it.
    driver.execute_script("window.signing = true;")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(driver, PAGE_TIMEOUT,
                  ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return !window.signing && document.readyState === 'complete';"))
    shown = driver.execute_script(
        "const m = document.querySelector('.form-message');"
        "return {name: document.getElementById('guest-name').value,"
        " remark: document.getElementById('guest-remarks').value,"
        " message: m ? m.textContent : null,"
        " entries: Array.from(document.querySelectorAll('.guest-entry'),"
        "                     e => e.textContent)};")
    return dict(shown, typed=typed, url=driver.current_url)


def main():
    url = sys.argv[1]
    form = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        driver = start(profile)
        try:
            result = fill_and_sign(driver, url, form["name"], form["remark"],
                                   form.get("force", False))
        finally:
            driver.quit()
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
