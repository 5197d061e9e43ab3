"""The built-in chat page at / in headless Chromium (Debian's chromium + chromium-driver,
selenium from PyPI): its defaults are the model's recommended sampling; type a message, press
Enter, and read the answer as it streams in, with the system prompt sent first and the time to
first token and tokens/s under it; its Markdown renderer (code blocks with a copy button, lists,
tables, quotes, links) never turns the model's text into markup; a tool call shows as a call."""
import re
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
    common.skip("the `selenium` Python package is not installed (scripts/setup.sh --tests installs it into .venv)")
chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
chromium = shutil.which("chromium") or "/usr/bin/chromium"
if not (os.path.exists(chromedriver) and os.path.exists(chromium)):
    common.skip("chromium or chromium-driver is not installed (scripts/setup.sh --tests installs them)")

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
        deadline = time.time() + 10
        howto = ""
        while time.time() < deadline and "ChatOpenAI" not in howto:
            howto = driver.execute_script("return document.getElementById('howto-code').textContent")
            time.sleep(0.05)
        c.check(f'base_url="{srv.url}/v1"' in howto and 'model="SmolLM2-135M-Instruct.Q4_1"' in howto and
                f'ollama.Client(host="{srv.url}")' in howto, f"the page's snippets name this server {howto[:300]!r}")
        # Count how often the answer's text changes: streaming shows it growing piece by piece.
        driver.execute_script("""
            window.__updates = 0;
            new MutationObserver(() => { window.__updates++; })
              .observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});""")
        temp = driver.find_element(By.ID, "temperature")
        deadline = time.time() + 10
        while time.time() < deadline and temp.get_attribute("value") == "0.7":
            time.sleep(0.05)
        c.check(temp.get_attribute("value") == "0.2" and driver.find_element(By.ID, "top_p").get_attribute("value") == "0.9",
                f"SmolLM2's recommended sampling as the defaults: {temp.get_attribute('value')}")
        # What the page sends: the system prompt first.
        driver.execute_script("""
            window.__bodies = [];
            const f = window.fetch;
            window.fetch = (url, o) => { if (o && o.body) window.__bodies.push(JSON.parse(o.body)); return f(url, o); };""")
        driver.find_element(By.ID, "system").send_keys("You are a geography teacher.")
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
        sent = driver.execute_script("return window.__bodies")
        c.check(len(sent) == 1 and sent[0]["messages"][0] == {"role": "system", "content": "You are a geography teacher."}
                and sent[0]["messages"][1]["role"] == "user" and sent[0]["temperature"] == 0 and
                sent[0]["stream_options"] == {"include_usage": True}, f"request {sent}")
        stats = driver.find_elements(By.CSS_SELECTOR, ".stats")
        c.check(len(stats) == 1 and re.match(r"first token \d+ ms · [\d.]+ tokens/s · \d+ tokens$", stats[0].text),
                f"stats {[x.text for x in stats]}")
        # A second turn keeps the conversation.
        box.send_keys("Thanks!")
        box.send_keys(Keys.ENTER)
        deadline = time.time() + 60
        while time.time() < deadline and driver.find_element(By.ID, "status").text != "done":
            time.sleep(0.1)
        answers = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")
        c.check(len(answers) == 2 and answers[1].text.strip() != "", f"second answer {[a.text for a in answers]}")
        # The Markdown renderer on a crafted reply: blocks and spans as elements, and the model's
        # HTML as text (no element made from it, no script run).
        md = ("# Title\nSome **bold**, *em*, `x<y` and [a link](https://example.com) [bad](javascript:alert(1)).\n\n"
              "```python\nprint('<b>hi</b>')\n```\n\n- one\n- two\n\n1. first\n2. second\n\n"
              "| a | b |\n|---|---|\n| 1 | <i>2</i> |\n\n> quoted\n\n<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>")
        got = driver.execute_script("""
            const d = document.createElement('div');
            d.appendChild(renderMarkdown(arguments[0]));
            document.body.appendChild(d);
            const q = s => d.querySelectorAll(s).length;
            return {h: q('h3'), strong: q('strong'), em: q('em'), code: q('p code'), a: q('a'),
                    href: d.querySelector('a') && d.querySelector('a').href, pre: d.querySelector('pre code').textContent,
                    lang: d.querySelector('pre code').className, copy: q('.codeblock button'), ul: q('ul li'), ol: q('ol li'),
                    th: q('th'), td: q('td'), tdText: d.querySelectorAll('td')[1].textContent, quote: q('blockquote p'),
                    bad: q('img') + q('script') + q('i'), xss: window.pwned || 0, text: d.textContent};""", md)
        print("rendered:", {k: v for k, v in got.items() if k != "text"})
        c.check(got["h"] == 1 and got["strong"] == 1 and got["em"] == 1 and got["code"] == 1 and got["a"] == 1 and
                got["href"] == "https://example.com/", f"spans {got}")
        c.check(got["pre"] == "print('<b>hi</b>')" and got["lang"] == "language-python" and got["copy"] == 1,
                f"code block {got}")
        c.check(got["ul"] == 2 and got["ol"] == 2 and got["th"] == 2 and got["td"] == 2 and got["tdText"] == "<i>2</i>"
                and got["quote"] == 1, f"lists, table, quote {got}")
        c.check(got["bad"] == 0 and got["xss"] == 0 and "<script>" in got["text"] and "javascript:alert" in got["text"],
                f"the model's HTML stays text {got}")
        driver.execute_script("""showToolCalls([{id: 'c1', type: 'function',
            function: {name: 'get_weather', arguments: '{"city": "Paris"}'}}]);""")
        tool = driver.find_elements(By.CSS_SELECTOR, ".msg.tool")
        c.check(len(tool) == 1 and "tool call get_weather" in tool[0].text and '"city": "Paris"' in tool[0].text,
                f"a tool call shows as one {[t.text for t in tool]}")
    finally:
        driver.quit()
    c.check(srv.alive(), "server alive")
c.done()
