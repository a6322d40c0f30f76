"""What a job's search may assume of the device it measures on: its caches, the space's options, the
measurement settings."""

from __future__ import annotations

from schedules.poly.caches import UNKNOWN, CacheHierarchy, host_caches, parse_cache_spec
from schedules.spaces import SpaceOptions, get_space
from tuner.entities import JobSpec, MachineLimits
from tuner.rpc.device_info import device_caches
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import is_host_cpu
from tuner.timing.profile import host_limits
from tuner.tune import MeasureConfig


def measuring_caches(settings: Settings, runs_here: bool) -> CacheHierarchy:
    """The caches of the device a job measures on when it runs here: this machine's (or the settings');
    for remote devices, the sizes the settings give for them (unknown without: no cache-based pruning)."""
    if runs_here:
        return host_caches(settings.cache_sizes)
    if settings.rpc_cache_sizes:
        return parse_cache_spec(settings.rpc_cache_sizes, source="settings (rpc devices)")
    return UNKNOWN


def job_caches(settings: Settings, spec: JobSpec) -> CacheHierarchy:
    """The caches of the job's measuring device: this machine's, or what the RPC device reports (Kiln's
    servers do) when the job's space uses them, else the settings' sizes for remote devices."""
    if spec.runner.is_local:
        return measuring_caches(settings, True)
    if spec.space is not None and get_space(spec.space).seeded:
        reported = device_caches(spec.runner, settings.rpc_timeout_s)
        if reported is not None and reported.known:
            return reported
    return measuring_caches(settings, False)


def space_options(settings: Settings, spec: JobSpec) -> SpaceOptions:
    """What the job's space may assume of the measuring device, and the settings of its hooks."""
    caches = job_caches(settings, spec)
    return SpaceOptions(caches, settings.poly_margin, settings.poly_pass_through, settings.poly_seeds)


def measure_config(settings: Settings, spec: JobSpec) -> MeasureConfig:
    """Measurement settings of a job: the service's settings plus the job's runner, cost model and space."""
    return MeasureConfig(
        number=settings.measure_number,
        repeat=settings.measure_repeat,
        min_repeat_ms=settings.measure_min_repeat_ms,
        builder_workers=settings.builder_workers,
        trials_per_iter=settings.num_trials_per_iter,
        population_size=settings.search_population,
        default_schedules=settings.default_schedules,
        cost_model=spec.cost_model,
        runner=spec.runner,
        rpc_servers=settings.rpc_servers_per_job,
        space=spec.space,
        space_options=space_options(settings, spec),
    )


def measuring_host_limits(store: Store, spec: JobSpec) -> MachineLimits | None:
    """This machine's roofs when the job measures its candidates here (the scheduler's rooflines), measured
    once per host and kept."""
    if spec.runner.kind != "local" or not is_host_cpu(spec.target):
        return None
    return host_limits(store, spec.target)
