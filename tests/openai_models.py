"""The official `openai` Python client against `edge-llm serve` with several models.

Usage: python3 tests/openai_models.py BASE_URL MODEL_ID...
Driven by tests/server_models.rs. Lists the models, then asks each prompt of PROMPTS of every
model in turn (model A, B, C, A, B, C...), greedy, through one client, and prints one JSON
object: {"listed": [ids], "answers": {model: [text per prompt]}}. Exits non-zero on a failure.
"""

import json
import sys

from openai import OpenAI

PROMPTS = ["Name one colour.", "Write a haiku about the sea."]


def main():
    base, models = sys.argv[1].rstrip("/"), sys.argv[2:]
    client = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    listed = [m.id for m in client.models.list().data]
    answers = {m: [] for m in models}
    for prompt in PROMPTS:
        for model in models:
            chat = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=16,
                temperature=0,
            )
            if chat.model != model:
                print(f"FAIL asked {model}, answered by {chat.model}", file=sys.stderr)
                sys.exit(1)
            answers[model].append(chat.choices[0].message.content)
    print(json.dumps({"listed": listed, "answers": answers}))


if __name__ == "__main__":
    main()
