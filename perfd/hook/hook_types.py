"""The step hook's typed arguments and its health counters, apart from the hook itself
(perfd/hook/step.py): the framework callbacks (hf.py, lightning.py) take the arguments to pass on
without importing the hook's machinery, and the counters are what tests and a job's logs read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    from perfd.core.model import ModelSpec
    from perfd.hook.jobinfo import DeviceMesh
    from perfd.hook.profile import ProfilerControl
    from perfd.hook.timing import MarkerFactory


class StepHookOptions(TypedDict, total=False):
    """:class:`StepHook`'s arguments, for the framework callbacks that make one (``**hook_kwargs``)."""

    socket_path: str | None
    warmup_steps: int
    tokens_per_step: float | None
    flops_per_step: float | None
    cuda: bool
    rank: int | None
    window: int
    pool_size: int
    marker_factory: MarkerFactory | None
    profiler: ProfilerControl | None
    enabled: bool | None
    flush_interval_s: float
    batch_records: int
    cuda_data_event: bool
    harvest_interval_s: float | None
    model: ModelSpec | Mapping[str, object] | None
    dtype: str | None
    layout: Mapping[str, int] | None
    mesh: DeviceMesh | None
    device_uuid: str | None
    watch_dataloader: bool


class HookCounters(TypedDict):
    """:meth:`StepHook.counters`: the hook's own health, for tests and a job's logs."""

    steps_begun: int
    steps_reported: int
    pending: int
    batched: int
    harvest_drops: int
    unpaired: int
    internal_errors: int
    alias_misses: int
    sent: int
    send_drops: int
    send_drop_reasons: dict[str, int]
    cuda: bool
    profiling: bool
    last_error: str | None
    cuda_api: Literal["driver", "torch"] | None
    cuda_driver_errors: int
    harvester: Literal["thread", "inline"]
    harvest_passes: int
    harvest_cpu_ns: int
    queries: int
    held: int
    delivered_late: int
    step_arg_errors: int
    control_refused: int
    device_uuid: str | None
