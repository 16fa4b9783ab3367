"""``cuda-agent serve``: evaluation as an HTTP service (docs/serve.md).

The server (``serve.app``) needs the optional extra ``serve`` (FastAPI, uvicorn); the client
(``serve.client.EvalClient``) needs only httpx. Importing this package imports neither.
"""
