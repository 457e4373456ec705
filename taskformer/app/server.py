"""The HTTP side of ``taskformer serve``: a FastAPI app over one :class:`Batcher` per served run.

Every answer goes through :func:`taskformer.app.runner.predict`, the function behind
``taskformer predict`` and :meth:`taskformer.Model.predict`, so a result equals what they give for
the same run and options. Errors are JSON ``{"error": ..., "field": ...}`` naming what was wrong.
docs/serve.md describes the API, the limits and the security model.
"""
import asyncio
import json
import secrets
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.sse import EventSourceResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from taskformer.app import runner
from taskformer.app.batching import QueueFull
from taskformer.app.served import MAX_BEAM, Served, events

OPEN_PATHS = ("/", "/favicon.svg", "/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")  # no model data
DOCS_ASSETS = "/docs/assets"  # Swagger UI and ReDoc, served from the fastapi-offline package: /docs works offline
PREDICT_ROUTE = "/v1/models/{name}/predict"


@dataclass(frozen=True)
class Limits:
    max_batch: int = 32  # sentences decoded together
    max_wait_ms: float = 0.0  # how long a batch waits for company once the decoder is free (0: none)
    max_inputs: int = 64  # per request
    max_chars: int = 2000  # per input
    max_body: int = 1 << 20  # bytes
    max_queue: int = 1024  # sentences waiting per model


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers

    def response(self) -> JSONResponse:
        return error(self.status, self.message, self.field, self.headers)


def error(status: int, message: str, field: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status, headers=headers)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("taskformer_requests", "HTTP requests by route and status code", ["route", "status"],
                                registry=self.registry)
        self.latency = Histogram("taskformer_request_seconds", "Time to answer a request", ["route"],
                                 registry=self.registry)
        self.batch = Histogram("taskformer_batch_sentences", "Sentences per decode batch", ["model"],
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry)
        self.queue = Gauge("taskformer_queue_sentences", "Sentences waiting to be decoded", ["model"],
                           registry=self.registry)
        self.children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}  # labelled series, looked up once

    def answered(self, route: str, status: int, seconds: float) -> None:
        """Count one request of ``route`` answered with ``status`` in ``seconds``."""
        series = self.children.get((route, status))
        if series is None:
            series = self.children[route, status] = (self.requests.labels(route, str(status)), self.latency.labels(route))
        series[0].inc()
        series[1].observe(seconds)


class PredictBody(BaseModel):
    """What every ``/predict`` body has; :func:`add_predict_routes` makes the one checked within the limits."""

    model_config = ConfigDict(extra="allow")
    inputs: list
    return_attention: bool = False


class Guard:
    """ASGI middleware in front of every route: body size, API key, request metrics, and the answer to
    the commonest request (:meth:`plain_predict`).

    The body is read here, up to ``max_body`` bytes, before any route sees it; the key is checked
    before anything is parsed or decoded. LibreTranslate clients send the key as ``api_key`` in the
    body of ``/translate``, so that field is accepted there as well.
    """

    def __init__(self, app, limits: Limits, api_key: str | None, metrics: Metrics, served: dict[str, Served],
                 request: type[PredictBody]):
        self.app, self.limits, self.api_key, self.metrics, self.served = app, limits, api_key, metrics, served
        self.request = request  # the route's body, within the limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status, route = time.perf_counter(), [500], None

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            headers = dict(scope["headers"])  # read once: the plain request's lane is a hot path
            body = await self.body(headers, receive)
            refused = (error(413, f"request body larger than {self.limits.max_body} bytes", "body") if body is None
                       else self.unauthorized(scope, headers, body))
            if refused:
                return await refused(scope, receive, sending)
            replayed = False

            async def replay():
                nonlocal replayed
                if replayed:
                    return await receive()  # later calls: the client's disconnect
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            plain = self.plain_predict(scope, headers, body)
            if plain is None:
                return await self.app(scope, replay, sending)
            route = PREDICT_ROUTE
            try:
                answered = JSONResponse({"results": await answer(*plain, ((), False), Request(scope, replay))})
            except ApiError as e:
                answered = e.response()
            await answered(scope, replay, sending)
        finally:
            route = route or getattr(scope.get("route"), "path", "other")
            self.metrics.answered(route, status[0], time.perf_counter() - started)

    def plain_predict(self, scope, headers: dict, body: bytes) -> tuple[Served, list[str]] | None:
        """The model and texts of the commonest request, ``{"inputs": [TEXT, ...]}`` as ``application/json``
        to a served model of single texts, within the limits; None for any other request, which FastAPI's
        route answers or refuses.

        Such a request is answered here by the route's own :func:`answer`, in the same bytes, without
        FastAPI's routing, dependency solving and validation: run after a decode has evicted the
        caches, that Python cost a lone request about a quarter of a millisecond of the event loop."""
        path, (before, after) = scope["path"], PREDICT_ROUTE.split("{name}")
        if scope["method"] != "POST" or not path.startswith(before) or not path.endswith(after):
            return None
        m = self.served.get(path[len(before):-len(after)])
        if m is None or m.run.model.cfg.pairs or headers.get(b"content-type") != b"application/json":
            return None
        try:
            fields = json.loads(body)
            if type(fields) is not dict or list(fields) != ["inputs"]:
                return None
            texts = self.request.model_validate(fields).inputs
            if not texts or not all(type(t) is str for t in texts):
                return None
            return m, servable(texts, "inputs", self.limits)
        except (ValueError, RecursionError, ApiError):  # pydantic's ValidationError is a ValueError
            return None

    async def body(self, headers: dict, receive) -> bytes | None:
        """The whole request body, or None if it is larger than allowed."""
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limits.max_body:
            return None
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limits.max_body:
                return None
            more = message.get("more_body", False)
        return b"".join(chunks)

    def unauthorized(self, scope, headers: dict, body: bytes) -> JSONResponse | None:
        if self.api_key is None or scope["path"] in OPEN_PATHS or scope["path"].startswith(DOCS_ASSETS + "/"):
            return None
        header = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" and scope["path"] == "/translate":
            try:
                given = libretranslate_fields(headers, body).get("api_key", "")
            except ApiError:  # a body that is not a request holds no key
                given = ""
        if isinstance(given, str) and given and secrets.compare_digest(given.encode(), self.api_key.encode()):
            return None
        return error(401, "missing or wrong API key: send it as the header 'Authorization: Bearer KEY'",
                     "Authorization", {"WWW-Authenticate": "Bearer"})


def libretranslate_fields(headers: dict, body: bytes) -> dict:
    """A LibreTranslate request's fields, sent as JSON or as a form; ApiError (422, ``body``) if the body
    is neither."""
    try:
        if b"application/x-www-form-urlencoded" in headers.get(b"content-type", b""):
            return {k: v[0] if len(v) == 1 else v for k, v in parse_qs(body.decode("utf-8")).items()}
        fields = json.loads(body or b"{}")
    except (ValueError, RecursionError) as e:
        raise unparseable(e) from None
    if not isinstance(fields, dict):
        raise ApiError(422, f"body: expected a JSON object or a form, got a JSON {type(fields).__name__}", "body")
    return fields


def unparseable(e: BaseException) -> ApiError:
    """The answer to a body no parser takes, whichever parser (json's, in FastAPI or here) found out: the
    nesting is bounded by the interpreter's recursion limit, numbers by its 4,300 digits, the size by
    ``Limits.max_body``."""
    if isinstance(e, RecursionError):
        why = "nested too deeply"
    elif isinstance(e, UnicodeDecodeError):
        why = f"not valid UTF-8 (byte {e.start})"
    else:  # json's own message, or Python's digit limit, whose advice is for programmers
        why = f"not valid JSON ({str(e).split(';')[0]})"
    return ApiError(422, f"body: {why}", "body")


def field_name(loc) -> str:
    """``("body", "inputs", 3)`` -> ``inputs[3]``."""
    name = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, str) and not part.isidentifier():
            continue  # a union member's type that pydantic names (``q.constrained-str``), not a field
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else str(part)
    return name or "body"


def create_app(runs: dict[str, runner.Run], limits: Limits, api_key: str | None = None) -> FastAPI:
    """The app serving ``runs`` behind :class:`Guard`: its routes in groups (the page and listings,
    prediction, LibreTranslate's ``/translate``), every refusal answered as JSON."""
    metrics = Metrics()
    served = {name: Served(name, run, limits, metrics) for name, run in runs.items()}

    @asynccontextmanager
    async def lifespan(app):
        for model in served.values():
            model.batcher.start()
        yield
        for model in served.values():
            await model.batcher.stop()

    # FastAPI's own OpenTelemetry is off: the server's metrics are Prometheus' (/metrics), and FastAPI would
    # look for a configured provider on every request (Python on the event loop, in every request's latency).
    app = FastAPIOffline(title="taskformer serve", lifespan=lifespan, static_url=DOCS_ASSETS, favicon_url="/favicon.svg",
                         telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.served = served
    add_error_handlers(app, served)
    add_listing_routes(app, served, metrics)
    request = add_predict_routes(app, served, limits)
    app.add_middleware(Guard, limits=limits, api_key=api_key, metrics=metrics, served=served, request=request)
    add_translate_route(app, served, limits)
    return app


def add_error_handlers(app: FastAPI, served: dict[str, Served]) -> None:
    """Every refusal, FastAPI's and Starlette's own included, as ``{"error", "field"}``."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":
            return error(422, f"body: not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})", "body")
        field = field_name(first.get("loc", ()))
        return error(422, f"{field}: {first.get('msg', 'invalid')}", field)

    @app.exception_handler(ApiError)
    async def refused(request, exc: ApiError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def starlette_refused(request, exc: StarletteHTTPException):
        """What FastAPI and Starlette answer themselves, in the shape of every other answer."""
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI's parse of a body failed
            return await refused(request, unparseable(exc.__cause__))
        if exc.status_code == 404:
            path = request.url.path
            if path.startswith("/v1/models/"):
                return error(404, f"no model or route {path!r}; served: {', '.join(served)}", "name")
            return error(404, f"no route {path!r}", "path")
        return error(exc.status_code, str(exc.detail), "method" if exc.status_code == 405 else None, exc.headers)


def add_listing_routes(app: FastAPI, served: dict[str, Served], metrics: Metrics) -> None:
    """The page, its icon, health, Prometheus metrics and the list of models."""

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return resources.files(__package__).joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/favicon.svg", include_in_schema=False)
    async def favicon():
        return Response(resources.files(__package__).joinpath("static/favicon.svg").read_bytes(),
                        media_type="image/svg+xml")

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": list(served)}

    @app.get("/metrics")
    async def metrics_page():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"models": [m.describe() for m in served.values()]}


def add_predict_routes(app: FastAPI, served: dict[str, Served], limits: Limits) -> type[PredictBody]:
    """``/v1/models/{name}/predict`` and its stream of server-sent events, with their request body. The
    body's model is returned too: :class:`Guard`'s lane for plain requests checks a body with it, so each
    limit is said once."""
    Text = Annotated[str, StringConstraints(max_length=limits.max_chars)]

    class Pair(BaseModel):  # an input of a task of sentence pairs, in the keys of Hugging Face's pipelines
        model_config = ConfigDict(extra="forbid")
        text: Text
        text_pair: Text | None = None  # required, but said by inputs_for(), which knows the model

    # An input is a text, or an object for a pair: an object is checked as a pair only, so its error
    # names its own field (the tags have spaces: field_name() leaves them out of the field's name).
    Input = Annotated[Annotated[Text, Tag("one text")] | Annotated[Pair, Tag("text pair")],
                      Discriminator(lambda given: "text pair" if isinstance(given, (dict, Pair)) else "one text")]

    class PredictRequest(PredictBody):
        """The inputs, and any decode option the model lists in ``GET /v1/models`` (checked by :func:`options`)."""

        inputs: list[Input] = Field(max_length=limits.max_inputs)

    def inputs_for(m: Served, inputs: list) -> list:
        """The request's inputs as the model reads them: texts, or for a task of pairs ``(text, text_pair)``
        tuples. An input of the other shape is refused, naming the field that is missing or too much."""
        pairs, out = m.run.model.cfg.pairs, []
        for i, given in enumerate(inputs):
            if pairs and (not isinstance(given, Pair) or given.text_pair is None):
                raise ApiError(422, f"inputs[{i}].text_pair: model {m.name!r} reads pairs of texts; send each input "
                                    'as {"text": FIRST, "text_pair": SECOND}', f"inputs[{i}].text_pair")
            if not pairs and isinstance(given, Pair):
                raise ApiError(422, f"inputs[{i}]: model {m.name!r} reads one text per input; send it as a string",
                               f"inputs[{i}]")
            out.append((given.text, given.text_pair) if pairs else given)
        return out

    def options(m: Served, body: PredictRequest) -> tuple[tuple, bool]:
        """The request's decode settings, checked as ``--set`` checks them (422 naming the first refused
        one), and whether it asks for attention: the batcher's key, as requests with equal ones share a decode."""
        if body.return_attention and not m.run.model.cfg.kind.shifted:
            raise ApiError(422, f"return_attention: only encoder-decoder models have cross-attention; "
                                f"{m.name!r} is {m.run.task.variant}", "return_attention")
        settings = dict(body.model_extra or {})
        try:
            runner.request_config(m.run, settings)
        except runner.OptionError as e:
            raise ApiError(422, str(e), e.field) from None
        if (settings.get("beam") or 0) > MAX_BEAM:  # each hypothesis costs memory: a server bounds it (null: the run's search)
            raise ApiError(422, f"beam: at most {MAX_BEAM} on this server, got {settings['beam']}", "beam")
        return tuple(sorted(settings.items())), body.return_attention

    @app.post(PREDICT_ROUTE)
    async def predict(name: str, body: PredictRequest, request: Request):
        m = model(served, name)
        texts = servable(inputs_for(m, body.inputs), "inputs", limits)
        # A response, not a dict: FastAPI would walk a dict through its encoder first, which its values
        # (JSON's own types) do not need; the same bytes come out.
        return JSONResponse({"results": await answer(m, texts, options(m, body), request)})

    @app.post("/v1/models/{name}/predict/stream")
    async def predict_stream(name: str, body: PredictRequest):
        m = model(served, name)
        opts, texts = options(m, body), inputs_for(m, body.inputs)
        if m.batcher.queued + len(servable(texts, "inputs", limits)) > limits.max_queue:
            raise ApiError(503, "server busy: the queue is full; retry shortly", None, {"Retry-After": "1"})

        if not m.run.model.cfg.kind.encoder:  # a language model: its text as it is written
            return EventSourceResponse(m.continuations(texts, opts[0]))

        async def one(text: str) -> dict:
            return (await m.batcher.submit([text], opts))[0]

        def event(i: int, work: asyncio.Task) -> dict:
            try:
                return {"index": i, **work.result()}
            except Exception as e:
                return {"index": i, "error": f"{type(e).__name__}: {e}"}

        async def answers():
            index = {asyncio.ensure_future(one(text)): i for i, text in enumerate(texts)}
            waiting = set(index)
            try:
                while waiting:
                    done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    yield events(event(index[work], work) for work in sorted(done, key=index.get))
            finally:
                for work in waiting:
                    work.cancel()

        return EventSourceResponse(answers())

    return PredictRequest


def add_translate_route(app: FastAPI, served: dict[str, Served], limits: Limits) -> None:
    """LibreTranslate's ``/translate``, answered by the model that translates the pair asked for."""
    Text = Annotated[str, StringConstraints(max_length=limits.max_chars)]

    class TranslateRequest(BaseModel):
        q: Text | list[Text]
        source: str = "auto"
        target: str = ""
        format: str = "text"
        api_key: str = ""

    @app.post("/translate")
    async def translate(request: Request):
        fields = libretranslate_fields(dict(request.scope["headers"]), await request.body())
        try:
            body = TranslateRequest.model_validate(fields)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None
        texts = body.q if isinstance(body.q, list) else [body.q]
        if len(texts) > limits.max_inputs:
            raise ApiError(422, f"q: at most {limits.max_inputs} texts per request", "q")
        servable(texts, "q", limits)
        m = translation_model(served, body.source, body.target)
        results = [r["output"] for r in await answer(m, texts, ((), False), request)]
        return JSONResponse({"translatedText": results if isinstance(body.q, list) else results[0]})


def model(served: dict[str, Served], name: str) -> Served:
    if name not in served:
        raise ApiError(404, f"no model {name!r}; served: {', '.join(served)}", "name")
    return served[name]


def servable(texts: list[str], field: str, limits: Limits) -> list[str]:
    """``texts``, unless there are more than can ever wait in a queue (more than --max-inputs allows)."""
    if len(texts) > limits.max_queue:
        raise ApiError(422, f"{field}: {len(texts)} texts can never be served here: at most {limits.max_queue} "
                            "wait per model (--max-queue); send fewer per request", field)
    return texts


async def answer(m: Served, texts: list[str], opts, request: Request) -> list[dict]:
    """The batcher's results, or ApiError; a client that goes away cancels its queued work.

    The handler awaits the batcher's future itself: no task of its own and no ``asyncio.wait`` per
    request (a lone request's time around the decode is mostly such Python, slowed by the caches the
    decode evicts). Only a request still queued once the batcher has taken what it takes at once is
    watched, by a task that cancels the future when its client leaves: one being decoded is decoded
    to the end whatever its client does, so a lone request needs no watcher."""
    try:
        work = m.batcher.submit(texts, opts)
    except QueueFull as e:
        raise ApiError(503, f"server busy: {e}; retry shortly", None, {"Retry-After": "1"}) from None
    watching: list[asyncio.Task] = []

    def watch() -> None:  # called soon: after the batcher's collector, woken by the submit, took its batch
        if m.batcher.waiting(work):
            watching.append(asyncio.ensure_future(until_disconnected(request)))
            watching[0].add_done_callback(lambda _: work.cancel())

    asyncio.get_running_loop().call_soon(watch)
    try:
        results = await work
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if watching and watching[0].done() and not (task and task.cancelling()):  # the client left
            raise ApiError(499, "client closed the request") from None
        raise
    except Exception as e:
        raise ApiError(500, f"decoding failed: {type(e).__name__}: {e}") from None
    finally:
        for gone in watching:
            gone.cancel()
    bad = next((i for i, r in enumerate(results) if "error" in r), None)
    if bad is not None:
        raise ApiError(422, f"inputs[{bad}]: {results[bad]['error']}", f"inputs[{bad}]")
    return results


def translation_model(served: dict[str, Served], source: str, target: str) -> Served:
    """The model for a LibreTranslate request: the first one served whose task translates ``source``
    into ``target`` (``Task.languages``; a ``source`` of ``auto`` matches any), whatever its served
    name. A pair that no model translates is refused, naming the pairs that are served."""
    pairs = [(m, m.run.task.languages) for m in served.values() if m.run.task.languages]
    for m, (src, tgt) in pairs:
        if source in (src, "auto") and target == tgt:
            return m
    offered = ", ".join(f"{src}->{tgt} ({m.name})" for m, (src, tgt) in pairs) or "none"
    field = "target" if source == "auto" or any(source == src for _, (src, _) in pairs) else "source"
    raise ApiError(400, f"no served model translates {source!r} into {target!r}; the pairs served: {offered}", field)


async def until_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
