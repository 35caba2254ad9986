"""The flags of the `radixgen serve` processes that several test modules share.

tests/conftest.py starts each shared server on first use and stops it when the session ends: a
tiny server takes 5-8 s to start on 2 cores, more than most of its modules' tests together. A
server is shared by modules whose assertions hold under the union of their flags; one that a
test kills (test_server_faults' crash test, the default server) starts again for its next user.
test_server_api starts its own: its tests need a flag that other modules' tests contradict
(/metrics needs the key; the OpenAI server's flags open it), and its last test stops it.
"""

from __future__ import annotations

from radixgen.runtime.tiny_model import CHAT_TEMPLATE

# `radixgen serve --model-path tiny` as the docs start it (test_docs_examples, test_bench).
DEFAULT_FLAGS = ["--model-path", "tiny", "--log-level", "warning"]

# Malformed, hostile and fuzzed requests (test_server_fuzz, test_server_reliability). A small
# context bounds what a valid fuzzed request generates; the body limit and the header timeout
# are what test_server_reliability checks; info logs, which its tests read.
HOSTILE_CONTEXT_LENGTH = 48
MAX_REQUEST_BYTES = 1_000_000
HEADER_READ_TIMEOUT_S = 1.0
HOSTILE_FLAGS = [
    "--log-level", "info",
    "--context-length", str(HOSTILE_CONTEXT_LENGTH),
    "--max-running-requests", "16",
    "--max-request-bytes", str(MAX_REQUEST_BYTES),
    "--header-read-timeout", str(HEADER_READ_TIMEOUT_S),
]  # fmt: skip

# The OpenAI-compatible API, the DSL over HTTP and LoRA adapters (test_server_openai_compat,
# test_lang_http, test_lora_server): an API key, Qwen 2.5 tool calls, /metrics without the key,
# tiny's own chat template read from a file that starts with a marker rendering nothing (the
# file replaces the tokenizer's), and a LoRA adapter "a" (requests without one use the base).
OPENAI_API_KEY = "openai-test-key"
CHAT_TEMPLATE_MARKER = "{# chat template from --chat-template #}"
CHAT_TEMPLATE_FILE_TEXT = CHAT_TEMPLATE_MARKER + CHAT_TEMPLATE


def openai_flags(chat_template_path: str, lora_adapter_path: str) -> list[str]:
    return [
        "--log-level", "warning",
        "--max-total-tokens", "8192",
        "--tool-call-parser", "qwen25",
        "--metrics-no-auth",
        "--chat-template", chat_template_path,
        "--lora-paths", f"a={lora_adapter_path}",
        "--max-loras-per-batch", "2",
        "--lora-target-modules", "all",
    ]  # fmt: skip
