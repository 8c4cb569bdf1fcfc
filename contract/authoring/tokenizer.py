"""The tokenizer routes (vLLM's): POST /tokenize, POST /detokenize, GET /tokenizer_info."""

from __future__ import annotations

from .common import F, Schema, nullable, obj

TOKEN_IDS: Schema = {"type": "array", "items": {"$ref": "#/$defs/NonNegativeInteger"}}


def tokenizer_defs() -> dict[str, Schema]:
    defs: dict[str, Schema] = {}
    defs["TokenizeRequest"] = obj(
        "Tokenize a text prompt, or the chat messages as the chat route renders them (exactly one of prompt and messages).",
        [
            F("model", False, nullable({"type": "string"}), "Served model ID, alias or adapter name; missing or null: the served model."),
            F("prompt", False, {"type": "string"}, "Text to tokenize."),
            F("messages", False, {"type": "array", "items": {"$ref": "#/$defs/ChatMessageInput"}, "minItems": 1},
              "Chat messages, rendered with the model's chat template first."),
            F("add_special_tokens", False, {"type": "boolean"},
              "Add the tokenizer's special tokens (BOS); default true for prompt, false for messages (the template writes them)."),
            F("add_generation_prompt", False, {"type": "boolean"},
              "With messages: end with the assistant turn's opening.", default=True),
            F("chat_template_kwargs", False, {"$ref": "#/$defs/NullableTemplateKwargs"},
              "With messages: extra template variables, as on chat."),
            F("return_token_strs", False, nullable({"type": "boolean"}),
              "Also return each token's vocabulary string.", default=False),
        ],
        closed=False,
        annotations={"x-kiln-unknown-field-policy": "accepted_and_ignored",
                     "x-kiln-semantic-constraints": ["exactly one of prompt and messages"]},
    )
    defs["TokenizeResponse"] = obj(
        "Token IDs of a prompt.",
        [
            F("count", True, {"$ref": "#/$defs/NonNegativeInteger"}, "Number of tokens."),
            F("max_model_len", True, {"$ref": "#/$defs/NonNegativeInteger"}, "The served context window."),
            F("tokens", True, TOKEN_IDS, "The token IDs."),
            F("token_strs", True, nullable({"type": "array", "items": {"type": "string"}}),
              "Each token's vocabulary string when return_token_strs; else null."),
        ],
        closed=True,
    )
    defs["DetokenizeRequest"] = obj(
        "Decode token IDs to text.",
        [
            F("model", False, nullable({"type": "string"}), "Served model ID, alias or adapter name."),
            F("tokens", True, TOKEN_IDS, "Token IDs (each below the vocabulary size)."),
        ],
        closed=False,
        annotations={"x-kiln-unknown-field-policy": "accepted_and_ignored",
                     "x-kiln-semantic-constraints": ["token IDs are below the vocabulary size"]},
    )
    defs["DetokenizeResponse"] = obj(
        "The decoded text.",
        [F("prompt", True, {"type": "string"}, "The tokens' text (special tokens included).")],
        closed=True,
    )
    defs["TokenizerInfoResponse"] = obj(
        "What a client needs to tokenize like the server.",
        [
            F("tokenizer_class", True, {"type": "string"}, "The tokenizer's kind (tokenizers' model type)."),
            F("vocab_size", True, {"$ref": "#/$defs/NonNegativeInteger"}, "Token IDs are below this."),
            F("model_max_length", True, {"$ref": "#/$defs/NonNegativeInteger"}, "The served context window."),
            F("eos_token_ids", True, TOKEN_IDS, "Token IDs that end generation."),
            F("bos_token", True, nullable({"type": "string"}), "The beginning-of-sequence token, if any."),
            F("eos_token", True, nullable({"type": "string"}), "The end-of-sequence token, if any."),
            F("chat_template", True, nullable({"type": "string"}), "The chat template source, if any."),
        ],
        closed=True,
    )
    return defs


def tokenizer_routes(errors: Schema) -> list[Schema]:
    def post(op: str, path: str, req: str, resp: str, summary: str) -> Schema:
        return {"operation_id": op, "method": "POST", "path": path, "request": req,
                "responses": {"200": {"description": summary,
                                      "media_types": {"application/json": resp}}, **errors},
                "streaming": False, "tag": "tokenizer", "summary": summary}
    return [
        post("tokenize", "/tokenize", "TokenizeRequest", "TokenizeResponse",
             "Tokenize a text or chat messages (vLLM's /tokenize)."),
        post("detokenize", "/detokenize", "DetokenizeRequest", "DetokenizeResponse",
             "Decode token IDs (vLLM's /detokenize)."),
        {"operation_id": "tokenizerInfo", "method": "GET", "path": "/tokenizer_info",
         "request": None,
         "responses": {"200": {"description": "The served tokenizer.",
                               "media_types": {"application/json": "TokenizerInfoResponse"}},
                       **{k: v for k, v in errors.items() if k in ("401", "500")}},
         "streaming": False, "tag": "tokenizer", "summary": "The served tokenizer (vLLM's /tokenizer_info)."},
    ]
