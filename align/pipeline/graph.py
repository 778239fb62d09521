"""Stage references (`${stages.NAME.output}`) -> a dependency graph, ordered, with no cycles."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from align.errors import Problem

REFERENCE = re.compile(r"\$\{stages\.([A-Za-z_][A-Za-z0-9_-]*(?:\[[^\]]*\])?)\.output\}")
"""`${stages.NAME.output}`; a sweep's variant of a stage is `NAME[beta=0.1]` (align/pipeline/sweep.py)."""


def strings(value: Any, path: str) -> list[tuple[str, str]]:
    """Every string in a nested config value with its dotted path."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [pair for key, item in value.items() for pair in strings(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [pair for index, item in enumerate(value) for pair in strings(item, f"{path}[{index}]")]
    return []


def reference_target(value: str) -> str | None:
    """The stage a whole-value reference points at, or None for a plain string."""
    match = REFERENCE.fullmatch(value.strip())
    return match.group(1) if match else None


def references(
    stages: dict[str, Any], named: Collection[str] | None = None
) -> tuple[dict[str, list[str]], list[Problem]]:
    """For each stage, the stages whose outputs it reads; plus problems with malformed or unknown ones.
    `named`: every stage the file names (default: `stages`), those whose own problems keep them out of
    `stages` too: a reference to one of them is not unknown, and waits for it."""
    named = stages if named is None else named
    edges: dict[str, list[str]] = {}
    problems = []
    for name, stage in stages.items():
        edges[name] = []
        for path, value in strings(stage.model_dump(exclude_defaults=True), f"stages.{name}"):
            if "${" not in value:
                continue
            target = reference_target(value)
            if target is None:
                problems.append(
                    Problem(
                        path,
                        f"{value!r} is not a reference; write the whole value as ${{stages.NAME.output}}",
                    )
                )
            elif target not in named:
                problems.append(
                    Problem(path, f"refers to unknown stage '{target}'; stages: {', '.join(named)}")
                )
            elif target == name:
                problems.append(Problem(path, "a stage cannot consume its own output"))
            elif target in stages and target not in edges[name]:
                edges[name].append(target)
    return edges, problems


def order(edges: dict[str, list[str]]) -> tuple[list[str], list[Problem]]:
    """Stages so that each comes after those it reads, keeping file order where free; cycles are problems."""
    done: list[str] = []
    pending = list(edges)
    while pending:
        ready = next((name for name in pending if all(dep in done for dep in edges[name])), None)
        if ready is None:
            cycle = find_cycle(edges, pending)
            return done, [Problem(f"stages.{cycle[0]}", f"stages form a cycle: {' -> '.join(cycle)}")]
        done.append(ready)
        pending.remove(ready)
    return done, []


def find_cycle(edges: dict[str, list[str]], pending: list[str]) -> list[str]:
    """Follow unresolved dependencies from a pending stage until one repeats."""
    path = [pending[0]]
    while True:
        step = next(dep for dep in edges[path[-1]] if dep in pending)
        if step in path:
            return path[path.index(step) :] + [step]
        path.append(step)


def downstream(edges: dict[str, list[str]], roots: set[str]) -> set[str]:
    """`roots` and every stage that reads from them, directly or not."""
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for name, deps in edges.items():
            if name not in found and found.intersection(deps):
                found.add(name)
                changed = True
    return found


def upstream(edges: dict[str, list[str]], roots: set[str]) -> set[str]:
    """`roots` and every stage they read from, directly or not."""
    found = set(roots)
    stack = list(roots)
    while stack:
        for dep in edges[stack.pop()]:
            if dep not in found:
                found.add(dep)
                stack.append(dep)
    return found
