"""The HTTP API of ``cuda-agent serve`` (FastAPI; docs/serve.md).

Endpoints (all but health need ``Authorization: Bearer <token>``):

- ``GET  /v1/health``             liveness and workers
- ``GET  /v1/metrics``            job counts, throughput, pool lanes
- ``POST /v1/evaluate?wait_s=S``  submit one job and wait for its verdict (202 if not done in S)
- ``POST /v1/jobs``               submit one job (202)
- ``POST /v1/jobs/batch``         submit many jobs at once (202)
- ``GET  /v1/jobs/{id}?wait_s=S`` a job's state and result, waiting up to S seconds for it
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import uuid
from typing import Any, Optional

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.pool import PoolClosed
from cuda_agent.serve.config import ServeConfig
from cuda_agent.serve.queue import IdempotencyConflict
from cuda_agent.serve.service import BadJobRequest, EvalService, JobView, job_from_request

TASK_ID_PATTERN = r"^[^\x00-\x1f]{1,200}$"
IDEMPOTENCY_KEY = Header(None, alias="Idempotency-Key", pattern=r"^[\x21-\x7e]{1,200}$",
                         description="A client's name for this submission: a retry with the same key gets the "
                                     "same jobs back instead of new ones.")


def _digest(request: BaseModel) -> str:
    """Identifies a request's content, so that a reused idempotency key with other content is caught."""
    return hashlib.sha256(request.model_dump_json().encode("utf-8", "surrogatepass")).hexdigest()


class JobRequest(BaseModel):
    """One (task, solution) to evaluate."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored
    task_code: str = Field(description="KernelBench-format problem source (class Model, get_inputs, get_init_inputs).")
    task_id: Optional[str] = Field(None, pattern=TASK_ID_PATTERN, description="Name for the task in the verdict.")
    solution_files: Optional[dict[str, str]] = Field(
        None, description="Relative path -> source: one .py (single file) or model_new.py + kernels/*.")
    solution_code: Optional[str] = Field(None, description="Shorthand for one single-file solution.")


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    jobs: list[JobRequest]


def _job(request: JobRequest, prefix: str = ""):
    return job_from_request(uuid.uuid4().hex, request.task_code, request.task_id, request.solution_files,
                            request.solution_code, prefix)


class _BodySizeLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 before any handler reads it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._reject(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send) -> None:
        response = JSONResponse({"detail": f"request body: larger than the service's limit of {self.max_bytes} bytes"},
                                status_code=413)
        await response(scope, receive, send)


def _add_error_handlers(app: FastAPI) -> None:
    """Every client error names its field: 400 bad job, 422 malformed request, 503 shutting down."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"body: invalid JSON ({error['ctx'].get('error', 'decode error')} at character {error['loc'][-1]})"
                    if error["type"] == "json_invalid" else
                    f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()]
        return JSONResponse({"detail": problems}, status_code=422)

    @app.exception_handler(BadJobRequest)
    async def bad_job(_: Request, exc: BadJobRequest) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=400)

    @app.exception_handler(IdempotencyConflict)
    async def conflict(_: Request, exc: IdempotencyConflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "field": "Idempotency-Key"}, status_code=409)

    @app.exception_handler(PoolClosed)
    async def closing(_: Request, exc: PoolClosed) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)


def _add_api_docs(app: FastAPI, authorised) -> None:
    """``/openapi.json``, ``/docs`` and ``/redoc``, for holders of the token only."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(authorised)])
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(authorised)])
    async def swagger():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=app.title)

    @app.get("/redoc", include_in_schema=False, dependencies=[Depends(authorised)])
    async def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title=app.title)


def create_app(service: EvalService, config: ServeConfig) -> FastAPI:
    """The ASGI app over ``service``; the service's pool is closed when the app shuts down."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        service.resume()
        yield
        await asyncio.to_thread(service.close)

    app = FastAPI(title="cuda-agent evaluation service", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)  # served below, behind the token like every other page
    app.add_middleware(_BodySizeLimit, max_bytes=config.max_request_bytes)

    def authorised(request: Request) -> None:
        if config.token is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), config.token.encode()):
            raise HTTPException(401, "Authorization: a valid 'Bearer <token>' header is required",
                                headers={"WWW-Authenticate": "Bearer"})

    _add_error_handlers(app)
    _add_api_docs(app, authorised)

    async def view_after(job_id: str, wait_s: float) -> JobView:
        future = service.pending_future(job_id)
        if future is not None and wait_s > 0:
            await asyncio.wait({asyncio.wrap_future(future)}, timeout=min(wait_s, config.max_wait_s))
            await asyncio.sleep(0)  # let the done-callback store the answer first
        view = await asyncio.to_thread(service.view, job_id)
        if view is None:
            raise HTTPException(404, f"job_id: no job {job_id!r}")
        return view

    def respond(view: JobView, pending_status: int = 200) -> JSONResponse:
        return JSONResponse(view.to_json_dict(), status_code=200 if view.result is not None else pending_status)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        stats = service.pool.stats()
        return {"status": "ok", "backend": stats.backend, "workers_alive": sum(l.alive for l in stats.lanes),
                "workers": len(stats.lanes)}

    @app.get("/v1/metrics", dependencies=[Depends(authorised)])
    async def metrics() -> dict[str, Any]:
        return await asyncio.to_thread(service.metrics)

    @app.post("/v1/evaluate", dependencies=[Depends(authorised)])
    async def evaluate(request: JobRequest, wait_s: float = Query(600.0, ge=0),
                       idempotency_key: Optional[str] = IDEMPOTENCY_KEY) -> JSONResponse:
        job = await asyncio.to_thread(_job, request)  # parsing a large task must not stall other requests
        [job_id] = await asyncio.to_thread(service.accept, [job], idempotency_key, _digest(request))
        return respond(await view_after(job_id, wait_s), pending_status=202)

    @app.post("/v1/jobs", status_code=202, dependencies=[Depends(authorised)])
    async def submit(request: JobRequest, idempotency_key: Optional[str] = IDEMPOTENCY_KEY) -> dict[str, Any]:
        job = await asyncio.to_thread(_job, request)
        [job_id] = await asyncio.to_thread(service.accept, [job], idempotency_key, _digest(request))
        return {"job_id": job_id, "state": "queued"}

    @app.post("/v1/jobs/batch", status_code=202, dependencies=[Depends(authorised)])
    async def submit_batch(batch: BatchRequest, idempotency_key: Optional[str] = IDEMPOTENCY_KEY) -> dict[str, Any]:
        if not 1 <= len(batch.jobs) <= config.max_batch:
            raise BadJobRequest("jobs", f"a batch holds 1 to {config.max_batch} jobs, got {len(batch.jobs)}")
        jobs = await asyncio.to_thread(lambda: [_job(request, f"jobs[{index}].")
                                                for index, request in enumerate(batch.jobs)])
        return {"job_ids": await asyncio.to_thread(service.accept, jobs, idempotency_key, _digest(batch))}

    @app.get("/v1/jobs/{job_id}", dependencies=[Depends(authorised)])
    async def job(job_id: str, wait_s: float = Query(0.0, ge=0)) -> JSONResponse:
        return respond(await view_after(job_id, wait_s))

    return app
