"""Ray's private code that align's driver uses: resources per node, the driver's signal handler and
printer, the embedded head's settings, and a logger's name. Ray is imported only inside the functions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from align.compat.versions import check_version

WRITTEN_FOR = ">=2.60,<2.61"
check_version("ray", WRITTEN_FOR)

PACKAGING_LOGGER = "ray._private.runtime_env.packaging"
"""The logger that says a line for every folder a job's runtime environment packs."""


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """What each live node has free now, by node id: Ray's public calls give the cluster's sum only (its
    state API needs the dashboard)."""
    import ray

    return ray._private.state.available_resources_per_node()


def total_resources_per_node() -> dict[str, dict[str, float]]:
    """Each live node's total resources, by node id."""
    import ray

    return ray._private.state.total_resources_per_node()


def embedded_head_settings(node_ip_address: str, system_config: dict[str, Any]) -> dict[str, Any]:
    """`ray.init`'s keywords for the node's address and the head's system config, both private."""
    return {"_node_ip_address": node_ip_address, "_system_config": system_config}


@contextmanager
def no_sigterm_handler() -> Iterator[None]:
    """Meanwhile, `ray.init` installs no SIGTERM handler of its own (Ray's: `sys.exit(15)`, no word): it
    sets it through this module function, replaced by one that does nothing, and put back after."""
    import ray._private.utils as ray_utils

    installs = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda _ray_handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = installs


def print_driver_lines_with(write: Callable[[dict[str, Any], bool], None]) -> None:
    """Make `write(data, ignore_prefix)` the printer of the lines Ray shows on the driver (`data["lines"]`
    from `data["pid"]`); Ray has no setting for these (`log_to_driver` covers only the workers' output)."""
    import ray._private.worker as ray_worker

    ray_worker.print_to_stdstream = write


@dataclass(frozen=True)
class TrialStandIn:
    """A variant as ASHA knows it when driven without a Tuner: in ray 2.60 ASHA reads nothing of a trial but
    its `trial_id`, and nothing of the controller it is handed (None here)."""

    trial_id: str


def asha_add(asha: Any, trial_id: str) -> None:
    asha.on_trial_add(None, TrialStandIn(trial_id))


def asha_says_stop(asha: Any, trial_id: str, result: dict[str, Any]) -> bool:
    """Whether ASHA stops the trial at this result (its `time_attr` and metric among the keys)."""
    from ray.tune.schedulers import TrialScheduler

    return asha.on_trial_result(None, TrialStandIn(trial_id), result) == TrialScheduler.STOP


def asha_remove(asha: Any, trial_id: str) -> None:
    asha.on_trial_remove(None, TrialStandIn(trial_id))
