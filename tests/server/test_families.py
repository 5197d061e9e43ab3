"""Every architecture through `ember serve` with the `openai` package: a synth model of each
(ember synth, tiny shapes; the real SmolLM2 file is test_openai.py's) answers chat and completion
requests, streamed and not, and the server's greedy completion is the very text
`ember generate --temp 0` prints for the same prompt."""
import os
import subprocess
import sys
import tempfile

import common

if len(sys.argv) < 3:
    print(f"usage: {sys.argv[0]} path/to/ember models-dir", file=sys.stderr)
    sys.exit(2)
ember = sys.argv[1]
try:
    import openai
except ImportError:
    common.skip("the `openai` Python package is not installed (scripts/setup.sh --tests installs it into .venv)")

FAMILIES = {
    "llama": [],
    "mixtral": ["--n-expert", "4", "--n-expert-used", "2"],
    "qwen2": ["--arch", "qwen2"],
    "qwen3": ["--arch", "qwen3"],
    "qwen3moe": ["--arch", "qwen3moe", "--n-expert", "8", "--n-expert-used", "2", "--n-ff", "64"],
    "phi3": ["--arch", "phi3"],
    "falcon": ["--arch", "falcon"],
    "gemma3": ["--arch", "gemma3"],
    "opt": ["--arch", "opt"],
    "bamboo": ["--arch", "bamboo"],
}
PROMPT = "the cat sat on the"

c = common.Checks("families")
with tempfile.TemporaryDirectory() as tmp:
    for name, flags in FAMILIES.items():
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([ember, "synth", "--preset", "tiny", *flags, "-o", path], check=True, capture_output=True)
        # The same context as the server's: Phi-3's LongRoPE table depends on it.
        cli = subprocess.run([ember, "generate", "-m", path, "-p", PROMPT, "-n", "8", "--temp", "0", "-t", "1", "-c", "256"],
                             check=True, capture_output=True, text=True).stdout
        with common.Server(ember, path, ctx=256) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
            model_id = client.models.list().data[0].id
            r = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=8, temperature=0)
            text = r.choices[0].text
            c.check(r.usage.completion_tokens == 8 and text, f"{name}: completion {r}")
            c.check(cli.startswith(PROMPT + text) or cli.rstrip("\n") == PROMPT + text,
                    f"{name}: server's greedy text {text!r} is ember generate's {cli!r}")
            streamed = "".join(ch.choices[0].text for ch in client.completions.create(
                model=model_id, prompt=PROMPT, max_tokens=8, temperature=0, stream=True) if ch.choices)
            c.check(streamed == text, f"{name}: streamed {streamed!r} == {text!r}")
            chat = client.chat.completions.create(model=model_id, temperature=0, max_tokens=6, messages=[
                {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}])
            c.check(chat.choices[0].message.role == "assistant" and chat.usage.prompt_tokens > 5 and
                    chat.usage.completion_tokens >= 1, f"{name}: chat {chat}")
            c.check(srv.alive(), f"{name}: server alive")
c.done()
