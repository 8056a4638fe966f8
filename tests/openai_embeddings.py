"""The real `openai` client against `edge-llm serve`: embeddings.create with one input and with
a batch (the client asks for base64 by default and decodes it), and with encoding_format
"float". Prints one JSON object: {"single": [...], "batch": [[...], ...], "float": [...],
"usage": {...}}; tests/embeddings.rs compares it with the server's raw answers.

    python tests/openai_embeddings.py http://127.0.0.1:PORT "text" "text2" ...
"""
import json
import sys

import openai

base, texts = sys.argv[1], sys.argv[2:]
client = openai.OpenAI(base_url=base + "/v1", api_key="none")
single = client.embeddings.create(model="any", input=texts[0])
batch = client.embeddings.create(model="any", input=texts)
floats = client.embeddings.create(model="any", input=texts[0], encoding_format="float")
assert [d.index for d in batch.data] == list(range(len(texts))), batch
print(json.dumps({
    "single": list(single.data[0].embedding),
    "batch": [list(d.embedding) for d in batch.data],
    "float": list(floats.data[0].embedding),
    "usage": {"prompt_tokens": batch.usage.prompt_tokens, "total_tokens": batch.usage.total_tokens},
}))
