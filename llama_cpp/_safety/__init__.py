"""Input guards: value checks, the call guard, media policy, template budget, grammar bounds,
chat-token escaping and the GGUF header guard."""
