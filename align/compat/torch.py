"""torch's private code that align uses: a DTensor's local shard, as FSDP2 keeps it."""

from __future__ import annotations

from typing import Any

from align.compat.versions import check_version

WRITTEN_FOR = ">=2.13,<2.14"
check_version("torch", WRITTEN_FOR)


def local_shard(param: Any) -> Any:
    """The tensor a DTensor parameter holds on this rank, itself: `to_local()` may hand back an autograd
    view instead, and FSDP2's lazy init takes each parameter's sharded data from this attribute."""
    return param._local_tensor


def replace_local_shard(param: Any, tensor: Any) -> None:
    """Put `tensor` in place of a DTensor parameter's local shard, as FSDP2 itself does when it pads one:
    there is no public setter."""
    param._local_tensor = tensor
