"""Other APIs' requests and answers translated onto the chat completion path (one generation path):
:mod:`.responses` (OpenAI Responses), :mod:`.messages` (Anthropic Messages); :mod:`.tools` builds the chat
tools and tool choices both translate theirs into."""
