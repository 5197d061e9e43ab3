#!/usr/bin/env python3
"""Reference renderings for Ember's Jinja engine (tests/test_jinja.cpp), by Jinja2 (PyPI) set up
as Hugging Face's transformers renders chat templates: an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls, a tojson that is json.dumps (non-ASCII kept),
raise_exception. Two parts:
  features: small templates, one or a few features each, with their context;
  models:   every template in tests/data/chat_templates/ on a set of conversations (tools and
            tool calls included), or the error it raises.

  .venv/bin/pip install jinja2 && .venv/bin/python scripts/jinja_refs.py > tests/data/jinja_refs.json
"""
import glob
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

FEATURES = [
    ("text_and_expr", "Hello {{ name }}!", {"name": "World"}),
    ("whitespace_control", "a  {{- ' b ' -}}  c\n{%- if true %}  d{% endif -%}\n e", {}),
    ("trim_and_lstrip_blocks", "<ul>\n  {% for x in xs %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n", {"xs": [1, 2]}),
    ("plus_disables_lstrip", "a\n  {%+ if true %}b{% endif %}\n", {}),
    ("comments", "a{# note #}b\n  {# alone #}\nc{#- x -#}  d", {}),
    ("raw", "{% raw %}{{ not parsed }}{% endraw %}!", {}),
    ("if_elif_else", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('x', 'y') }};{% endfor %}", {}),
    ("for_else_and_filter", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in range(10) if x is odd %}{{ x }}{% endfor %}", {}),
    ("for_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope_and_namespace", "{% set x = 1 %}{% set ns = namespace(y=1) %}{% for i in range(3) %}{% set x = x + 1 %}"
     "{% set ns.y = ns.y + 1 %}{% endfor %}{{ x }} {{ ns.y }}", {}),
    ("set_block_and_tuple", "{% set a, b = 1, 2 %}{% set s %}[{{ a + b }}]{% endset %}{{ s }}{{ s | length }}", {}),
    ("macro_defaults_kwargs", "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, c=3) }}", {}),
    ("macro_sees_top_level", "{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{% for i in [1] %}{% set g = 'L' %}{{ m() }}{% endfor %}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'you' }}{% endfilter %}", {}),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2.5 }} {{ 3 * 'ab' }} "
     "{{ 10 - 2 * 3 }} {{ (1 + 2) * 3 }} {{ -3 }} {{ 6 / 3 }}", {}),
    ("comparisons_and_logic", "{{ 1 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }} {{ 'x' in 'xyz' }} {{ 3 not in [1, 2] }} "
     "{{ 'k' in {'k': 1} }} {{ none or 'd' }} {{ 0 and 1 }} {{ not '' }}", {}),
    ("concat_and_conditional", "{{ 'a' ~ 1 ~ none ~ true }} {{ 'yes' if x else 'no' }} [{{ 'only' if false }}]", {"x": [0]}),
    ("literals_and_printing", "{{ [1, 'a', none, true, 1.5, {'k': [2]}] }} {{ (1, 2) }} {{ (1,) }} {{ 1e-5 }} {{ 100.0 }} {{ 1e20 }} "
     "{{ \"it's\" }} {{ 'a\\nb' }} {{ '\\u00e9\\x41' }}", {}),
    ("attributes_and_items", "{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ xs[0] }} {{ xs[-1] }} {{ xs[9] }}|{{ d.get('a') }} "
     "{{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ xs.0 }}", {"m": {"role": "user", "content": "hi"}, "xs": [1, 2, 3], "d": {"a": 1}}),
    ("slicing", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ s[1:3] }} {{ s[::-1] }} {{ xs[5:] }} {{ s[-2:] }}",
     {"xs": [1, 2, 3, 4], "s": "héllo"}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|"
     "{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}|"
     "{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'abcabc'.find('c') }}|"
     "{{ 'abc'.upper() }}{{ 'ABC'.lower() }}|{{ '-'.join(['a', 'b']) }}|{{ '{} and {}'.format(1, 'x') }}|{{ 'a\\nb'.splitlines() }}|"
     "{{ '12'.isdigit() }}|{{ 'a</think>b'.split('</think>')[-1].lstrip('\\n') }}", {"s": "  pad  "}),
    ("tests", "{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} "
     "{{ 1.0 is float }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 4 is even }} {{ 3 is odd }} "
     "{{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ x is not none }} {{ true is true }} {{ 'ab' is lower }} {{ 2 is gt(1) }} "
     "{{ 'a' is in 'abc' }} {{ x is sameas 1 }}", {"x": 1}),
    ("filters_strings", "{{ '  a  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ 'a b' | title }}|"
     "{{ 'aB' | capitalize }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'x' | length }}{{ 'héllo' | count }}|"
     "{{ 'one two  three' | wordcount }}|{{ '<&>' | e }}{{ '\"x' | escape }}{{ '<b>' | safe }}|{{ 1 | string }}{{ none | string }}", {}),
    ("filters_defaults", "{{ missing | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ x | d('no') }}|"
     "{{ none | default('n') }}", {"x": 0}),
    ("filters_lists", "{{ xs | first }} {{ xs | last }} {{ xs | length }} {{ xs | join(', ') }} {{ xs | reverse | list }} {{ xs | sort }} "
     "{{ xs | sort(reverse=true) }} {{ xs | max }} {{ xs | min }} {{ xs | sum }} {{ [1, 1, 2] | unique | list }} {{ 'ab' | list }} "
     "{{ xs | map('string') | join }}", {"xs": [3, 1, 2]}),
    ("filters_select", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} "
     "{{ ms | rejectattr('role', 'eq', 'user') | list | length }} {{ [1, 2, 3, 4] | select('even') | list }} "
     "{{ [0, 1, none, 'a'] | select | list }} {{ ['a', 'b'] | reject('in', 'a') | list }} {{ ms | map(attribute='role') | unique | list }} "
     "{{ ms | selectattr('tool_calls', 'defined') | list | length }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("filters_numbers", "{{ -3 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 2.5 | round(0, 'floor') }} "
     "{{ '42' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '1.5' | float }} {{ 2 | float }}", {}),
    ("tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n\\u0001' | tojson }}|{{ [] | tojson(indent=4) }}|"
     "{{ d | tojson(sort_keys=true) }}|{{ 1.0 | tojson }}|{{ none | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}",
     {"d": {"b": [1, 2.5, True, None], "a": {"x": "y"}, "e": {}}}),
    ("indent", "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}", {}),
    ("items_dictsort_attr", "{{ d | items | list }} {{ d | dictsort }} {{ m | attr('role') }}", {"d": {"b": 1, "A": 2}, "m": {"role": "r"}}),
    ("range_forms", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }}", {}),
    ("string_concat_literal", "{{ 'a' 'b' }} {{ \"x\" + 'y' }}", {}),
    ("nested_dict_literal_in_tag", "{{ {'a': {'b': 1}} }}", {}),
    ("is_not_and_or_precedence", "{{ not x is defined }} {{ x is defined and y is not defined }} {{ 1 if x is none else 2 }}", {"x": None}),
    ("trailing_newline_dropped", "line\n", {}),
]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                    "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
     "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]
CHATS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    "multi": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
              {"role": "user", "content": "  And 3+3?  "}],
    "unicode": [{"role": "user", "content": "Ça va? 日本語 \"quotes\" and 'single' \\ back"}],
    "tools": [{"role": "user", "content": "Weather in Paris?"}],
    "toolcall": [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                 {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21.5}"}],
}


def render(src, ctx):
    try:
        return {"expected": env.from_string(src).render(**ctx)}
    except jinja2.exceptions.TemplateError as e:
        return {"raises": str(e)}


def main():
    out = {"jinja2_version": jinja2.__version__, "features": [], "models": []}
    for name, src, ctx in FEATURES:
        out["features"].append({"name": name, "template": src, "context": ctx, **render(src, ctx)})
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/data/chat_templates/*.jinja"))):
        with open(path) as f:
            src = f.read()
        for chat, msgs in CHATS.items():
            for gen in (True, False):
                ctx = {"messages": msgs, "add_generation_prompt": gen, "bos_token": "<s>", "eos_token": "</s>",
                       "date_string": "26 Jul 2024"}
                if chat.startswith("tool"):
                    ctx["tools"] = TOOLS
                out["models"].append({"template": os.path.basename(path), "chat": chat, "context": ctx, **render(src, ctx)})
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
