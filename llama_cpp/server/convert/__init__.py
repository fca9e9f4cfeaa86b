"""Other APIs' requests and answers translated onto the chat completion path (one generation path):
:mod:`.responses` (OpenAI Responses), :mod:`.messages` (Anthropic Messages)."""
