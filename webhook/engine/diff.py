"""JSON Patch (RFC 6902) by diffing two JSON documents.

A small structural diff instead of ``jsonpatch.make_patch``: it compares subtrees with
``==`` (C speed) and descends only where they differ, which keeps a review's patch
cheap. Lists of equal length are diffed item by item; a list that grew or shrank at
the end gets ``add``/``remove`` at the end; any other list change replaces the list.
"""

from __future__ import annotations

from typing import Any

from jsonpatch import JsonPointer

JSONPatch = list[dict[str, Any]]


def _pointer(parts: list[str | int]) -> str:
    return str(JsonPointer.from_parts(parts).path)


def make_patch(src: Any, dst: Any) -> JSONPatch:
    ops: JSONPatch = []
    _diff(src, dst, [], ops)
    return ops


def _diff(src: Any, dst: Any, parts: list[str | int], ops: JSONPatch) -> None:
    if type(src) is dict and type(dst) is dict:
        for key in src:
            if key not in dst:
                ops.append({"op": "remove", "path": _pointer([*parts, key])})
            elif src[key] != dst[key]:
                _diff(src[key], dst[key], [*parts, key], ops)
        for key in dst:
            if key not in src:
                ops.append({"op": "add", "path": _pointer([*parts, key]), "value": dst[key]})
        return
    if type(src) is list and type(dst) is list:
        common = min(len(src), len(dst))
        if src[:common] == dst[:common] or len(src) == len(dst):
            for i in range(common):
                if src[i] != dst[i]:
                    if _renamed(src[i], dst[i]):
                        # a different named item (env var, volume): replace, don't morph
                        ops.append(
                            {"op": "replace", "path": _pointer([*parts, i]), "value": dst[i]}
                        )
                    else:
                        _diff(src[i], dst[i], [*parts, i], ops)
            for i in range(len(src) - 1, common - 1, -1):
                ops.append({"op": "remove", "path": _pointer([*parts, i])})
            for i in range(common, len(dst)):
                ops.append({"op": "add", "path": _pointer([*parts, i]), "value": dst[i]})
            return
    if src != dst or type(src) is not type(dst):
        ops.append({"op": "replace", "path": _pointer(parts), "value": dst})


def _renamed(a: Any, b: Any) -> bool:
    return type(a) is dict and type(b) is dict and a.get("name") != b.get("name")
