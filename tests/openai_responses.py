"""The Responses API through the official `openai` Python client and the openai-agents SDK.

Usage: python3 tests/openai_responses.py BASE_URL client   (Qwen2.5 Coder 0.5B behind BASE_URL)
       python3 tests/openai_responses.py BASE_URL agent    (Qwen2.5 Coder 1.5B: the 0.5B calls
                                                            its tool again after every result)
Driven by tests/server_responses.rs, which starts the server; scripts/test.sh installs `openai`,
`openai-agents` and `jsonschema` into target/structured-venv. Prints one line per check and
exits non-zero on the first failure. The model is small: the checks are about the protocol
(events parse with the package's own types, calls carry valid arguments), not the answers.
"""

import json
import sys

import urllib.request
import jsonschema
import openai
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

BASE = sys.argv[1].rstrip("/") + "/v1"
MODE = sys.argv[2] if len(sys.argv) > 2 else "client"
MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m" if MODE == "client" else "qwen2.5-coder-1.5b-instruct-q4_k_m"
client = OpenAI(base_url=BASE, api_key="unused")
EVENTS = TypeAdapter(ResponseStreamEvent)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def raw_events(body):
    """Every event of a streamed response, parsed strictly by the package's event union."""
    events = []
    req = urllib.request.Request(BASE + "/responses", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if r.status != 200:
            check("stream status", False, r.status)
        kind = None
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                if data["type"] != kind:
                    check(f"event name {kind}", False, data)
                # Raises on an unknown `type` or a missing field.
                events.append(EVENTS.validate_python(data))
    return events


def plain():
    r = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0)
    check("plain: a response", r.object == "response" and r.id.startswith("resp_"), r)
    check("plain: text", len(r.output_text) > 0, r)
    check("plain: usage", r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage)
    return r


def streamed(whole):
    body = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 16, "temperature": 0, "stream": True}
    events = raw_events(body)
    types = [e.type for e in events]
    check("stream: opens", types[:2] == ["response.created", "response.in_progress"], types)
    check("stream: ends", types[-1] in ("response.completed", "response.incomplete"), types)
    seq = [e.sequence_number for e in events]
    check("stream: sequence numbers", seq == list(range(len(seq))), seq)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    check("stream: deltas join to done", done == [deltas], (deltas, done))
    check("stream: equals the whole response", deltas == whole.output_text, (deltas, whole.output_text))
    final = events[-1].response
    check("stream: final carries id and usage", final.id and final.usage.output_tokens > 0, final)
    # The SDK's own stream helper accumulates the same events.
    with client.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0) as s:
        for _ in s:
            pass
        r = s.get_final_response()
    check("stream helper: final text", r.output_text == whole.output_text, r.output_text)


def tool_round_trip():
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model=MODEL, input=question, tools=[WEATHER], tool_choice="required", temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    check("tools: a function_call", len(calls) >= 1, r.output)
    args = json.loads(calls[0].arguments)
    check("tools: valid arguments", calls[0].name == "get_weather" and isinstance(args.get("city"), str), args)
    # Stateless round trip: the call and its output fed back as items.
    follow = question + [c.model_dump(exclude_none=True) for c in calls]
    follow += [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 C"} for c in calls]
    r2 = client.responses.create(model=MODEL, input=follow, tools=[WEATHER], tool_choice="none", temperature=0, max_output_tokens=40)
    check("tools: final answer", len(r2.output_text) > 0 and all(o.type == "message" for o in r2.output), r2.output)
    # Streamed: the call comes in output_item.done, arguments streamed and whole.
    events = raw_events({"model": MODEL, "input": question, "tools": [WEATHER], "tool_choice": "required", "temperature": 0, "stream": True})
    items = [e.item for e in events if e.type == "response.output_item.done"]
    check("tools stream: call in output_item.done", items and items[0].type == "function_call", items)
    streamed_args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.item_id == items[0].id)
    check("tools stream: deltas join to the call", streamed_args == items[0].arguments == calls[0].arguments, (streamed_args, items[0]))


def custom_tool():
    shout = {"type": "custom", "name": "shout", "description": "Shouts its input."}
    body = {"model": MODEL, "input": "Shout the word hello.", "tools": [shout, {"type": "web_search"}],
            "tool_choice": {"type": "custom", "name": "shout"}, "temperature": 0, "max_output_tokens": 40}
    r = client.responses.create(**{k: v for k, v in body.items()})
    check("custom tool: a custom_tool_call", r.output and r.output[0].type == "custom_tool_call", r.output)
    events = raw_events({**body, "stream": True})
    done = [e.input for e in events if e.type == "response.custom_tool_call_input.done"]
    inputs = [o.input for o in r.output if o.type == "custom_tool_call"]
    check("custom tool stream: input events equal the whole response's calls", done == inputs, (done, r.output))
    items = [e.item for e in events if e.type == "response.output_item.done"]
    check("custom tool stream: call in output_item.done", items[0].type == "custom_tool_call" and items[0].input == done[0], items)


def previous_response():
    r1 = client.responses.create(model=MODEL, input="My name is Alice. Reply with OK.", max_output_tokens=8, temperature=0)
    r2 = client.responses.create(model=MODEL, previous_response_id=r1.id, input="What is my name?", max_output_tokens=16, temperature=0)
    check("previous: conversation prepended", r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens, (r1.usage, r2.usage))
    check("previous: retrieve", client.responses.retrieve(r1.id).id == r1.id)
    deleted = client.responses.delete(r1.id)
    check("previous: delete", deleted is None or getattr(deleted, "deleted", True))
    try:
        client.responses.retrieve(r1.id)
        check("previous: deleted is gone", False, "retrieve after delete succeeded")
    except openai.NotFoundError:
        check("previous: deleted is gone", True)
    try:
        client.responses.create(model=MODEL, previous_response_id="resp_nope", input="hi", max_output_tokens=4)
        check("previous: unknown id refused", False, "accepted")
    except openai.NotFoundError as e:
        check("previous: unknown id refused", e.param == "previous_response_id" and "previous_response_id" in e.message, e.body)


class City(BaseModel):
    name: str
    country: str


def json_schema():
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
              "required": ["name", "country"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Describe a city as JSON.", temperature=0, max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    check("text.format json_schema: complete", r.status == "completed", r.output_text)
    jsonschema.validate(json.loads(r.output_text), schema)
    check("text.format json_schema: valid JSON", True)
    parsed = client.responses.parse(model=MODEL, input="Name a city and its country.", text_format=City, temperature=0, max_output_tokens=60)
    check("responses.parse: output_parsed", isinstance(parsed.output_parsed, City), parsed.output_text)


def agent():
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    cities = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return f"Sunny, 21 C in {city}"

    model = OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(base_url=BASE, api_key="unused"))
    # The SDK's defaults: tool_choice auto, parallel calls allowed.
    weather = Agent(name="weather", tools=[get_weather], model=model,
                    instructions="You can call get_weather to look up the weather. After you get the result, "
                                 "reply to the user in one sentence.",
                    model_settings=ModelSettings(temperature=0, max_tokens=256))
    result = Runner.run_sync(weather, "What is the weather in Paris?", max_turns=4)
    check("agents: the tool ran once with the city", cities == ["Paris"], cities)
    check("agents: final output", isinstance(result.final_output, str) and "21" in result.final_output, result.final_output)
    print(f"agent answered {result.final_output!r} after calls {cities}")


if MODE == "agent":
    agent()
else:
    whole = plain()
    streamed(whole)
    tool_round_trip()
    custom_tool()
    previous_response()
    json_schema()
print("all responses checks passed")
