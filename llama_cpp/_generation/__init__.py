"""Generation: sampling, the generation loop and OpenAI-style responses."""
