"""Structured output and tool calls through the official `openai` Python client.

Usage: python3 tests/openai_structured.py schemas BASE_URL   (the default model)
       python3 tests/openai_structured.py tools BASE_URL     (Qwen2.5 Coder 0.5B)
Driven by tests/server_structured.rs, which starts the servers and installs `openai` and
`jsonschema` into a virtual environment first. Prints one line per check and exits non-zero on
the first failure.
"""

import json
import sys

import jsonschema
from openai import OpenAI


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def obj(props, required=None):
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


STR = {"type": "string", "maxLength": 40}
# (prompt, schema): objects, arrays, enums, nesting, required fields, string patterns.
CASES = [
    ("Describe a person.", obj({"name": STR, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("Name a colour.", obj({"colour": {"enum": ["red", "green", "blue"]}})),
    ("List three fruits.", obj({"fruits": {"type": "array", "items": STR, "minItems": 3, "maxItems": 3}})),
    ("Give a US phone number.", obj({"phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{3}-[0-9]{4}$"}})),
    ("Describe a book.", obj({"title": STR, "author": obj({"first": STR, "last": STR}), "year": {"type": "integer", "minimum": 0, "maximum": 2100}})),
    ("Is the sky blue?", obj({"answer": {"type": "boolean"}, "reason": STR})),
    ("Give a date.", obj({"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}})),
    ("Describe a city.", obj({"city": STR, "country": STR, "population": {"type": "integer", "minimum": 0, "maximum": 100000000}})),
    ("Rate a movie.", obj({"movie": STR, "stars": {"type": "integer", "minimum": 1, "maximum": 5}})),
    ("Give a temperature.", obj({"value": {"type": "integer", "minimum": -100, "maximum": 100}, "unit": {"enum": ["C", "F", "K"]}})),
    ("List two animals with their legs.", obj({"animals": {"type": "array", "maxItems": 4, "items": obj({"name": STR, "legs": {"type": "integer", "minimum": 0, "maximum": 100}})}})),
    ("Give an email address.", obj({"email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.(com|org)$"}})),
    ("Describe a car.", obj({"make": STR, "model": STR, "electric": {"type": "boolean"}}, ["make", "electric"])),
    ("Pick a weekday.", obj({"day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]}})),
    ("Give a point in 3D.", obj({"point": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 3, "maxItems": 3}})),
    ("Describe a pet.", obj({"pet": obj({"kind": {"enum": ["cat", "dog", "fish"]}, "name": STR})})),
    ("Give a product code.", obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "in_stock": {"type": "boolean"}})),
    ("Summarise a meeting.", obj({"topic": STR, "attendees": {"type": "array", "items": STR, "maxItems": 3}, "minutes": {"type": "integer", "minimum": 1, "maximum": 600}})),
    ("Give a hex colour.", obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})),
    ("Describe a student.", obj({"student": obj({"name": STR, "grades": {"type": "array", "items": {"enum": ["A", "B", "C"]}, "maxItems": 4}}), "passed": {"type": "boolean"}})),
]


def schemas(client, model):
    for i, (prompt, schema) in enumerate(CASES):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_schema", "json_schema": {"name": f"case{i}", "schema": schema, "strict": True}},
            temperature=0,
            max_tokens=200,
        )
        text = r.choices[0].message.content
        try:
            value = json.loads(text)
            jsonschema.validate(value, schema)
            ok, detail = True, ""
        except Exception as e:  # noqa: BLE001 - the check prints what failed
            ok, detail = False, f"{e}: {text!r}"
        check(f"json_schema {i} ({prompt})", ok and r.choices[0].finish_reason == "stop", detail or r)
    finished = 0
    for i, prompt in enumerate(["Describe a dog as JSON.", "Give me JSON about Paris.", "A JSON list of tasks.", "JSON please.", "Say hello in JSON."]):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_object"},
            temperature=0.7,
            seed=i,
            max_tokens=300,
        )
        text = r.choices[0].message.content
        # A sampled small model may ramble past max_tokens inside a valid object: the grammar
        # cannot end it. A finished reply must parse; a cut one must still be an object's start.
        if r.choices[0].finish_reason == "stop":
            try:
                ok = isinstance(json.loads(text), dict)
            except ValueError:
                ok = False
            finished += 1
        else:
            ok = r.choices[0].finish_reason == "length" and text.lstrip().startswith("{")
        check(f"json_object {i}", ok, repr(text))
    check("json_object: most replies finish", finished >= 3, f"{finished} of 5")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def valid_call(call):
    try:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        return True
    except Exception:  # noqa: BLE001
        return False


def streamed(client, **kw):
    """Content, calls ({index: [id, name, arguments]}) and finish reason of a streamed reply."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        if c.delta.content:
            content += c.delta.content
        for tc in c.delta.tool_calls or []:
            entry = calls.setdefault(tc.index, [None, None, ""])
            if tc.id:
                check("a call's id comes once", entry[0] is None, tc)
                entry[0] = tc.id
            if tc.function and tc.function.name:
                check("a call's name comes once", entry[1] is None, tc)
                entry[1] = tc.function.name
            if tc.function and tc.function.arguments:
                entry[2] += tc.function.arguments
        if c.finish_reason:
            finish = c.finish_reason
    return content, calls, finish


def tools(client, model):
    user = {"role": "user", "content": "What is the weather in Paris?"}
    base = dict(model=model, tools=TOOLS, temperature=0, max_tokens=120)
    # required and a named function always give a valid call.
    for i, q in enumerate(["What is the weather in Paris?", "Hello!", "Tell me a joke.", "What time is it in Tokyo?"]):
        msgs = [{"role": "user", "content": q}]
        r = client.chat.completions.create(messages=msgs, tool_choice="required", parallel_tool_calls=False, **base)
        calls = r.choices[0].message.tool_calls or []
        check(f"required {i}", len(calls) == 1 and valid_call(calls[0]) and r.choices[0].finish_reason == "tool_calls", r)
        r = client.chat.completions.create(messages=msgs, tool_choice={"type": "function", "function": {"name": "get_time"}}, **base)
        calls = r.choices[0].message.tool_calls or []
        check(f"named {i}", len(calls) >= 1 and all(c.function.name == "get_time" and valid_call(c) for c in calls), r)
    # Streamed deltas reassemble to exactly the non-streamed call at temperature 0.
    kw = dict(messages=[user], tool_choice="required", **base)
    whole = client.chat.completions.create(**kw).choices[0]
    content, calls, finish = streamed(client, **kw)
    want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    got = [(calls[i][1], calls[i][2]) for i in sorted(calls)]
    check("stream reassembles the call", got == want and finish == "tool_calls", f"{got} != {want}")
    check("streamed ids", all(calls[i][0] for i in calls), calls)
    # Parallel calls where the prompt asks for several.
    ask = {"role": "user", "content": "Get the weather in Paris and the weather in London."}
    r = client.chat.completions.create(messages=[ask], tool_choice="required", parallel_tool_calls=True, **base)
    calls = r.choices[0].message.tool_calls or []
    check("parallel calls", len(calls) >= 2 and all(valid_call(c) for c in calls), r)
    # A full round trip: the call, the tool's result, the final answer; not streamed and streamed.
    first = client.chat.completions.create(messages=[user], tool_choice="required", parallel_tool_calls=False, **base)
    call = first.choices[0].message.tool_calls[0]
    system = {"role": "system", "content": "You are a helpful assistant. Answer the user in one sentence using the tool results."}
    history = [
        system,
        user,
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "It is 21 degrees Celsius and sunny in Paris."},
    ]
    # The final answer: `none` asks for text (the 0.5B model, offered tools, keeps calling them).
    final = client.chat.completions.create(messages=history, tool_choice="none", **base)
    answer = final.choices[0].message.content or ""
    check("round trip answer", not final.choices[0].message.tool_calls and "21" in answer, final)
    content, calls, finish = streamed(client, messages=history, tool_choice="none", **base)
    check("round trip answer streamed", content == answer and not calls and finish == "stop", repr(content))
    # The prompt the template renders carries the tools, the call and its result.
    none = client.chat.completions.create(messages=[ask], tool_choice="none", **base)
    check("tool_choice none gives text", not none.choices[0].message.tool_calls and none.choices[0].message.content, none)


def main():
    what, base = sys.argv[1], sys.argv[2].rstrip("/")
    client = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    {"schemas": schemas, "tools": tools}[what](client, model)
    print(f"all {what} checks passed", flush=True)


if __name__ == "__main__":
    main()
