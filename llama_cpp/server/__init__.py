"""An OpenAI-compatible HTTP server: ``python -m llama_cpp.server --model M`` (the ``[server]`` extra).

The interface is upstream llama-cpp-python's (flags, environment variables, ``ServerSettings``,
``ModelSettings``, ``ConfigFileSettings``, routes); the engine behind it is not. Each model gets
one of two engines (:mod:`.engine`):

- **slots** (text models, and projector models' image and audio chat): ``n_parallel`` sequences on one
  llama.cpp context. A scheduler thread builds one batch per step holding the next token of every
  generating request plus prompt chunks of newly admitted ones (a prompt's media chunks decoded into
  its sequence on their own), decodes it once and samples each slot with its own sampler chain,
  grammar, stop strings and logprobs (continuous batching, as llama.cpp's ``llama-server``).
- **embeddings** (``embedding=true``): the inputs of up to ``n_parallel`` concurrent embedding or
  reranking requests packed into shared decodes, one sequence per input.
- **serial**: one request at a time through :class:`~llama_cpp.Llama` itself, for what cannot
  share a batch yet: a projector model that speculates. ``n_parallel=0`` forces it (upstream's behaviour).
  A model over RPC servers (``rpc_servers``) runs serially in a worker process (:mod:`.engine.worker`),
  since llama.cpp's RPC client aborts the process that holds the model when a server is lost;
  ``rpc_isolation=false`` puts it on slots in the server process.

Libraries: FastAPI (request validation with pydantic and the OpenAPI page, as upstream, so the
settings and request classes stay pydantic models), uvicorn (the ASGI server upstream uses;
its ``Server`` lets SIGTERM drain requests before the contexts are freed) and pydantic-settings
(environment variables for every setting). Server-sent events are written with starlette's own
``StreamingResponse``, which already cancels the producer when the client goes away, so the
``sse-starlette`` dependency upstream carries is not needed.
"""
