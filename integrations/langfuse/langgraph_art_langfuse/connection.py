"""Where Langfuse is and how to talk to it: keys and URL from arguments or ``LANGFUSE_*`` variables.

Two channels, both from the official SDK's stack: traces as OTLP protobuf to ``/api/public/otel/v1/traces`` (the
OpenTelemetry exporter the SDK itself uses, with the SDK's headers), scores and reads through the SDK's
``LangfuseAPI`` client. Nothing touches the network until something is sent.
"""

from __future__ import annotations

import base64
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from langgraph_art import ConfigError

DEFAULT_BASE_URL = "https://cloud.langfuse.com"


@dataclass(frozen=True)
class LangfuseSettings:
    """Credentials and endpoint of one Langfuse project."""

    public_key: str
    secret_key: str
    base_url: str = DEFAULT_BASE_URL
    timeout: float = 10.0
    environment: str | None = None

    @classmethod
    def configured(cls) -> bool:
        """True when ``LANGFUSE_PUBLIC_KEY`` and ``LANGFUSE_SECRET_KEY`` are both set."""
        return bool(os.environ.get("LANGFUSE_PUBLIC_KEY") and os.environ.get("LANGFUSE_SECRET_KEY"))

    @staticmethod
    def sdk_installed() -> bool:
        return importlib.util.find_spec("langfuse") is not None

    @classmethod
    def resolve(
        cls,
        public_key: str | None = None,
        secret_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        environment: str | None = None,
    ) -> LangfuseSettings:
        """Arguments first, then ``LANGFUSE_PUBLIC_KEY``/``LANGFUSE_SECRET_KEY``/``LANGFUSE_BASE_URL`` (or the older
        ``LANGFUSE_HOST``)/``LANGFUSE_TIMEOUT``/``LANGFUSE_TRACING_ENVIRONMENT``."""
        if not cls.sdk_installed():
            raise ConfigError("the Langfuse integration needs the SDK: pip install 'langfuse>=5,<6'")
        public_key = public_key or os.environ.get("LANGFUSE_PUBLIC_KEY")
        secret_key = secret_key or os.environ.get("LANGFUSE_SECRET_KEY")
        missing = [n for n, v in (("LANGFUSE_PUBLIC_KEY", public_key), ("LANGFUSE_SECRET_KEY", secret_key)) if not v]
        if missing:
            raise ConfigError(
                f"Langfuse is not configured: set {' and '.join(missing)} (from your Langfuse project's settings, "
                "'API keys'), and LANGFUSE_BASE_URL unless you use Langfuse Cloud EU; or pass public_key=, "
                "secret_key=, base_url="
            )
        url = base_url or os.environ.get("LANGFUSE_BASE_URL") or os.environ.get("LANGFUSE_HOST") or DEFAULT_BASE_URL
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"LANGFUSE_BASE_URL must start with http:// or https://, got {url!r}")
        if timeout is None:
            raw = os.environ.get("LANGFUSE_TIMEOUT", "10")
            try:
                timeout = float(raw)
            except ValueError as exc:
                raise ConfigError(f"LANGFUSE_TIMEOUT must be a number of seconds, got {raw!r}") from exc
        if timeout <= 0:
            raise ConfigError(f"the Langfuse timeout must be > 0 seconds, got {timeout}")
        environment = environment or os.environ.get("LANGFUSE_TRACING_ENVIRONMENT") or None
        return cls(str(public_key), str(secret_key), url.rstrip("/"), float(timeout), environment)

    def headers(self) -> dict[str, str]:
        """The headers the SDK sends with traces (basic auth plus ``x-langfuse-*``)."""
        from langfuse import __version__ as sdk_version

        token = base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode("ascii")
        return {
            "Authorization": f"Basic {token}",
            "x-langfuse-sdk-name": "python",
            "x-langfuse-sdk-version": sdk_version,
            "x-langfuse-public-key": self.public_key,
            "x-langfuse-ingestion-version": "4",
        }

    def span_exporter(self) -> Any:
        """An OTLP/HTTP span exporter for this project (gzip, retries 429/5xx within ``timeout``)."""
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(
            endpoint=f"{self.base_url}/api/public/otel/v1/traces",
            headers=self.headers(),
            timeout=self.timeout,
            compression=Compression.Gzip,
        )

    def api(self) -> Any:
        """The SDK's REST client (``langfuse.api.LangfuseAPI``) for scores and reads."""
        from langfuse import __version__ as sdk_version
        from langfuse.api import LangfuseAPI

        return LangfuseAPI(
            base_url=self.base_url,
            username=self.public_key,
            password=self.secret_key,
            x_langfuse_sdk_name="python",
            x_langfuse_sdk_version=sdk_version,
            x_langfuse_public_key=self.public_key,
            timeout=self.timeout,
        )
