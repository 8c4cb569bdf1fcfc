"""From the engine's outputs to the wire: chat's response body (``chat_body``) and stream
(``chat_stream``), completions' stream, logprobs, performance metadata, and the agent APIs'
turn runner (``chat_turn``) with their outputs and streams. Route handlers live in
``kiln.api.handlers``."""
