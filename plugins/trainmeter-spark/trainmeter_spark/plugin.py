"""The plugin tm loads through the ``trainmeter`` entry point: the ``spark`` adapter and the GB10 spec file.

Nothing in tm names this plugin; installing the distribution is what makes tm find it.
"""

from __future__ import annotations

from pathlib import Path

from trainmeter_core.api import hookimpl

SPECS = Path(__file__).resolve().parent / "specs"


@hookimpl
def trainmeter_platform_adapters():
    from trainmeter_spark.adapter import SparkAdapter

    return {SparkAdapter.name: SparkAdapter}


@hookimpl
def trainmeter_device_specs():
    return [SPECS / "gb10.json"]
