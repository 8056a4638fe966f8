"""gpt-oss's harmony through real clients, against `edge-llm serve` on the synthetic
target/synth/gpt-oss-o200k.gguf (real o200k vocabulary and chat template, random weights).

Usage: python3 tests/openai_harmony.py chat|responses|messages BASE_URL
Driven by tests/server_harmony.rs, which starts the server. `chat` and `responses` need the
`openai` and `jsonschema` packages (target/structured-venv), `messages` the `anthropic` one
(target/messages-venv). Prints one line per check; exits non-zero on the first failure.

The weights are random, so what is checked is the protocol: under `tool_choice` required or
named, the constraint makes the model write a harmony call whose arguments are valid under the
tool's schema, and the server hands it back as a tool call; the result goes back and renders in
the next prompt; streamed equals non-streamed (greedy); the analysis channel comes back as
reasoning. A logit bias on the token `analysis` (or `final`) steers the random model to the
reasoning (or answer) branch the grammar allows, since nothing else would.
"""

import json
import sys
import urllib.request

MODE, BASE = sys.argv[1], sys.argv[2].rstrip("/")
MODEL = "gpt-oss-o200k"
GREEDY = {"temperature": 0, "seed": 7}

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD_PARAMS = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 1000},
        "b": {"type": "integer", "minimum": 0, "maximum": 1000},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "add": ADD_PARAMS}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather.",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "add", "description": "Adds two integers.",
                                      "parameters": ADD_PARAMS}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def token_id(text):
    ids = post("/tokenize", {"content": text})["tokens"]
    check(f"{text!r} is one token", len(ids) == 1, ids)
    return ids[0]


def valid_call(name, arguments, what):
    import jsonschema
    check(f"{what}: a known function", name in SCHEMAS, name)
    try:
        args = json.loads(arguments)
    except ValueError as e:
        check(f"{what}: arguments are JSON", False, f"{arguments!r}: {e}")
    try:
        jsonschema.validate(args, SCHEMAS[name])
    except jsonschema.ValidationError as e:
        check(f"{what}: arguments valid under {name}'s schema", False, f"{args}: {e.message}")
    print(f"     {what}: {name}({arguments})", flush=True)
    return args


def chat():
    from openai import OpenAI
    client = OpenAI(base_url=BASE + "/v1", api_key="unused")
    analysis, final = token_id("analysis"), token_id("final")

    def both(**kw):
        """The non-streamed reply and the streamed one, joined: (message, finish_reason) each."""
        r = client.chat.completions.create(model=MODEL, **GREEDY, **kw)
        whole = r.choices[0]
        content, reasoning, calls, finish = "", "", {}, None
        for chunk in client.chat.completions.create(model=MODEL, stream=True, **GREEDY, **kw):
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            d = c.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            finish = c.finish_reason or finish
        streamed = {"content": content, "reasoning": reasoning,
                    "calls": [calls[i] for i in sorted(calls)], "finish": finish}
        m = whole.message
        joined = {"content": m.content or "",
                  "reasoning": (m.model_extra or {}).get("reasoning_content") or "",
                  "calls": [{"name": c.function.name, "arguments": c.function.arguments}
                            for c in m.tool_calls or []],
                  "finish": whole.finish_reason}
        check("streamed equals non-streamed", streamed == joined,
              f"\n  streamed {streamed}\n  whole    {joined}")
        return r, joined

    # tool_choice required: a call, valid arguments, nothing else.
    r, j = both(messages=ASK, tools=CHAT_TOOLS, tool_choice="required", max_tokens=200)
    check("required: finish_reason tool_calls", j["finish"] == "tool_calls", j)
    check("required: one call", len(j["calls"]) == 1, j)
    call = r.choices[0].message.tool_calls[0]
    valid_call(call.function.name, call.function.arguments, "required")
    check("required: a call id", bool(call.id), call)

    # A named function: that one.
    _, j = both(messages=ASK, tools=CHAT_TOOLS, max_tokens=200,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    check("named: the named function", [c["name"] for c in j["calls"]] == ["get_weather"], j)
    valid_call("get_weather", j["calls"][0]["arguments"], "named")

    # Reasoning first (the model steered to the analysis channel): reasoning_content, then
    # the call; the thoughts are bounded, so the call still comes.
    r2, j = both(messages=ASK, tools=CHAT_TOOLS, tool_choice="required", max_tokens=600,
                 logit_bias={str(analysis): 100})
    check("analysis: reasoning_content", len(j["reasoning"]) > 0, j)
    check("analysis: no markup in the reasoning", "<|" not in j["reasoning"], j["reasoning"][:200])
    check("analysis: then a call", j["finish"] == "tool_calls" and len(j["calls"]) == 1, j)
    valid_call(j["calls"][0]["name"], j["calls"][0]["arguments"], "after analysis")

    # auto: free to answer (steered to the final channel) or to call.
    _, j = both(messages=ASK, tools=CHAT_TOOLS, tool_choice="auto", max_tokens=24,
                logit_bias={str(final): 100})
    check("auto: an answer in content", len(j["content"]) > 0 and not j["calls"], j)
    check("auto: no markup in the answer", "<|" not in j["content"], j["content"])
    _, j = both(messages=ASK, tools=CHAT_TOOLS, tool_choice="auto", max_tokens=200)
    check("auto: a reply (answer or valid call)", j["content"] or j["calls"], j)
    for c in j["calls"]:
        valid_call(c["name"], c["arguments"], "auto")

    # The round trip: the call with its reasoning and the tool's result go back; the next
    # prompt renders them (llama-server's layout) and the model answers.
    m2 = r2.choices[0].message
    call = m2.tool_calls[0]
    result = json.dumps({"ok": True, "value": 21})
    turn = ASK + [
        {"role": "assistant", "content": None,
         "reasoning_content": (m2.model_extra or {}).get("reasoning_content"),
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name,
                                      "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    prompt = post("/apply-template", {"messages": turn, "tools": CHAT_TOOLS})["prompt"]
    want_call = (f"<|start|>assistant to=functions.{call.function.name}<|channel|>commentary "
                 f"json<|message|>")
    check("round trip: the call renders", want_call in prompt, prompt[-600:])
    check("round trip: its reasoning renders",
          "<|channel|>analysis<|message|>" in prompt.split("<|start|>user")[-1], prompt[-600:])
    want_result = (f"<|start|>functions.{call.function.name} to=assistant<|channel|>commentary"
                   f"<|message|>{json.dumps(result)}<|end|><|start|>assistant")
    check("round trip: the result renders", prompt.endswith(want_result), prompt[-400:])
    r3, j = both(messages=turn, tools=CHAT_TOOLS, tool_choice="auto", max_tokens=24,
                 logit_bias={str(final): 100})
    check("round trip: the model answers", len(j["content"]) > 0, j)
    check("round trip: the prompt grew", r3.usage.prompt_tokens > r2.usage.prompt_tokens,
          (r3.usage, r2.usage))

    # reasoning_effort reaches the template (the prompt says so).
    for effort in ("low", "high"):
        p = post("/apply-template", {"messages": ASK, "reasoning_effort": effort})["prompt"]
        check(f"reasoning_effort {effort} in the prompt", f"Reasoning: {effort}" in p, p[:300])
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2,
                                       reasoning_effort="high", **GREEDY)
    check("reasoning_effort accepted by the client", r.choices[0].finish_reason == "length", r)


def responses():
    from openai import OpenAI
    client = OpenAI(base_url=BASE + "/v1", api_key="unused")
    analysis = token_id("analysis")
    tools = [{"type": "function", "name": t["function"]["name"],
              "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in CHAT_TOOLS]
    body = dict(model=MODEL, input="What is the weather in Paris?", tools=tools,
                tool_choice="required", max_output_tokens=600, temperature=0,
                reasoning={"effort": "high"}, extra_body={"logit_bias": {str(analysis): 100},
                                                          "seed": 7})
    r = client.responses.create(**body)
    kinds = [o.type for o in r.output]
    check("responses: a reasoning item then a function_call", kinds == ["reasoning", "function_call"],
          kinds)
    fc = r.output[1]
    valid_call(fc.name, fc.arguments, "responses")
    reasoning_text = "".join(c.text for c in (r.output[0].content or []))
    check("responses: reasoning text", len(reasoning_text) > 0, r.output[0])
    # Streamed: the same items.
    items = []
    with client.responses.stream(**body) as s:
        for ev in s:
            if ev.type == "response.output_item.done":
                items.append(ev.item)
        final = s.get_final_response()
    check("responses stream: same items", [i.type for i in items] == kinds, [i.type for i in items])
    check("responses stream: same call", (items[1].name, items[1].arguments) == (fc.name, fc.arguments),
          (items[1], fc))
    check("responses stream: final response", final.output[1].arguments == fc.arguments, final)
    # The result goes back: the next turn renders it and answers.
    r2 = client.responses.create(
        model=MODEL, tools=tools, max_output_tokens=16, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": fc.call_id, "name": fc.name,
                "arguments": fc.arguments},
               {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 C"}],
        extra_body={"logit_bias": {str(token_id("final")): 100}})
    check("responses: an answer after the result", r2.output_text != "", r2.output)
    check("responses: the result was in the prompt",
          r2.usage.input_tokens > r.usage.input_tokens, (r2.usage, r.usage))


def messages():
    import anthropic
    import jsonschema
    client = anthropic.Anthropic(base_url=BASE, api_key="unused")
    analysis = token_id("analysis")
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in CHAT_TOOLS]
    extra = {"temperature": 0, "seed": 7, "logit_bias": {str(analysis): 100}}
    m = client.messages.create(model=MODEL, max_tokens=600, tools=tools, messages=ASK,
                               tool_choice={"type": "any"}, extra_body=extra)
    kinds = [b.type for b in m.content]
    check("messages: a thinking block then a tool_use", kinds == ["thinking", "tool_use"], kinds)
    check("messages: stop_reason tool_use", m.stop_reason == "tool_use", m.stop_reason)
    use = m.content[1]
    check("messages: a known tool", use.name in SCHEMAS, use.name)
    jsonschema.validate(use.input, SCHEMAS[use.name])
    print(f"     messages: {use.name}({json.dumps(use.input)})", flush=True)
    with client.messages.stream(model=MODEL, max_tokens=600, tools=tools, messages=ASK,
                                tool_choice={"type": "any"}, extra_body=extra) as s:
        streamed = s.get_final_message()
    check("messages stream: same blocks", [b.type for b in streamed.content] == kinds,
          streamed.content)
    check("messages stream: same thinking", streamed.content[0].thinking == m.content[0].thinking)
    check("messages stream: same call",
          (streamed.content[1].name, streamed.content[1].input) == (use.name, use.input))
    m2 = client.messages.create(
        model=MODEL, max_tokens=16, tools=tools,
        messages=ASK + [{"role": "assistant", "content": [
            {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}],
        extra_body={"temperature": 0, "logit_bias": {str(token_id("final")): 100}})
    check("messages: an answer after the result", m2.content and m2.content[0].type == "text",
          m2.content)


{"chat": chat, "responses": responses, "messages": messages}[MODE]()
print("all harmony checks passed", flush=True)
