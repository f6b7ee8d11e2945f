"""The upstreams a sidecar sends to, built once from its settings: one pooled client per default
upstream (keyed by the API it speaks) and per named upstream, and the rule that picks one for a
request. The proxy, the pass-through and the probes share this object; none of them needs the
rest of the sidecar's state to route a request.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from context_ceiling.core.models import ModelSpec
from context_ceiling.core.vocabulary import Api, Shape
from context_ceiling.formats import format_of
from context_ceiling.formats.base import Format
from context_ceiling.sidecar.config import Upstream, Upstreams
from context_ceiling.sidecar.upstream.client import UpstreamClient

__all__ = ["Target", "UpstreamPool"]

#: where a request goes: (the upstream's name, its client, its settings); a default upstream's
#: name is its API's
Target = tuple[str, UpstreamClient, Upstream]


class UpstreamPool:
    """Every configured upstream with its client. ``clients``: the defaults by API; ``named``:
    name -> (the API it speaks, its client, its settings)."""

    __slots__ = ("clients", "named", "settings")

    def __init__(
        self, upstreams: Upstreams, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = upstreams
        self.clients: dict[Api, UpstreamClient] = {
            api: UpstreamClient(up, transport) for api, up in upstreams.defaults().items()
        }
        self.named: dict[str, tuple[Api, UpstreamClient, Upstream]] = {
            name: (up.api, UpstreamClient(up, transport), up)
            for name, up in upstreams.named.items()
        }

    def serves(self, api: Api) -> bool:
        """Whether any upstream (the API's default or a named one) takes this API's requests."""
        return api in self.clients or any(a == api for a, _, _ in self.named.values())

    def route(self, api: Api, upstream: str | None) -> Target | None:
        """Where a request of this API for a model served by ``upstream`` (None: the API's
        default) goes, or None when there is no such upstream (or the named one speaks another
        API)."""
        if upstream is None or upstream == api:
            client = self.clients.get(api)
            if client is None:
                return None
            up = self.settings.of(api)
            assert up is not None  # a client exists only for a configured upstream
            return api, client, up
        found = self.named.get(upstream)
        if found is None or found[0] != api:
            return None
        return upstream, found[1], found[2]

    def native_ok(self, shape: Shape | Format, spec: ModelSpec | None) -> bool:
        """Whether the upstream this request goes to is the provider's own API, whose context
        management ``strategy: auto`` may use (Anthropic's for messages, OpenAI's or Azure
        OpenAI's for the Responses API)."""
        fmt = format_of(shape)
        if fmt.native is None:
            return False
        found = self.route(fmt.api, spec.upstream if spec is not None else None)
        if found is None:
            return False
        return fmt.native.served_by(urlsplit(found[2].base_url).hostname or "")

    def marked(self, flag: str | None) -> str | None:
        """The first named upstream whose settings set ``flag`` (a provider's
        :attr:`~context_ceiling.formats.base.Provider.marked_by`: ``azure``); None without one."""
        if flag is None:
            return None
        return next((n for n, (_, _, up) in self.named.items() if getattr(up, flag, False)), None)

    def all_clients(self) -> dict[str, httpx.AsyncClient]:
        """Every upstream by name (the defaults under their API's name)."""
        out: dict[str, httpx.AsyncClient] = {str(k): c for k, c in self.clients.items()}
        out.update({name: c for name, (_, c, _) in self.named.items()})
        return out

    async def aclose(self) -> None:
        for client in self.all_clients().values():
            await client.aclose()
