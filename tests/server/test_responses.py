"""OpenAI's Responses API (/v1/responses), stateless over the chat machinery, with the clients that
use it unchanged: the `openai` SDK (responses.create and responses.stream: text, a forced function
call and its result in the next input, json_schema output, the event sequence), and the OpenAI
Agents SDK, whose default API it is (a tool loop, a structured output, a streamed run). Errors:
previous_response_id, fields this server does not take, fetching a response back."""
import asyncio
import json

import common

ember, model = common.args()
openai, agents, pydantic = common.clients("openai", "agents", "pydantic")

c = common.Checks("responses")
M = "SmolLM2-135M-Instruct.Q4_1"
W = {"type": "function", "name": "get_weather", "description": "Get the weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}

with common.Server(ember, model, ctx=2048) as srv:
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    r = oa.responses.create(model=M, input="What is the capital of France? Answer in one word.", temperature=0,
                            max_output_tokens=24)
    chat = oa.chat.completions.create(model=M, messages=[{"role": "user", "content": "What is the capital of France? "
                                      "Answer in one word."}], temperature=0, max_tokens=24).choices[0].message.content
    c.check(r.status == "completed" and r.output_text == chat and "Paris" in r.output_text,
            f"text, as the chat route answers: {r.output_text!r} vs {chat!r}")
    c.check(r.usage.input_tokens > 10 and r.usage.output_tokens > 0 and
            r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens and r.id.startswith("resp_"), f"usage {r.usage}")
    cut = oa.responses.create(model=M, input="Count from one to fifty.", temperature=0, max_output_tokens=4)
    c.check(cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens", f"cut {cut.status}")

    t = oa.responses.create(model=M, input="Weather in Paris?", tools=[W], tool_choice="required", temperature=0,
                            instructions="Use the tools.")
    calls = [o for o in t.output if o.type == "function_call"]
    c.check(len(calls) == 1 and calls[0].name == "get_weather" and isinstance(json.loads(calls[0].arguments)["city"], str),
            f"a forced call {t.output}")
    follow = oa.responses.create(model=M, temperature=0, max_output_tokens=32, tools=[W], tool_choice="none", input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
    c.check(follow.status in ("completed", "incomplete") and follow.output_text and
            all(o.type == "message" for o in follow.output), f"the result in the next input: {follow.output}")

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    s = oa.responses.create(model=M, input="Describe Paris as JSON.", temperature=0, max_output_tokens=60,
                            text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    c.check(isinstance(json.loads(s.output_text).get("city"), str) and s.text.format.type == "json_schema",
            f"json_schema output {s.output_text!r}")

    with oa.responses.stream(model=M, input="What is the capital of France? Answer in one word.", temperature=0,
                             max_output_tokens=24) as st:
        events = [e for e in st]
        final = st.get_final_response()
    types = [e.type for e in events]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    c.check(types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added"] and types[-1] == "response.completed" and
            deltas == r.output_text == final.output_text, f"streamed text {types} {deltas!r}")
    c.check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
    with oa.responses.stream(model=M, input="Weather in Paris?", tools=[W], tool_choice="required", temperature=0) as st:
        ev = [e.type for e in st]
        fr = st.get_final_response()
    c.check("response.function_call_arguments.done" in ev and fr.output[0].type == "function_call" and
            json.loads(fr.output[0].arguments).get("city"), f"a streamed call {ev}")

    for kwargs, param in [(dict(previous_response_id="resp_1"), "previous_response_id"),
                          (dict(reasoning={"effort": "low"}), "reasoning"),
                          (dict(include=["message.output_text.logprobs"]), "include")]:
        try:
            oa.responses.create(model=M, input="x", **kwargs)
            c.check(False, f"{param} accepted")
        except openai.BadRequestError as e:
            c.check(e.body["param"] == param, f"{param}: {e.body}")
    status, body = common.get(srv.url + "/v1/responses/" + r.id)
    c.check(status == 404 and "not stored" in body["error"]["message"], f"fetching back: {status} {body}")

    # The OpenAI Agents SDK, on its default API: a tool loop, a structured output, a streamed run.
    agents.set_tracing_disabled(True)

    async def run_agents():
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        model_ = agents.OpenAIResponsesModel(model=M, openai_client=client)
        seen = []

        @agents.function_tool
        def get_weather(city: str) -> str:
            """Get the weather in a city."""
            seen.append(city)
            return f"sunny, 21 C in {city}"

        looped = await agents.Runner.run(agents.Agent(
            name="weather", instructions="Answer briefly.", tools=[get_weather], model=model_,
            model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
            tool_use_behavior="stop_on_first_tool"), "What is the weather in Paris?")

        class City(pydantic.BaseModel):
            name: str
            country: str

        shaped = await agents.Runner.run(agents.Agent(
            name="city", instructions="Reply in JSON.", output_type=City, model=model_,
            model_settings=agents.ModelSettings(temperature=0, max_tokens=200)), "Paris")
        streamed = agents.Runner.run_streamed(agents.Agent(
            name="plain", instructions="Answer briefly.", model=model_,
            model_settings=agents.ModelSettings(temperature=0, max_tokens=200)), "What is the capital of France?")
        n = 0
        async for _ in streamed.stream_events():
            n += 1
        return seen, looped.final_output, shaped.final_output, n, streamed.final_output

    seen, looped, shaped, n_events, streamed_out = asyncio.run(run_agents())
    c.check(len(seen) == 1 and "sunny" in looped, f"agents tool loop: {seen} {looped!r}")
    c.check(isinstance(shaped.name, str) and isinstance(shaped.country, str), f"agents structured output {shaped}")
    c.check(n_events > 3 and isinstance(streamed_out, str) and streamed_out, f"agents streamed run {n_events} {streamed_out!r}")
c.done()
