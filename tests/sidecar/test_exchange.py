"""Request ids: the client's own when it is a plausible id, else a new one that no other
request of this process or of a forked worker gets."""

from __future__ import annotations

import os
import re

from context_ceiling.sidecar.exchange import request_id


def test_a_plausible_client_id_is_kept_and_anything_else_replaced() -> None:
    assert request_id("req-42:abc/def") == "req-42:abc/def"
    for bad in (None, "", "x" * 129, "a\nb", "ok id"):
        new = request_id(bad)
        assert re.fullmatch(r"[0-9a-f]{32}", new), (bad, new)


def test_new_ids_are_unique_and_a_forked_worker_draws_its_own() -> None:
    ids = {request_id(None) for _ in range(20_000)}
    assert len(ids) == 20_000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: the ids it draws next, as the parent would draw them
        os.close(read)
        os.write(write, " ".join(request_id(None) for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = set(f.read().split())
    os.waitpid(pid, 0)
    parent = {request_id(None) for _ in range(50)}
    assert len(child) == 50 and not child & parent
