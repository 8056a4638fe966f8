"""The Messages API through the official `anthropic` Python client.

Usage: python3 tests/anthropic_client.py BASE_URL API_KEY   (Qwen2.5 Coder 0.5B)
Driven by tests/server_messages.rs, which starts the server and installs `anthropic` into a
virtual environment first. Prints one line per check and exits non-zero on the first failure.
The package has no `temperature` argument: it goes in `extra_body`.
"""

import json
import sys

import urllib.request

import anthropic
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


base, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
GREEDY = {"temperature": 0}
MODEL = "claude-any-name"  # served by the loaded model
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]

# Plain.
hello = [{"role": "user", "content": "Say hello in one short sentence."}]
m = client.messages.create(model=MODEL, max_tokens=24, messages=hello, extra_body=GREEDY)
check("create: a text block", m.content and m.content[0].type == "text" and m.content[0].text, m)
check("create: stop_reason", m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason)
prompt = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
check("create: usage", prompt > 0 and m.usage.output_tokens > 0, m.usage)

# count_tokens equals the prompt the generation reported.
n = client.messages.count_tokens(model=MODEL, messages=hello)
check("count_tokens equals the generation's prompt", n.input_tokens == prompt, (n, m.usage))

# Streamed text: the helper's final message equals the whole reply at temperature 0.
with client.messages.stream(
    model=MODEL, max_tokens=24, messages=hello, extra_body=GREEDY
) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("stream: text equals create's", streamed == m.content[0].text, (streamed, m.content))
check("stream: final message", final.content[0].text == streamed, final)

# Every raw event parses with the package's own event types (no unknown type).
adapter = TypeAdapter(RawMessageStreamEvent)


def raw_events(body):
    req = urllib.request.Request(
        f"{base}/v1/messages?beta=true",
        data=json.dumps(dict(body, stream=True)).encode(),
        headers={"x-api-key": key, "anthropic-version": "2023-06-01",
                 "anthropic-beta": "interleaved-thinking-2025-05-14",
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        check("raw stream: 200", r.status == 200, r.status)
        text = r.read().decode()
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        check(f"raw stream: event name {lines['event']}", lines["event"] == data["type"], block)
        if data["type"] == "ping":
            continue
        events.append(adapter.validate_python(data))
    return events


types = [e.type for e in raw_events({"model": MODEL, "max_tokens": 16, "messages": hello, **GREEDY})]
check("raw stream: order", types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"], types)

tool_body = {"model": MODEL, "max_tokens": 60, "messages": ASK, "tools": [WEATHER],
             "tool_choice": {"type": "any"}, **GREEDY}
events = raw_events(tool_body)
starts = [e for e in events if e.type == "content_block_start"]
check("raw stream: a tool_use block", any(e.content_block.type == "tool_use" for e in starts), events)
check("raw stream: input_json_delta", any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events), events)

# Streamed tool use through the helper, then the round trip.
with client.messages.stream(
    model=MODEL, max_tokens=60, messages=ASK, tools=[WEATHER],
    tool_choice={"type": "any"}, extra_body=GREEDY,
) as s:
    call_msg = s.get_final_message()
calls = [b for b in call_msg.content if b.type == "tool_use"]
check("stream: tool_use", call_msg.stop_reason == "tool_use" and calls, call_msg)
check("stream: tool input", calls[0].name == "get_weather" and isinstance(calls[0].input.get("city"), str), calls)
whole = client.messages.create(
    model=MODEL, max_tokens=60, messages=ASK, tools=[WEATHER],
    tool_choice={"type": "any"}, extra_body=GREEDY,
)
check("create: the same calls", [b.input for b in whole.content if b.type == "tool_use"] == [c.input for c in calls], whole)
answer = client.messages.create(
    model=MODEL, max_tokens=40, tools=[WEATHER], extra_body=GREEDY,
    messages=ASK + [
        {"role": "assistant", "content": [c.model_dump() for c in call_msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                      "content": "Sunny, 24 degrees Celsius."}]},
    ],
)
text = "".join(b.text for b in answer.content if b.type == "text")
check("tool round trip: an answer", answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and (text or answer.stop_reason == "tool_use"), answer)
print(f"answer after the tool: {text!r}")

# Errors come back as the package's own exceptions.
try:
    client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    check("image refused", False)
except anthropic.BadRequestError as e:
    check("image refused", "messages[0].content[0]" in str(e) and e.body["error"]["type"] == "invalid_request_error", e.body)
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
        model=MODEL, max_tokens=10, messages=hello)
    check("wrong key refused", False)
except anthropic.AuthenticationError as e:
    check("wrong key refused", e.body["error"]["type"] == "authentication_error", e.body)
print("all anthropic checks passed")
