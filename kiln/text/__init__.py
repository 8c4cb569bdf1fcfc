"""Text processing: tokenizer, incremental detokenizer, chat templates."""

from kiln.text.chat_template import ChatTemplate, ChatTemplateError, TemplateRaisedError
from kiln.text.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "TemplateRaisedError",
    "Tokenizer",
]
