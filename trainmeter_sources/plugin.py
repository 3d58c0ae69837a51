"""The built-in sources, registered through the same ``trainmeter`` entry point group a third-party plugin uses:
the host and GPU samplers, the ``server`` platform adapter, and ``tm doctor``.

Imports stay inside the hooks: loading the plugin list must not import NVML code or the samplers.
"""

from __future__ import annotations

from trainmeter_core import hookimpl


@hookimpl
def trainmeter_components():
    from trainmeter_sources.gpu.sampler import GpuSampler
    from trainmeter_sources.host_sampler import HostSampler

    return [HostSampler, GpuSampler]


@hookimpl
def trainmeter_platform_adapters():
    from trainmeter_core.model.platform_adapters import ServerAdapter

    return {ServerAdapter.name: ServerAdapter}


@hookimpl
def trainmeter_commands():
    from trainmeter_sources.doctor import DoctorCommand

    return [DoctorCommand()]
