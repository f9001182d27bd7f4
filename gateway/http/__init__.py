"""The OpenAI-compatible HTTP front end, served by the gateway process on its own event loop
next to the gRPC API and through the same core (gateway/frontend.py). docs/http.md describes it.

  app.py                 routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
  openai_request.py      an OpenAI request body -> the front end's GenerationRequest
  openai_response.py     completions and chunks in OpenAI's shapes; usage with our speculation
  chat_template.py       the checkpoint's chat template, rendered without transformers
  errors.py              refusals in OpenAI's error body, with their HTTP statuses
  auth.py                API keys as `Authorization: Bearer`
  server.py              uvicorn on the gateway's loop, with the public API's TLS
"""
