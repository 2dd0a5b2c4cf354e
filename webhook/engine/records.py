"""runguard's records on the object (the stamp, the platform record, the governing
RunPolicy), written as ``webhook.engine.subject.expected_records`` says: at CREATE, and
put back on UPDATE.
"""

from __future__ import annotations

from webhook.engine.pod import warning as warning_text
from webhook.engine.rules.stamp import OWNERSHIP_STAMP
from webhook.engine.subject import Review, expected_records
from webhook.engine.types import JSON, Change
from webhook.keys import POLICY_LABEL, REQUESTED_BY

__all__ = ["RECORDS_KEPT", "STAMPED", "record_changes", "with_records"]


STAMPED = Change(OWNERSHIP_STAMP, warning_text(f"stamped {REQUESTED_BY}"))


RECORDS_KEPT = Change(
    OWNERSHIP_STAMP,
    warning_text("runguard's records (who created it, its RunPolicy) cannot change: kept"),
)


def with_records(obj: JSON, expected: dict[str, str | None]) -> JSON | None:
    """``obj`` with runguard's records as expected, or None when it has them already."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return None
    metadata = dict(metadata)
    changed = False
    for key, value in expected.items():
        where = "labels" if key == POLICY_LABEL else "annotations"
        current = metadata.get(where)
        mapping = dict(current) if isinstance(current, dict) else {}
        if mapping.get(key) == value:
            continue
        if value is None:
            mapping.pop(key, None)
        else:
            mapping[key] = value
        metadata[where] = mapping
        changed = True
    return {**obj, "metadata": metadata} if changed else None


def record_changes(r: Review, result: JSON) -> tuple[JSON, list[Change]]:
    expected = expected_records(r)
    recorded = with_records(result, expected)
    if recorded is None:
        return result, []
    if r.old is not None:
        return recorded, [RECORDS_KEPT]
    return recorded, [STAMPED] if expected.get(REQUESTED_BY) else []
