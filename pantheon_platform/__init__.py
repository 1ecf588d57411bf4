"""The platform every app shares: the plumbing between the Django apps and the engine.

errors (the JSON error shape), strict_json (the body parser and strict DRF fields), sse,
request_log, middleware (CORS), routes (scopes, body limits, canonical paths), tenancy
(the caller's namespace), shutdown, runtime (the model registry: get_runtime()),
model_files, chat_http (the chat core's Django side), openapi (the document's building
blocks). Not a Django app; it never imports one (pyproject.toml [tool.importlinter]).
"""
