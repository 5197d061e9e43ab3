"""README.md's "Using Ember with your tools" snippets, run as written against a real `ember serve`
(only the address changed to the test server's): the openai SDK (chat, embeddings, the Responses
API), the ollama client (a streamed chat, tools), tools with tool_choice required, LangChain's
bind_tools, the OpenAI Agents SDK, and the curl lines. A snippet that stops working fails here."""
import os
import re
import subprocess
import sys

import common

ember, model = common.args()
common.clients("openai", "ollama", "langchain_openai", "agents")

c = common.Checks("readme")
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
readme = open(os.path.join(root, "README.md")).read()
section = readme[readme.index("## Using Ember with your tools"):readme.index("## Commands")]
blocks = re.findall(r"```(python|sh)\n(.*?)```", section, re.S)
c.check(len([b for b in blocks if b[0] == "python"]) >= 2 and any(b[0] == "sh" for b in blocks), f"blocks {len(blocks)}")

with common.Server(ember, model, ctx=1024) as srv:
    host = srv.url.split("//")[1]
    python = "\n".join(code for lang, code in blocks if lang == "python").replace("127.0.0.1:8080", host)
    p = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=240)
    print(p.stdout[-600:], p.stderr[-2000:])
    c.check(p.returncode == 0, "the Python snippets run")
    c.check("name='get_weather'" in p.stdout and "Paris" in p.stdout, "the tool call is printed")
    for lang, code in blocks:
        if lang != "sh":
            continue
        sh = code.replace("localhost:8080", host)
        q = subprocess.run(["bash", "-eo", "pipefail", "-c", sh], capture_output=True, text=True, timeout=240)
        c.check(q.returncode == 0 and '"choices"' in q.stdout and '"response"' in q.stdout and "ember_requests_total" in q.stdout,
                f"the curl lines: {q.returncode} {q.stdout[-400:]} {q.stderr[-400:]}")
    c.check(srv.alive(), "alive")
c.done()
