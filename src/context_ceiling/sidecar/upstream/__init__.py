"""The upstream plumbing: the transport and client, reading bodies, relaying streams event by event, and every route the sidecar passes through."""
