"""The chat code the proxy and every engine share: conversations and their normal form, the ChatML template with
Hermes tool calls and ``<think>`` reasoning, completion parsing as vLLM's parsers do it, the reference tokenizer
(byte-level BPE trained from ``data/corpus.txt``), token-id text and JSON helpers, and their errors."""
