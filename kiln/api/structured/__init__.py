"""Structured outputs: a request's constraint (``response_format``, ``structured_outputs``,
llama-server's ``grammar``/``json_schema``, forced tool calls, structural tags) checked and
compiled to the engine's ``GrammarSpec`` before it is admitted. The engine's grammar stage
(``kiln.engine.grammar``) runs the compiled grammars; the handlers only ask for them."""
