"""The web view (remote/web/view.py) in a real browser: headless Chromium from Debian's packages, driven
by selenium through Debian's chromedriver (nothing downloads a browser). Signing in through the
form, following links by clicking, every page with JavaScript switched off, a scoped token kept
out of another repo, hostile names shown as text (no alert), and the Parquet preview's figures.

When /usr/bin/chromium or /usr/bin/chromedriver is missing, the session installs them with
apt-get (`--no-install-recommends`); where that cannot run, the tests fail saying why, never skip."""
import os
import shutil
import subprocess
import tempfile
import time

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cdcstore.testing import ServedStore
from test_web import (ALL, SCOPED, SECRET_FILE, SECRET_REPO, TOKENS, XSS, XSS_ATTR, make_store,
                      preview_figures)

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PACKAGES = ["chromium", "chromium-driver"]


def ensure_chromium() -> float:
    """Seconds spent installing Debian's chromium and chromium-driver (0 when present)."""
    if os.path.exists(CHROMIUM) and os.path.exists(DRIVER):
        return 0.0
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.fail(f"{CHROMIUM} and {DRIVER} are needed: `apt-get install -y chromium chromium-driver` "
                    f"(as root; this machine has {'no apt-get' if apt is None else 'no root'})")
    began = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return time.monotonic() - began


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    installed = ensure_chromium()
    if installed:
        print(f"installed chromium and chromium-driver in {installed:.1f} s")
    root = tmp_path_factory.mktemp("webui")
    data = make_store(root)
    with ServedStore(root, tokens=TOKENS) as srv:  # the store make_store filled, as it is
        srv.data = data
        yield srv


def browser(javascript: bool = True) -> webdriver.Chrome:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,1000"):
        opts.add_argument(flag)
    if not javascript:
        opts.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    driver.profile_dir = profile
    return driver


@pytest.fixture
def chrome():
    drivers = []

    def make(javascript: bool = True):
        drivers.append(browser(javascript))
        return drivers[-1]
    yield make
    for d in drivers:
        d.quit()
        shutil.rmtree(d.profile_dir, ignore_errors=True)


def sign_in(driver, site, token: str) -> None:
    driver.get(site.url + "/ui/")
    assert "/ui/login" in driver.current_url  # sent to the form
    driver.find_element(By.NAME, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 20).until(lambda drv: "/ui/login" not in drv.current_url)
    assert driver.current_url.endswith("/ui/"), driver.current_url
    assert driver.find_element(By.TAG_NAME, "h1").text == "Repos"


def no_alert(driver) -> bool:
    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def click(driver, text: str) -> None:
    driver.find_element(By.LINK_TEXT, text).click()


def test_click_through_with_javascript_switched_off(site, chrome):
    """Sign in, then reach the log, a commit, the tree, a folder, a file and its Parquet preview, a
    diff and the store's chart by clicking, with JavaScript off: no page needs it."""
    d = chrome(javascript=False)
    assert d.execute_cdp_cmd("Runtime.evaluate", {"expression": "1"})  # the driver itself still works
    sign_in(d, site, ALL)
    assert d.find_element(By.LINK_TEXT, SECRET_REPO)  # the everything token sees every repo
    click(d, "ds")
    assert "Repo ds" in d.find_element(By.TAG_NAME, "h1").text
    click(d, "Log")
    rows = d.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 3 and "a copy of the notes" in rows[0].text and "+1" in rows[0].text
    rows[-1].find_element(By.CSS_SELECTOR, "td a").click()  # the first commit
    assert "Commit" in d.find_element(By.TAG_NAME, "h1").text and "first <b>bold</b> & more" in d.page_source \
        .replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    click(d, "browse the files at this commit")
    click(d, "sub/")
    names = [a.text for a in d.find_elements(By.CSS_SELECTOR, "tbody td:first-child a")]
    assert "<script>alert(1)</" in names and XSS_ATTR in names  # shown as text
    assert no_alert(d)
    click(d, "ds")  # the crumbs
    click(d, "Files")
    began = time.perf_counter()
    click(d, "big.parquet")
    seconds = time.perf_counter() - began
    assert d.find_element(By.TAG_NAME, "h1").text == "big.parquet"
    first_rows = d.find_elements(By.CSS_SELECTOR, "table.rows tbody tr")
    assert len(first_rows) == 20 and first_rows[0].text.split()[0] == "0"
    f = preview_figures(d.page_source)
    assert f["bytes"] <= 2 * (f["footer"] + f["first_group"])
    print(f"browser: file page with the Parquet preview loaded in {seconds * 1000:.0f} ms (JavaScript off); "
          f"fetched {f['bytes']:,} bytes, {f['bytes'] / (f['footer'] + f['first_group']):.2f}x footer + first group")
    d.get(site.url + "/ui/r/ds/")
    d.find_element(By.NAME, "a").clear()
    d.find_element(By.NAME, "a").send_keys("v1")
    d.find_element(By.CSS_SELECTOR, "form[action='/ui/r/ds/diff'] button").click()
    WebDriverWait(d, 20).until(lambda drv: "/diff?" in drv.current_url and "added" in drv.page_source)
    assert "1 added, 2 changed, 0 removed" in d.find_element(By.TAG_NAME, "main").text
    click(d, "store")
    chart = d.find_element(By.CSS_SELECTOR, "svg.chart")
    assert chart.size["width"] > 300 and chart.size["height"] > 100  # drawn without JavaScript
    assert len(chart.find_elements(By.TAG_NAME, "circle")) == 6  # two lines, three versions
    d.find_element(By.CSS_SELECTOR, "header button").click()  # sign out
    WebDriverWait(d, 20).until(lambda drv: "/ui/login" in drv.current_url)
    assert "/ui/login" in d.current_url
    d.get(site.url + "/ui/r/ds/")
    assert "/ui/login" in d.current_url


def test_a_scoped_token_in_the_browser(site, chrome):
    d = chrome()
    sign_in(d, site, SCOPED)
    assert SECRET_REPO not in d.page_source
    seen, todo = set(), [site.url + "/ui/"]
    while todo:  # every page this token can reach by links
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        d.get(u)
        assert SECRET_REPO not in d.page_source and SECRET_FILE not in d.page_source, u
        assert "500" != d.find_element(By.TAG_NAME, "h1").text and "404" != d.find_element(By.TAG_NAME, "h1").text, u
        todo += [h for h in (a.get_attribute("href") for a in d.find_elements(By.TAG_NAME, "a"))
                 if h and h.startswith(site.url + "/ui/") and "/raw/" not in h and h not in seen]
    assert len(seen) >= 15
    for path in (f"/ui/r/{SECRET_REPO}/", f"/ui/r/{SECRET_REPO}/tree/main/", f"/ui/r/{SECRET_REPO}/file/main/{SECRET_FILE}"):
        d.get(site.url + path)
        assert d.find_element(By.TAG_NAME, "h1").text == "404"
        assert SECRET_FILE not in d.find_element(By.TAG_NAME, "main").text.replace(path, "")
    d.get(f"{site.url}/ui/r/{SECRET_REPO}/raw/main/{SECRET_FILE}")
    assert "own bytes" not in d.page_source


def test_hostile_names_run_nothing_with_javascript_on(site, chrome):
    d = chrome(javascript=True)
    sign_in(d, site, ALL)
    for path in ("/ui/r/ds/tree/main/sub/", "/ui/r/ds/file/main/sub/%3Cscript%3Ealert(1)%3C/script%3E",
                 "/ui/r/ds/log/main", "/ui/r/ds/commit/v1"):
        d.get(site.url + path)
        assert no_alert(d), path
        assert d.execute_script("return document.querySelectorAll('script, img').length") == 0, path
    d.get(site.url + "/ui/r/ds/file/main/sub/%3Cscript%3Ealert(1)%3C/script%3E")
    assert d.find_element(By.TAG_NAME, "h1").text == "script>"
    assert XSS.startswith(d.find_elements(By.CSS_SELECTOR, ".crumbs a")[-1].text)
