"""The plugin's hooks: one profiler importer. Nothing is imported until tm asks for it."""

from trainmeter_core.api import hookimpl


@hookimpl
def trainmeter_profiler_importers():
    from trainmeter_nsys.importer import NsysImporter

    return [NsysImporter()]
