"""From a wire request to what the engine runs: the preparation chat, batch, completions and the
agent APIs share (``prepare``), sampling parameters and the fields this server refuses
(``params``, ``extras``), token-id prompts (``prompt_ids``), rollout admission (``rollout``),
completions' prompts (``completions_gen``) and the agent APIs' input stages
(``messages_input``, ``responses_input``). Route handlers live in ``kiln.api.handlers``."""
