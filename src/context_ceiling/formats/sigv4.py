"""AWS Signature Version 4 for the requests the sidecar forwards (and the sweep sends), through
botocore's signer: a SigV4 signature covers the host, the path and the body, so a request sent to
another host than the client signed for, or with a body the sidecar changed, is signed again with
the sidecar's own credentials.

Credentials come from the standard AWS chain (environment, shared files, SSO, the container's or
instance's role), read once and refreshed by botocore as they expire. botocore is an extra
(``context-ceiling[bedrock]``), imported on the first request that needs it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from context_ceiling.formats.base import SigningRefused

__all__ = ["SigV4Signer"]

#: the client's signature headers: replaced when the sidecar signs
_SIGNATURE_HEADERS = frozenset(
    {"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"}
)


class SigV4Signer:
    """Signs requests to one AWS service (``service``). The region is the upstream host's (the
    first group of ``region_host``), else the chain's (``AWS_REGION``; ``where``: how to give
    it, in the refusal's words). A request with an API key (``Authorization: Bearer``) is not
    signed: the key does not cover the body. ``missing``: the refusal when botocore is not
    installed."""

    #: seconds before a chain that found no credentials is asked again
    retry_after = 60.0

    def __init__(
        self, service: str, region_host: re.Pattern[str], where: str, missing: str
    ) -> None:
        self.service = service
        self.region_host = region_host
        self.where = where
        self.missing = missing
        self._lock = threading.Lock()
        self._session: Any = None
        self._credentials: Any = None
        self._looked_at = -1e18

    def reset(self) -> None:
        """Forget the credentials read: the chain is asked again on the next request (after
        the process's AWS environment changed)."""
        with self._lock:
            self._session = self._credentials = None
            self._looked_at = -1e18

    def _chain(self) -> tuple[Any, Any]:
        with self._lock:
            if self._credentials is None and time.monotonic() - self._looked_at > self.retry_after:
                self._looked_at = time.monotonic()
                try:
                    import botocore.session
                except ImportError:
                    raise SigningRefused(self.missing, 502, "unreachable") from None
                self._session = botocore.session.get_session()
                self._credentials = self._session.get_credentials()
            return self._session, self._credentials

    def _region(self, host: str, session: Any) -> str:
        m = self.region_host.match(host)
        region = (
            m.group(1)
            if m
            else os.environ.get("AWS_REGION")
            or (session.get_config_variable("region") if session is not None else None)
        )
        if not region:
            raise SigningRefused(
                f"cannot tell the AWS region to sign for: {self.where} or set AWS_REGION",
                502,
                "unreachable",
            )
        return str(region)

    def sign(
        self,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        changed: bool,
        method: str = "POST",
    ) -> list[tuple[str, str]]:
        auth = next((v for k, v in headers if k.lower() == "authorization"), "")
        if auth.lower().startswith("bearer "):
            return headers  # an API key goes as sent
        session, credentials = self._chain()
        if credentials is None:
            if changed:
                raise SigningRefused(
                    "context-ceiling changed this request to fit its ceiling, and a SigV4 "
                    "signature covers the body: it has no AWS credentials to sign the changed "
                    "request (give the sidecar credentials through the standard AWS chain, or "
                    "use mode observe); the request was not forwarded"
                )
            return headers  # the client's signature, as sent
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=url, data=body)
        for k, v in headers:
            if k.lower() not in _SIGNATURE_HEADERS:
                request.headers[k] = v
        region = self._region(urlsplit(url).hostname or "", session)
        SigV4Auth(credentials.get_frozen_credentials(), self.service, region).add_auth(request)
        return [(k, str(v)) for k, v in request.headers.items()]
