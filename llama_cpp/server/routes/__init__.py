"""The server's routes, one module per API family, each a FastAPI ``APIRouter`` whose handlers are
module-level functions (importable and testable one by one). :data:`ROUTERS` is the one table the
app includes, in order."""

from __future__ import annotations

from . import chat, completions, embeddings, lora, messages, models, observability, responses, tokenize

ROUTERS = [models.router, completions.router, chat.router, responses.router, messages.router, embeddings.router,
           tokenize.router, observability.router, lora.router]

__all__ = ["ROUTERS"]
