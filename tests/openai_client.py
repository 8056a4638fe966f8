"""The official `openai` Python client, unchanged, against `edge-llm serve`.

Usage: python3 tests/openai_client.py BASE_URL [API_KEY]
Driven by tests/server.rs (`openai_python_client_works_unchanged`), which starts the server
and installs `openai` from PyPI into a virtual environment first. Prints one line per check
and exits non-zero on the first failure.
"""

import sys

import openai
from openai import OpenAI


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def main():
    base = sys.argv[1].rstrip("/")
    key = sys.argv[2] if len(sys.argv) > 2 else "none"
    client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)

    models = client.models.list()
    model = models.data[0].id
    check("models.list", len(models.data) == 1 and model, models)

    messages = [{"role": "user", "content": "Name one colour."}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    text = chat.choices[0].message.content
    check("chat.completions", isinstance(text, str) and len(text) > 0, chat)
    check("chat role", chat.choices[0].message.role == "assistant", chat)
    check("chat finish_reason", chat.choices[0].finish_reason in ("stop", "length"), chat)
    check("chat usage", chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 8, chat.usage)
    check(
        "chat usage cached_tokens",
        chat.usage.prompt_tokens_details is not None and isinstance(chat.usage.prompt_tokens_details.cached_tokens, int),
        chat.usage,
    )

    # The same request streamed gives the same greedy text, then a usage chunk.
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    parts, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("chat stream text == non-stream text", "".join(parts) == text, (parts, text))
    check("chat stream finish_reason", finish in ("stop", "length"), finish)
    check("chat stream include_usage", usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage)
    check("chat stream cached_tokens from the prefix cache", usage.prompt_tokens_details.cached_tokens > 0, usage)

    chat2 = client.chat.completions.create(
        model=model, messages=messages, max_completion_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    lp = chat2.choices[0].logprobs.content
    check("chat max_completion_tokens", chat2.usage.completion_tokens <= 4, chat2.usage)
    check("chat logprobs", len(lp) == chat2.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in lp), lp)

    prompt = "The capital of France is"
    comp = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    ctext = comp.choices[0].text
    check("completions", isinstance(ctext, str) and len(ctext) > 0, comp)
    check("completions usage", comp.usage.total_tokens == comp.usage.prompt_tokens + comp.usage.completion_tokens, comp.usage)

    parts = []
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True):
        for c in chunk.choices:
            parts.append(c.text)
    check("completions stream text == non-stream text", "".join(parts) == ctext, (parts, ctext))

    comp2 = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0.7, seed=3, n=2, logprobs=1)
    check("completions n=2", sorted(c.index for c in comp2.choices) == [0, 1], comp2)
    check("completions logprobs", all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) > 0 for c in comp2.choices), comp2)

    try:
        client.completions.create(model=model, prompt=prompt, max_tokens=10**6)
        check("max_tokens past the context is refused", False, "no error")
    except openai.BadRequestError as e:
        check("max_tokens past the context is refused", e.status_code == 400 and "context length" in str(e), e)

    try:
        client.chat.completions.create(model=model, messages=messages, temperature="hot")
        check("wrong field type is refused", False, "no error")
    except openai.BadRequestError as e:
        check("wrong field type is refused", e.status_code == 400 and "temperature" in str(e), e)

    if key != "none":
        bad = OpenAI(base_url=base + "/v1", api_key=key + "-wrong", max_retries=0, timeout=30)
        try:
            bad.models.list()
            check("a wrong API key is refused", False, "no error")
        except openai.AuthenticationError as e:
            check("a wrong API key is refused", e.status_code == 401, e)

    print("all openai client checks passed", flush=True)


if __name__ == "__main__":
    main()
