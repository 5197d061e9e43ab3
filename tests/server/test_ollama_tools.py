"""Tools over Ollama's API (/api/chat), with the clients that use it unchanged: the `ollama`
package (tools, streaming, a tool loop's history with calls and results, /api/show's
capabilities), langchain-ollama's ChatOllama with bind_tools and litellm's `ollama_chat/` provider. SmolLM2 chooses for itself whether
to call (Ollama's API has no tool_choice): whatever it answers must come back well formed, a call
of an offered function with arguments that validate, or text. The tools reach the prompt (its
token count grows by the tools' description) and a history of calls and results is accepted."""
import json
import os

import common

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no network fetch at import

ember, model = common.args()
ollama, langchain_ollama, jsonschema, litellm = common.clients("ollama", "langchain_ollama", "jsonschema", "litellm")

c = common.Checks("ollama_tools")
M = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Call the get_weather tool."}]
OPT = {"temperature": 0, "num_predict": 64}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}


def well_formed(message, where):
    """A call of an offered function whose arguments (an object) validate, or text."""
    if message.tool_calls:
        for call in message.tool_calls:
            ok = call.function.name in SCHEMAS and isinstance(call.function.arguments, dict)
            if ok:
                try:
                    jsonschema.validate(call.function.arguments, SCHEMAS[call.function.name])
                except jsonschema.ValidationError:
                    ok = False
            c.check(ok, f"{where}: a call of an offered function with valid arguments: {call}")
    else:
        c.check(bool(message.content), f"{where}: text when there is no call: {message}")


with common.Server(ember, model, ctx=2048) as srv:
    client = ollama.Client(host=srv.url)
    caps = client.show(M).capabilities
    c.check("tools" in caps and "completion" in caps and "embedding" in caps, f"capabilities {caps}")

    plain = client.chat(model=M, messages=ASK, options=OPT)
    r = client.chat(model=M, messages=ASK, tools=[WEATHER, ADD], options=OPT)
    c.check(r.done and r.done_reason in ("stop", "length"), f"chat with tools {r}")
    c.check(r.prompt_eval_count > plain.prompt_eval_count + 30,
            f"the tools reach the prompt: {r.prompt_eval_count} against {plain.prompt_eval_count} tokens without")
    well_formed(r.message, "chat with tools")

    # Streaming: the same answer, the calls (if any) in a chunk before the last one.
    chunks = list(client.chat(model=M, messages=ASK, tools=[WEATHER, ADD], options=OPT, stream=True))
    c.check(chunks[-1].done and not any(ch.done for ch in chunks[:-1]), "one last chunk")
    streamed_calls = [tc for ch in chunks for tc in (ch.message.tool_calls or [])]
    c.check("".join(ch.message.content for ch in chunks) == r.message.content and
            [(t.function.name, t.function.arguments) for t in streamed_calls] ==
            [(t.function.name, t.function.arguments) for t in (r.message.tool_calls or [])],
            f"streamed as answered: {[(ch.message.content, ch.message.tool_calls) for ch in chunks]}")

    # A tool loop's history: the assistant's calls (arguments as objects, no ids) and the results
    # (by tool_name, and one without a name answering the call still open).
    history = ASK + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                        {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny, 21 C"},
        {"role": "tool", "content": "5"}]
    final = client.chat(model=M, messages=history, tools=[WEATHER, ADD], options=OPT)
    c.check(final.done and final.prompt_eval_count > r.prompt_eval_count, f"history with calls and results {final}")
    well_formed(final.message, "after the results")

    # Errors: a result that answers no call; tools on /api/generate.
    for call, needle in [
            (lambda: client.chat(model=M, messages=ASK + [{"role": "tool", "content": "5"}], tools=[ADD]), "answers no call"),
            (lambda: client.chat(model=M, messages=ASK, tools=[{"type": "function", "function": {"name": "bad name!"}}]),
             "tools[0].function.name")]:
        try:
            call()
            c.check(False, f"accepted; expected a 400 naming {needle}")
        except ollama.ResponseError as e:
            c.check(e.status_code == 400 and needle in e.error, f"error {e.status_code} {e.error}")
    status, resp = common.post(srv.url + "/api/generate", {"model": M, "prompt": "x", "tools": [ADD]})
    c.check(status == 400 and "/api/chat" in resp["error"], f"tools on /api/generate: {status} {resp}")

    # langchain-ollama: bind_tools, the answer an AIMessage with well-formed calls or text.
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = langchain_ollama.ChatOllama(model=M, base_url=srv.url, temperature=0, num_predict=64)
    ai = llm.bind_tools([get_weather]).invoke(ASK[0]["content"])
    if ai.tool_calls:
        c.check(all(t["name"] == "get_weather" and isinstance(t["args"].get("city"), str) for t in ai.tool_calls),
                f"langchain-ollama calls {ai.tool_calls}")
    else:
        c.check(bool(ai.content), f"langchain-ollama text {ai}")

    # litellm's ollama_chat/ provider: the tools reach the prompt, the answer is well formed, and a
    # history with a call and its result (OpenAI's shapes, which litellm turns into Ollama's) is read.
    via = dict(model="ollama_chat/" + M, api_base=srv.url, temperature=0, max_tokens=48)
    plain_l = litellm.completion(messages=ASK, **via)
    tooled = litellm.completion(messages=ASK, tools=[WEATHER], **via)
    c.check(tooled.usage.prompt_tokens > plain_l.usage.prompt_tokens + 30,
            f"litellm: the tools reach the prompt ({tooled.usage.prompt_tokens} against {plain_l.usage.prompt_tokens})")
    lm = tooled.choices[0].message
    if lm.tool_calls:
        c.check(all(t.function.name == "get_weather" and isinstance(json.loads(t.function.arguments).get("city"), str)
                    for t in lm.tool_calls), f"litellm calls {lm.tool_calls}")
    else:
        c.check(bool(lm.content), f"litellm text {lm}")
    hist = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    after = litellm.completion(messages=hist, tools=[WEATHER], **via)
    c.check(after.usage.prompt_tokens > tooled.usage.prompt_tokens and
            (after.choices[0].message.content or after.choices[0].message.tool_calls), f"litellm history {after}")
c.done()
