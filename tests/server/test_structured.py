"""Structured output with real clients: the `openai` package's parse helper (a pydantic model with
nested objects, arrays, enums, numbers, optional fields), raw json_schema requests checked with
a JSON-schema validator (streamed and not, strings with escapes), json_object, and the 400 that
names an unsupported schema feature."""
import enum
import json
from typing import List, Optional

import common

ember, model = common.args()
try:
    import jsonschema
    import openai
    import pydantic
except ImportError:
    common.skip("`openai` / `jsonschema` are not installed (scripts/setup.sh --tests installs them into .venv)")


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    zip: int


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int
    height_m: float
    favorite: Color
    address: Address
    hobbies: List[str] = pydantic.Field(max_length=3)
    nickname: Optional[str] = pydantic.Field(max_length=12)


SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "quote": {"type": "string", "maxLength": 40},
        "year": {"type": "integer"},
        "rating": {"type": "number"},
        "tags": {"type": "array", "items": {"enum": ["sea", "sky", "land", "fire"]}, "minItems": 1, "maxItems": 3},
        "author": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 16},
                                                    "alive": {"type": "boolean"}},
                   "required": ["first", "alive"], "additionalProperties": False},
    },
    "required": ["title", "quote", "year", "rating", "tags", "author"],
    "additionalProperties": False,
}

c = common.Checks("structured")
with common.Server(ember, model, ctx=1024, parallel=2) as srv:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    model_id = client.models.list().data[0].id

    # The openai package's helper: the schema pydantic writes ($defs, $ref, enum, anyOf with null,
    # additionalProperties false), the reply parsed back into the model.
    for temperature in (0, 0.8):
        r = client.chat.completions.parse(
            model=model_id, temperature=temperature, seed=3, max_tokens=300, response_format=Person,
            messages=[{"role": "user", "content": "Describe a fictional person as JSON."}])
        msg = r.choices[0].message
        c.check(r.choices[0].finish_reason == "stop", f"parse finish {r.choices[0].finish_reason}: {msg.content!r}")
        c.check(isinstance(msg.parsed, Person), f"parsed into Person (temperature {temperature}): {msg.content!r}")

    # Raw json_schema, not streamed and streamed: the text validates; quotes and backslashes in
    # strings come escaped.
    rf = {"type": "json_schema", "json_schema": {"name": "poem", "schema": SCHEMA, "strict": True}}
    prompt = [{"role": "user", "content": 'A poem about the sea as JSON; quote it with "double quotes" and a \\ backslash.'}]
    for seed in range(3):
        r = client.chat.completions.create(model=model_id, temperature=1.0, seed=seed, max_tokens=300,
                                           response_format=rf, messages=prompt)
        text = r.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            ok = r.choices[0].finish_reason == "stop"
        except (ValueError, jsonschema.ValidationError) as e:
            ok = False
            text += f" ({e})"
        c.check(ok, f"json_schema seed {seed}: {text!r}")
    pieces = []
    for chunk in client.chat.completions.create(model=model_id, temperature=0.7, seed=9, max_tokens=300,
                                                response_format=rf, messages=prompt, stream=True):
        for ch in chunk.choices:
            if ch.delta.content:
                pieces.append(ch.delta.content)
    streamed = "".join(pieces)
    try:
        jsonschema.validate(json.loads(streamed), SCHEMA)
        ok = True
    except (ValueError, jsonschema.ValidationError) as e:
        ok = False
        streamed += f" ({e})"
    c.check(ok, f"streamed json_schema: {streamed!r}")

    # json_object: any object.
    r = client.chat.completions.create(model=model_id, temperature=0, max_tokens=300,
                                       response_format={"type": "json_object"}, messages=[
        {"role": "user", "content": 'Reply with a JSON object with two keys, "name" and "age", for a cat.'}])
    try:
        ok = isinstance(json.loads(r.choices[0].message.content), dict)
    except ValueError:
        ok = False
    c.check(ok, f"json_object: {r.choices[0].message.content!r}")

    # An unsupported feature is a 400 that names it; a malformed response_format too.
    for schema, word in (({"type": "string", "pattern": "^a+$"}, "pattern"),
                         ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}, "minimum")):
        try:
            client.chat.completions.create(model=model_id, max_tokens=5, messages=prompt, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
            c.check(False, f"{word}: accepted")
        except openai.BadRequestError as e:
            c.check(word in str(e) and e.body.get("param") == "response_format.json_schema.schema", f"{word}: {e}")
    status, body = common.post(srv.url + "/v1/chat/completions",
                               {"messages": prompt, "response_format": {"type": "xml"}})
    c.check(status == 400 and "xml" in body["error"]["message"], f"unknown type: {status} {body}")
    c.check(srv.alive(), "server alive")
c.done()
