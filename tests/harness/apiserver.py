"""``FakeApiserver``: the paged lists an audit reads, served from memory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from webhook.audit.clusteraudit import ContinueExpired, Listing


class FakeApiserver:
    """``fetch`` as the apiserver answers a paged list: raw JSON, items without kind
    and apiVersion, in key order, a continue token while more remain; optionally a 410
    for the continue tokens of the ``expire``-th pages (1-based, counting every request)."""

    def __init__(
        self, objects: dict[str, list[dict[str, Any]]], expire: frozenset[int] = frozenset()
    ):
        self.objects, self.expire = objects, expire
        self.queries: list[tuple[str, dict[str, str]]] = []

    def __call__(self, listing: Listing, namespace: str | None, query: Mapping[str, str]) -> bytes:
        self.queries.append((listing.kind, dict(query)))
        if "continue" in query and len(self.queries) in self.expire:
            raise ContinueExpired("410")
        items = sorted(
            self.objects.get(listing.kind, []),
            key=lambda o: f"{o['metadata']['namespace']}/{o['metadata']['name']}",
        )
        start = int(query.get("continue", "0"))
        end = start + int(query["limit"])
        page = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
        token = str(end) if end < len(items) else ""
        body = {"kind": f"{listing.kind}List", "metadata": {"continue": token}}
        return json.dumps({**body, "items": page[start:end]}).encode()
