"""Variants measured in turn, run after run, so that whatever else loads the machine meanwhile falls on
each alike; and their figures as markdown table rows."""

from __future__ import annotations

from collections.abc import Callable


def alternating(
    variants: list[str], repeats: int, measure: Callable[[str], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """`measure(variant)` for each variant in turn, `repeats` times over; each result printed as it comes."""
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for repeat in range(repeats):
        for name in variants:
            results[name].append(measure(name))
            print(f"run {repeat + 1} {name}: {results[name][-1]}", flush=True)
    return results


def table_rows(
    results: dict[str, list[dict[str, float]]], keys: tuple[str, ...], summary: Callable[[list[float]], str]
) -> list[str]:
    """`| variant | summary of each key over its runs |`, a row per variant."""
    return [
        f"| {name} | " + " | ".join(summary([run[key] for run in runs]) for key in keys) + " |"
        for name, runs in results.items()
    ]
