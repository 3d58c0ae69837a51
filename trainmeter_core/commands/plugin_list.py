"""``tm plugins``: every plugin loaded, its distribution and version, and what it provides."""

from __future__ import annotations

from trainmeter_core.commands.stdout_lines import Output
from trainmeter_core.commands.usage import parser_for


def cmd_plugins(argv: list[str]) -> int:
    from trainmeter_core import plugins as plugins_mod

    parser = parser_for("plugins", "Every plugin loaded, its distribution and version, and what it provides.")
    parser.add_argument("--json", action="store_true", help="one JSON object per plugin")
    args = parser.parse_args(argv)
    infos = plugins_mod.load(plugins_mod.GROUP).infos + plugins_mod.load(plugins_mod.AGENT_GROUP).infos
    out = Output()
    for info in infos:
        if args.json:
            import msgspec

            out.line(msgspec.json.encode(info).decode())
            continue
        dist = f"{info.distribution or '?'} {info.version or ''}".strip()
        if info.error:
            out.line(f"{info.name:<16} {info.group:<17} {dist:<24} FAILED: {info.error}")
        else:
            out.line(f"{info.name:<16} {info.group:<17} {dist:<24} {', '.join(info.provides) or '-'}")
    return 0
