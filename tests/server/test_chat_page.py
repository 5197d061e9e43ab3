"""The built-in chat page at / in headless Chromium (Debian's chromium + chromium-driver,
selenium from PyPI): type a message, press Enter, and read the answer as it streams in."""
import os
import shutil
import time

import common

ember, model = common.args()
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError:
    common.skip("the `selenium` Python package is not installed (scripts/setup.sh installs it into .venv)")
chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
chromium = shutil.which("chromium") or "/usr/bin/chromium"
if not (os.path.exists(chromedriver) and os.path.exists(chromium)):
    common.skip("chromium or chromium-driver is not installed (scripts/setup.sh installs them)")

c = common.Checks("chat page")
with common.Server(ember, model) as srv:
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1000,800"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
    try:
        driver.set_page_load_timeout(30)
        driver.get(srv.url + "/")
        c.check(driver.title == "Ember chat", f"title {driver.title!r}")
        # Count how often the answer's text changes: streaming shows it growing piece by piece.
        driver.execute_script("""
            window.__updates = 0;
            new MutationObserver(() => { window.__updates++; })
              .observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});""")
        temp = driver.find_element(By.ID, "temperature")
        temp.clear()
        temp.send_keys("0")  # greedy: a deterministic answer
        box = driver.find_element(By.ID, "input")
        box.send_keys("What is the capital of France? Answer in one word.")
        box.send_keys(Keys.ENTER)
        deadline = time.time() + 60
        status = ""
        while time.time() < deadline:
            status = driver.find_element(By.ID, "status").text
            if status in ("done", "error"):
                break
            time.sleep(0.1)
        c.check(status == "done", f"status {status!r}")
        users = driver.find_elements(By.CSS_SELECTOR, ".msg.user")
        answers = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")
        c.check(len(users) == 1 and "capital of France" in users[0].text, "the user's message is shown")
        answer = answers[-1].text if answers else ""
        print(f"chat page answer: {answer!r}; {driver.execute_script('return window.__updates')} DOM updates")
        c.check("Paris" in answer, f"answer {answer!r}")
        c.check(driver.execute_script("return window.__updates") >= 3, "the answer arrived in several pieces")
        c.check(driver.find_element(By.ID, "send").is_enabled(), "send button enabled again")
        # A second turn keeps the conversation.
        box.send_keys("Thanks!")
        box.send_keys(Keys.ENTER)
        deadline = time.time() + 60
        while time.time() < deadline and driver.find_element(By.ID, "status").text != "done":
            time.sleep(0.1)
        answers = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")
        c.check(len(answers) == 2 and answers[1].text.strip() != "", f"second answer {[a.text for a in answers]}")
    finally:
        driver.quit()
    c.check(srv.alive(), "server alive")
c.done()
