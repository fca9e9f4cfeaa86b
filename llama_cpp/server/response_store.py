"""The Responses API's stored responses (``store: true``), in memory and bounded.

A stored response keeps its ``response`` object and the conversation that produced it (its input
items after those of its ``previous_response_id``), so that a later request can continue from it.
Entries are kept least recently used first and evicted past ``max_count`` responses or
``max_bytes`` (their JSON size); one over ``max_bytes`` alone is not kept. Each entry belongs to the
API key that created it (a hash of the key): another key's lookups find nothing, exactly as for an id
that never existed, so that ids tell nothing across keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("llama_cpp.server")


def owner_of(key: str | None) -> str:
    """The owner a request's API key stands for (a full hash: the key itself is never kept)."""
    return hashlib.sha256((key or "").encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredResponse:
    owner: str
    response: dict[str, Any]
    conversation: list[dict[str, Any]]  # the input items it answered, previous responses' included
    size: int

    @property
    def items(self) -> list[dict[str, Any]]:
        """The conversation a continuation starts from: its input items, then its output items
        (the instructions are not carried over, as OpenAI's API does not)."""
        return self.conversation + list(self.response.get("output") or [])


class ResponseStore:
    """Stored responses by id, per owner, least recently used evicted first (thread-safe)."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_count > 0 and self.max_bytes > 0

    def put(self, owner: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> bool:
        """Keep ``response``; False when it alone exceeds the byte limit (or storing is off)."""
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if not self.enabled or size > self.max_bytes:
            if self.enabled:
                log.warning("response %s (%d bytes) exceeds responses_store_mb: not stored", response["id"], size)
            return False
        entry = StoredResponse(owner, response, conversation, size)
        with self._lock:
            old = self._entries.pop(response["id"], None)
            if old is not None:
                self.bytes -= old.size
            self._entries[response["id"]] = entry
            self.bytes += size
            while len(self._entries) > self.max_count or self.bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.bytes -= dropped.size
                self.evicted += 1
        return True

    def get(self, owner: str, rid: str) -> StoredResponse | None:
        """The response ``rid`` of ``owner`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(rid)
            if entry is None or entry.owner != owner:
                return None
            self._entries.move_to_end(rid)
            return entry

    def delete(self, owner: str, rid: str) -> bool:
        with self._lock:
            entry = self._entries.get(rid)
            if entry is None or entry.owner != owner:
                return False
            del self._entries[rid]
            self.bytes -= entry.size
            return True


__all__ = ["ResponseStore", "StoredResponse", "owner_of"]
