"""Tool calls against the real clients on SmolLM2-135M (its template has no tools: the generic
format, tools described in the system message): the `openai` SDK with tool_choice required and a
named function (the call always parses, its arguments validate against the schema), the same call
streamed as delta.tool_calls, the two-step loop (the call, the tool's result, the answer that uses
it), tool_choice none and auto; LangChain's ChatOpenAI with bind_tools running the loop; errors
that name the field (an unknown function, a schema the grammar cannot enforce, tools on
completions, a template that refuses the conversation, via --chat-template-file)."""
import json
import os

import common

ember, model = common.args()
openai, jsonschema = common.clients("openai", "jsonschema")

c = common.Checks("tools")
M = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def valid(call, tool):
    try:
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


with common.Server(ember, model, ctx=2048) as srv:
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)

    # Forced: required, then a named function. Greedy and sampled: the call always parses.
    for temp in (0, 0.9):
        r = oa.chat.completions.create(model=M, messages=ASK, tools=[WEATHER, ADD], tool_choice="required",
                                       temperature=temp, max_tokens=96, seed=5)
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        c.check(ch.finish_reason == "tool_calls" and len(calls) == 1 and calls[0].type == "function" and
                calls[0].id.startswith("call_") and calls[0].function.name in ("get_weather", "add") and
                valid(calls[0], WEATHER if calls[0].function.name == "get_weather" else ADD),
                f"required at temperature {temp}: {ch}")
    r = oa.chat.completions.create(model=M, messages=[{"role": "user", "content": "What is 17 plus 25?"}],
                                   tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}},
                                   temperature=0, max_tokens=64)
    call = r.choices[0].message.tool_calls[0]
    c.check(call.function.name == "add" and valid(call, ADD) and r.choices[0].message.content is None,
            f"named: {r.choices[0].message}")
    print("named call:", call.function.name, call.function.arguments)

    # Streamed: the same call as delta.tool_calls, then finish_reason tool_calls.
    forced = dict(model=M, messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  temperature=0, max_tokens=64)
    whole = oa.chat.completions.create(**forced).choices[0].message.tool_calls[0]
    name, args, ids, finish, text = "", "", set(), None, ""
    for chunk in oa.chat.completions.create(**forced, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
            if tc.id:
                ids.add(tc.id)
        finish = chunk.choices[0].finish_reason or finish
    c.check(name == "get_weather" and args == whole.function.arguments and len(ids) == 1 and finish == "tool_calls" and
            text == "", f"streamed call {name} {args} {finish} vs {whole.function.arguments}")

    # The loop's second step: the call and its result in the history, an answer that uses it.
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": whole.id, "type": "function", "function": {"name": "get_weather", "arguments": whole.function.arguments}}]},
        {"role": "tool", "tool_call_id": whole.id, "content": json.dumps({"temperature_celsius": 31, "sky": "sunny"})}]
    final = oa.chat.completions.create(model=M, messages=history, tools=[WEATHER], tool_choice="none",
                                       temperature=0, max_tokens=48)
    answer = final.choices[0].message.content or ""
    print("answer after the tool:", repr(answer))
    c.check(final.choices[0].finish_reason in ("stop", "length") and not final.choices[0].message.tool_calls and
            ("31" in answer or "sunny" in answer.lower()), f"the answer uses the result: {answer!r}")
    # auto: the model chooses; whatever it does comes back well formed.
    auto = oa.chat.completions.create(model=M, messages=ASK, tools=[WEATHER], tool_choice="auto", temperature=0,
                                      max_tokens=64).choices[0]
    c.check((auto.finish_reason == "tool_calls" and valid(auto.message.tool_calls[0], WEATHER)) or
            (auto.finish_reason in ("stop", "length") and auto.message.content), f"auto {auto}")

    # LangChain: ChatOpenAI.bind_tools with the call forced, the tool run, the final answer.
    try:
        from langchain_core.messages import HumanMessage, ToolMessage
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
    except ImportError:
        common.skip("langchain-openai is not installed (scripts/setup.sh --tests installs it into .venv)")

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return json.dumps({"city": city, "temperature_celsius": 31, "sky": "sunny"})

    llm = ChatOpenAI(base_url=srv.url + "/v1", api_key="none", model=M, temperature=0, max_tokens=64, max_retries=0)
    msgs = [HumanMessage("What is the weather like in Paris today?")]
    ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(msgs)
    c.check(len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather" and
            isinstance(ai.tool_calls[0]["args"].get("city"), str), f"LangChain call {ai.tool_calls}")
    msgs.append(ai)
    for tc in ai.tool_calls:
        msgs.append(ToolMessage(get_weather.invoke(tc["args"]), tool_call_id=tc["id"]))
    out = llm.invoke(msgs)
    print("LangChain answer:", repr(out.content))
    c.check(isinstance(out.content, str) and ("31" in out.content or "sunny" in out.content.lower()),
            f"LangChain's second step uses the result: {out.content!r}")

    # Errors name the field.
    for body, param in [({"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                        ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                            "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}],
                          "tool_choice": "required"}, "tools[0].function.parameters"),
                        ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
                        ({"messages": ASK + [{"role": "tool", "content": "x"}]}, "messages[1].tool_call_id")]:
        status, resp = common.post(srv.url + "/v1/chat/completions", body)
        c.check(status == 400 and resp["error"]["param"] == param, f"{param}: {status} {resp}")
    status, resp = common.post(srv.url + "/v1/completions", {"prompt": "x", "tools": [WEATHER]})
    c.check(status == 400 and resp["error"]["param"] == "tools", f"tools on completions: {status} {resp}")
    c.check(srv.alive(), "alive")

# A template that refuses a conversation (Gemma 3's: roles must alternate) answers 400 with its words.
gemma_template = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "chat_templates", "google-gemma-3-it.jinja")
with common.Server(ember, model, "--chat-template-file", gemma_template, ctx=512) as srv:
    status, resp = common.post(srv.url + "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    c.check(status == 400 and resp["error"]["param"] == "messages" and "must alternate" in resp["error"]["message"],
            f"a template that raises: {status} {resp}")
    status, resp = common.post(srv.url + "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "a"}], "max_tokens": 4})
    c.check(status == 200, f"the same template on a conversation it takes: {status}")

c.done()
