"""A stand-in Langfuse server on 127.0.0.1 that decodes what arrives, for real.

- ``POST /api/public/otel/v1/traces``: OTLP protobuf (gzip or not) decoded with opentelemetry-proto; every span
  is kept with its ids, times, scope and attributes (AnyValue decoded).
- ``POST /api/public/scores``: the JSON list of scores; answers 202, or 207 when told to reject.
- ``GET /api/public/v2/observations?traceId=``: the spans that arrived, as Langfuse observations.
- ``GET /api/public/v3/scores``: the read API (filters traceId, name; cursor pagination), over the scores that
  arrived plus the ones a test seeds with ``annotate`` (what a person gives in the UI).
- Basic auth checked (401 otherwise); ``fail_next(n, status)`` answers the next ``n`` requests with ``status``;
  ``stop()``/``start()`` take it down and bring it back on the same port.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PUBLIC_KEY, SECRET_KEY = "pk-lf-test", "sk-lf-test"


def any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


class LangfuseReceiver:
    def __init__(self, public_key: str = PUBLIC_KEY, secret_key: str = SECRET_KEY) -> None:
        self.auth = "Basic " + base64.b64encode(f"{public_key}:{secret_key}".encode()).decode()
        self.spans: list[dict[str, Any]] = []
        self.score_posts: list[dict[str, Any]] = []  # every score that arrived, duplicates included
        self.annotations: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status answered)
        self.reject_scores = False
        self.answering = threading.Event()  # cleared by hold(): requests arrive and wait, unanswered, for release()
        self.answering.set()
        self._fail: list[int] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = 0

    # -- control -----------------------------------------------------------------------------------------
    def start(self) -> LangfuseReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                receiver._handle(self, "POST")

            def do_GET(self) -> None:
                receiver._handle(self, "GET")

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LangfuseReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            "LANGFUSE_BASE_URL": self.base_url,
            "LANGFUSE_PUBLIC_KEY": PUBLIC_KEY,
            "LANGFUSE_SECRET_KEY": SECRET_KEY,
        }

    def fail_next(self, count: int, status: int = 503) -> None:
        with self._lock:
            self._fail.extend([status] * count)

    def hold(self) -> None:
        """Langfuse as slow as it gets: every request waits, unanswered, until ``release()`` (at most 120 s)."""
        self.answering.clear()

    def release(self) -> None:
        self.answering.set()

    def annotate(self, trace_id: str, name: str, value: Any, *, comment: str | None = None, **extra: Any) -> None:
        """A score as a person would give it in the Langfuse UI."""
        data_type = "BOOLEAN" if isinstance(value, bool) else "NUMERIC" if isinstance(value, int | float) else None
        self.annotations.append(
            {
                "id": uuid.uuid4().hex,
                "traceId": trace_id,
                "name": name,
                "value": value,
                "dataType": extra.pop("dataType", data_type or "CATEGORICAL"),
                "source": "ANNOTATION",
                "comment": comment,
                **extra,
            }
        )

    # -- what arrived ------------------------------------------------------------------------------------
    def traces(self) -> dict[str, list[dict[str, Any]]]:
        by_trace: dict[str, list[dict[str, Any]]] = {}
        for span in self.spans:
            by_trace.setdefault(span["trace_id"], []).append(span)
        return by_trace

    def scores(self) -> dict[str, dict[str, Any]]:
        """The scores Langfuse would hold: the last one sent per id."""
        return {s["id"]: s for s in self.score_posts}

    # -- handling ----------------------------------------------------------------------------------------
    def _handle(self, http: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(http.path)
        body = http.rfile.read(int(http.headers.get("Content-Length") or 0))
        self.answering.wait(120)
        with self._lock:
            forced = self._fail.pop(0) if self._fail else None
        if http.headers.get("Authorization") != self.auth:
            status, payload, kind = 401, json.dumps({"message": "Invalid credentials"}).encode(), "application/json"
        elif forced is not None:
            status, payload, kind = forced, json.dumps({"message": "unavailable"}).encode(), "application/json"
        elif method == "POST" and url.path == "/api/public/otel/v1/traces":
            status, payload, kind = self._otlp(http, body)
        elif method == "POST" and url.path == "/api/public/scores":
            status, payload, kind = self._post_scores(body)
        elif method == "GET" and url.path == "/api/public/v3/scores":
            status, payload, kind = self._get_scores(parse_qs(url.query))
        elif method == "GET" and url.path == "/api/public/v2/observations":
            status, payload, kind = self._get_observations(parse_qs(url.query))
        else:
            status, payload, kind = 404, b'{"message": "not found"}', "application/json"
        with self._lock:
            self.requests.append((method, url.path, status))
        http.send_response(status)
        http.send_header("Content-Type", kind)
        http.send_header("Content-Length", str(len(payload)))
        http.end_headers()
        http.wfile.write(payload)

    def _otlp(self, http: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        if http.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    spans.append(
                        {
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex() or None,
                            "name": span.name,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "scope": scope.scope.name,
                            "scope_attributes": {a.key: any_value(a.value) for a in scope.scope.attributes},
                            "attributes": {a.key: any_value(a.value) for a in span.attributes},
                        }
                    )
        with self._lock:
            self.spans.extend(spans)
        return 200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf"

    def _post_scores(self, body: bytes) -> tuple[int, bytes, str]:
        scores = json.loads(body)
        assert isinstance(scores, list), scores
        if self.reject_scores:
            errors = [{"message": f"score {s.get('name')!r} rejected"} for s in scores]
            answer = {"accepted": 0, "rejected": len(scores), "errors": errors}
            return 207, json.dumps(answer).encode(), "application/json"
        with self._lock:
            self.score_posts.extend({"id": uuid.uuid4().hex, **s} for s in scores)  # Langfuse makes missing ids
        return 202, json.dumps({"message": "Accepted"}).encode(), "application/json"

    def _get_scores(self, query: dict[str, list[str]]) -> tuple[int, bytes, str]:
        traces = set(query["traceId"][0].split(",")) if "traceId" in query else None
        names = set(query["name"][0].split(",")) if "name" in query else None
        limit = int(query.get("limit", ["50"])[0])
        offset = int(base64.urlsafe_b64decode(query["cursor"][0]).decode()) if "cursor" in query else 0
        now = dt.datetime.now(dt.UTC).isoformat()
        pool = [*({**s, "source": "API"} for s in self.scores().values()), *self.annotations]
        found = [
            s for s in pool if (traces is None or s.get("traceId") in traces) and (names is None or s["name"] in names)
        ]
        page = found[offset : offset + limit]
        data = [
            {
                "id": s["id"],
                "projectId": "test-project",
                "name": s["name"],
                "value": s["value"],
                "dataType": s.get("dataType") or "NUMERIC",
                "source": s["source"],
                "timestamp": s.get("timestamp") or now,
                "environment": "default",
                "createdAt": now,
                "updatedAt": now,
                "comment": s.get("comment"),
                "metadata": s.get("metadata"),
                "subject": {"kind": "trace", "id": s["traceId"]},
            }
            for s in page
        ]
        meta: dict[str, Any] = {"limit": limit}
        if offset + limit < len(found):
            meta["cursor"] = base64.urlsafe_b64encode(str(offset + limit).encode()).decode()
        return 200, json.dumps({"data": data, "meta": meta}).encode(), "application/json"

    def _get_observations(self, query: dict[str, list[str]]) -> tuple[int, bytes, str]:
        wanted = query.get("traceId", [None])[0]

        def iso(ns: int) -> str:
            return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat()

        data = []
        for span in self.spans:
            if wanted is not None and span["trace_id"] != wanted:
                continue
            a = span["attributes"]
            data.append(
                {
                    "id": span["span_id"],
                    "traceId": span["trace_id"],
                    "startTime": iso(span["start"]),
                    "endTime": iso(span["end"]),
                    "projectId": "test-project",
                    "parentObservationId": span["parent_id"],
                    "type": str(a.get("langfuse.observation.type", "span")).upper(),
                    "name": span["name"],
                    "model": a.get("langfuse.observation.model.name"),
                    "usageDetails": json.loads(a.get("langfuse.observation.usage_details", "null")),
                }
            )
        return 200, json.dumps({"data": data, "meta": {}}).encode(), "application/json"
