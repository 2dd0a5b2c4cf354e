"""Every decision the engine makes on the tests' inputs, recorded or compared.

The tool is here, beside the inputs it is made of, so that the tests
(``tests/test_decisions_tool.py``, ``tests/engine/test_receipts.py``) and the command
(``bench/decisions.py``, which runs ``main``) share it.

What a change meant only to make the engine faster must leave alone: for every workload
object of the declarative cases and the platform fixtures, under every test policy and
the shipped one, as nobody, a user and the platform (``corpus``, ``contexts``), for
generated Pods (``harness.pod_strategies``' strategy, derandomized) and for
the fuzz corpus's objects (``harness.fuzz``, derandomized): ``mutate`` (its object,
JSON Patch, warnings and changes), ``validate`` of the input and of ``mutate``'s
result, with and without the receipt, an UPDATE of the result to itself and
``evaluate``. Each decision is reduced to what the apiserver and the
audit log would see; the patch is also applied to the input and compared as an object.

The inputs are generated once and kept (``--inputs``, a pickle): Hypothesis seeds its
strings with literals it finds in the code under test, so generating them again after
a change would judge other inputs. ``--tree`` judges them with another checkout's
engine (its ``webhook`` package), e.g. the commit before a change:

    git worktree add /tmp/base <commit>
    python bench/decisions.py --inputs /tmp/in.pickle --write /tmp/before.jsonl --tree /tmp/base
    python bench/decisions.py --inputs /tmp/in.pickle --check /tmp/before.jsonl

``--check`` exits 1 on any difference and prints the first ones (``--summary``: counted
by the part of the decision that changed).

Against a commit whose policy format differs (files it cannot load), both trees judge
that commit's policy files (``--policies-from``): the directories it lacks, or a tree
cannot load, are skipped on both sides and counted:

    python bench/decisions.py --inputs /tmp/in.pickle --write /tmp/old.jsonl \
        --tree /tmp/old --policies-from /tmp/old
    python bench/decisions.py --inputs /tmp/in.pickle --check /tmp/old.jsonl \
        --policies-from /tmp/old --summary

Nothing of ``webhook`` is imported at the module's top: ``--tree`` puts another
checkout first on the import path before the engine is loaded.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

ROOT = Path(__file__).resolve().parents[2]
POLICY_DIRS = [
    *(p for p in sorted((ROOT / "tests/cases/_policies").iterdir()) if p.is_dir()),
    ROOT / "policies",
]
PLATFORM_DIR = ROOT / "tests/cases/_policies/platform"
Input = tuple[str, Any, str, int]  # name, object, policy directory, context (contexts())


def _seen(d: Any) -> dict[str, Any]:
    return {
        "kind": d.kind,
        "namespace": d.namespace,
        "name": d.name,
        "applies": d.applies,
        "allowed": d.allowed,
        "warnings": d.warnings,
        "mutations": [(c.rule, c.warning) for c in d.mutations],
        "violations": [(v.rule, v.path, v.message, str(v.amount), v.drift) for v in d.violations],
        "profile": d.profile,
        "error": type(d.error).__name__ if d.error is not None else None,
        "audit": d.audit_annotations,
        "message": d.message() if not d.allowed else "",
    }


def _patched(obj: Any, patch: list[Any]) -> Any:
    try:
        return jsonpatch.apply_patch(copy.deepcopy(obj), patch)
    except Exception as exc:  # noqa: BLE001 - recorded: a patch that does not apply
        return f"patch does not apply: {type(exc).__name__}"


def decisions(obj: Any, policy: Any, context: Any) -> dict[str, Any]:
    """What the engine answers for ``obj``, in every way the server and the CLI ask."""
    from webhook.engine import evaluate, mutate, validate
    from webhook.engine.context import Context
    from webhook.engine.receipts import LocalReceipts

    receipts = LocalReceipts()
    mutated = mutate(copy.deepcopy(obj), policy, context=context, receipts=receipts)
    out: dict[str, Any] = {
        "mutate": _seen(mutated),
        "patch": mutated.patch,
        "patched": _patched(obj, mutated.patch),
        "object": mutated.object,
        "validate_input": _seen(validate(copy.deepcopy(obj), policy, context=context)),
        "validate_receipt": _seen(
            validate(copy.deepcopy(mutated.object), policy, context=context, receipts=receipts)
        ),
        "validate_result": _seen(validate(copy.deepcopy(mutated.object), policy, context=context)),
        "evaluate": _seen(evaluate(copy.deepcopy(obj), policy, context=context)),
    }
    if isinstance(mutated.object, dict):
        update = Context(context.requester, context.state, "UPDATE")
        again = copy.deepcopy(mutated.object)
        out["update_mutate"] = _seen(
            mutate(again, policy, old=copy.deepcopy(mutated.object), context=update)
        )
        out["update_validate"] = _seen(
            validate(again, policy, old=copy.deepcopy(mutated.object), context=update)
        )
    return out


def _documents(path: Path) -> Iterator[Any]:
    try:
        yield from yaml.safe_load_all(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return


def corpus() -> list[dict[str, Any]]:
    """Every workload object of the cases and the platform fixtures (Pods and pod
    controllers, inputs and expected results alike)."""
    from webhook.engine.podspec import TEMPLATE_PATHS

    found = []
    paths = [*(ROOT / "tests/cases").rglob("*.yaml"), *(ROOT / "tests/platforms").rglob("*.yaml")]
    for path in sorted(paths):
        for doc in _documents(path):
            if isinstance(doc, dict) and doc.get("kind") in TEMPLATE_PATHS:
                found.append(doc)
    return found


def first(policy: Any) -> Any:
    """The RunPolicy tried first: ``policy.first``, or the policy itself in a tree from
    before the policy held its RunPolicies (``--tree`` may name one)."""
    return getattr(policy, "first", policy)


def contexts(policy: Any) -> list[Any]:
    """Nobody, a user and the platform."""
    from webhook.clusterstate.static import StaticClusterState
    from webhook.engine.context import NO_CONTEXT, Context, Requester

    identities = first(policy).platform.identities
    platform = identities[0] if identities else "nobody"
    if platform.startswith("serviceaccount:"):
        platform = "system:" + platform
    return [
        NO_CONTEXT,
        Context(Requester("alice", ("system:authenticated",)), StaticClusterState()),
        Context(Requester(platform), StaticClusterState()),
    ]


def generate() -> list[Input]:
    """Every input, made with this tree's tests (their corpus, strategies and fuzz texts)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from harness.fuzz import inputs as fuzz_texts
    from harness.pod_strategies import POLICY_SET, pods
    from webhook.policy.loader import load_policy

    out: list[Input] = []
    objects = corpus()
    digests = {}
    for directory in POLICY_DIRS:
        policy = load_policy(directory)
        digests[policy.digest] = str(directory.relative_to(ROOT))
        for c in range(len(contexts(policy))):
            for i, obj in enumerate(objects):
                out.append((f"corpus/{first(policy).name}/{c}/{i}", obj, digests[policy.digest], c))
    generated: list[tuple[Any, str]] = []
    quiet = {"deadline": None, "derandomize": True, "database": None}

    @settings(max_examples=300, suppress_health_check=list(HealthCheck), **quiet)
    @given(pod=pods(), policy=st.sampled_from(POLICY_SET))
    def collect(pod: Any, policy: Any) -> None:
        generated.append((copy.deepcopy(pod), digests[policy.digest]))

    collect()
    out.extend((f"generated/{i}", pod, d, 0) for i, (pod, d) in enumerate(generated))
    texts: list[str] = []

    @settings(max_examples=200, suppress_health_check=list(HealthCheck), **quiet)
    @given(text=fuzz_texts)
    def collect_texts(text: str) -> None:
        texts.append(text)

    collect_texts()
    platform = str(PLATFORM_DIR.relative_to(ROOT))
    for i, text in enumerate(texts):
        try:
            docs = list(yaml.safe_load_all(text))
        except (yaml.YAMLError, RecursionError, ValueError):
            continue
        out.extend((f"fuzz/{i}/{j}", doc, platform, 0) for j, doc in enumerate(docs[:4]))
    return out


def cases(
    inputs: list[Input], policy_root: Path | None = None
) -> Iterator[tuple[str, Any, Any, Any]]:
    """The inputs with their policy (loaded by the engine judging them) and context.

    ``policy_root``: read each policy directory from that checkout instead (two trees
    compared on the same files, e.g. an older commit's); an input whose directory is not
    there, or that the judging tree cannot load, comes with no policy (``skipped``)."""
    from webhook.policy.errors import PolicyError
    from webhook.policy.loader import load_policy

    policies: dict[str, Any] = {}
    for name, obj, directory, c in inputs:
        if directory not in policies:
            if policy_root is None:
                policies[directory] = load_policy(ROOT / directory)
            else:
                try:
                    policies[directory] = load_policy(policy_root / directory)
                except (PolicyError, OSError):
                    policies[directory] = None
        policy = policies[directory]
        yield name, obj, policy, None if policy is None else contexts(policy)[c]


def _digest(value: Any, memo: dict[int, tuple[str, int]], busy: set[int]) -> tuple[str, int]:
    """A digest of a JSON value and its size once expanded; YAML aliases make shared
    subtrees (one digest each, however often they are reached) and may make cycles."""
    if not isinstance(value, dict | list):
        return hashlib.sha256(repr((type(value).__name__, value)).encode()).hexdigest(), 1
    key = id(value)
    if key in memo:
        return memo[key]
    if key in busy:
        return "cycle", 1
    busy.add(key)
    items = value.items() if isinstance(value, dict) else enumerate(value)
    h, size = hashlib.sha256(type(value).__name__.encode()), 1
    for k, v in items:
        digest, n = _digest(v, memo, busy)
        h.update(repr(k).encode() + digest.encode())
        size += n
    busy.discard(key)
    memo[key] = h.hexdigest(), size
    return memo[key]


def _line(name: str, seen: dict[str, Any]) -> str:
    out: dict[str, Any] = {"case": name}
    for key, value in seen.items():
        digest, size = _digest(value, {}, set())
        out[key] = digest
        if size < 5000:
            try:
                json.dumps(value, default=str)
                out[key] = value
            except ValueError:  # a cycle
                pass
    return json.dumps(out, sort_keys=True, default=str)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--inputs", type=Path, help="made here when missing; without it, made anew each run"
    )
    parser.add_argument("--tree", type=Path, help="judge with this checkout's engine")
    parser.add_argument(
        "--policies-from",
        type=Path,
        help="read the policy directories from this checkout (the same files for both "
        "trees; inputs of a directory a tree cannot load are skipped on both sides)",
    )
    parser.add_argument(
        "--summary", action="store_true", help="with --check: count the differences by field"
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, help="record every decision in this file")
    mode.add_argument("--check", type=Path, help="compare with a file --write made")
    args = parser.parse_args()
    if args.inputs is None or not args.inputs.exists():
        if args.tree:
            parser.error("make the inputs with this tree first (without --tree)")
        sys.path.insert(0, str(ROOT))
        made = pickle.dumps(generate())
        if args.inputs is not None:
            args.inputs.write_bytes(made)
    else:
        made = args.inputs.read_bytes()
    sys.path.insert(0, str(args.tree.resolve() if args.tree else ROOT))
    inputs = pickle.loads(made)  # noqa: S301 - what this script made
    lines = [
        json.dumps({"case": name, "skipped": "policy not loaded"})
        if p is None
        else _line(name, decisions(obj, p, c))
        for name, obj, p, c in cases(inputs, args.policies_from)
    ]
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    if args.write:
        args.write.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{len(lines)} inputs recorded, digest {digest}")
        return 0
    before = args.check.read_text(encoding="utf-8").splitlines()
    if len(before) != len(lines):
        print(f"{len(before)} inputs recorded, {len(lines)} now: not the same inputs")
        return 1
    skipped = sum(1 for a, b in zip(before, lines, strict=True) if _skipped(a) or _skipped(b))
    differ = [
        (a, b)
        for a, b in zip(before, lines, strict=True)
        if a != b and not (_skipped(a) or _skipped(b))
    ]
    for a, b in differ[:5]:
        old, new = json.loads(a), json.loads(b)
        keys = [k for k in old if old[k] != new.get(k)]
        print(f"{old['case']}: differs in {', '.join(keys)}")
        for k in keys[:3]:
            print(f"  before {k}: {json.dumps(old[k])[:400]}")
            print(f"  now    {k}: {json.dumps(new[k])[:400]}")
    if args.summary:
        _summarize(before, lines)
    judged = f"{len(lines)} inputs" + (
        f" ({skipped} skipped: a policy not loaded)" if skipped else ""
    )
    print(f"{judged}, {len(differ)} with another decision, digest {digest}")
    return 1 if differ else 0


def _skipped(line: str) -> bool:
    """A line recording no decision (its policy was not loaded): its own key, read as
    JSON (an object in a decision may hold the word anywhere)."""
    return '"skipped"' in line and "skipped" in json.loads(line)


def _summarize(before: list[str], now: list[str]) -> None:
    """The differences counted by the part of the decision that changed, and by the
    corpus the input comes from (corpus, generated, fuzz)."""
    by_field: dict[str, int] = {}
    for a, b in zip(before, now, strict=True):
        if a == b or _skipped(a) or _skipped(b):
            continue
        old, new = json.loads(a), json.loads(b)
        where = old["case"].split("/")[0]
        for key in sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)):
            by_field[f"{where}: {key}"] = by_field.get(f"{where}: {key}", 0) + 1
    for key, count in sorted(by_field.items()):
        print(f"  {count:6d}  {key}")


if __name__ == "__main__":
    raise SystemExit(main())
