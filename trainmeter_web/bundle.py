"""One self-contained HTML file from a page of the dashboard: its ES modules joined into one script in import order,
its stylesheet and icon inline, and the documents the page would fetch carried in the file (``tm report``,
``tm compare -o``). The page's own code runs unchanged: there is no second implementation of any part.

It reads only the package's static files. The file it makes loads nothing from anywhere (its Content-Security-Policy
tells the browser so, with the hashes of its one script and one stylesheet), links nothing that needs a server (a page
that does is refused), and carries the run's strings as JSON that the page shows as text only.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

#: ``import { a, b as c } from "./name.js";``: the one form of import the static modules use.
_IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./([A-Za-z0-9_-]+\.js)";[ \t]*$', re.M)
_ANY_IMPORT = re.compile(r"^\s*import\b", re.M)
_EXPORT = re.compile(r"^export\s+((?:async\s+)?function\*?|class|const|let|var)\s+([A-Za-z_$][\w$]*)", re.M)
_OTHER_EXPORT = re.compile(r"^\s*export\b", re.M)
_STATIC_REF = re.compile(r'(src|href)="/static/([A-Za-z0-9_.-]+)"')
#: A reference a file cannot follow: one to the server's own paths (``/api/...``) or to another host.
_SERVER_LINK = re.compile(r'\b(src|href|action)="(/[^"]*|[a-z][a-z0-9+.-]*://[^"]*)"', re.I)
_EMBEDDED = re.compile(r"<(script|style)\b[^>]*>.*?</\1>", re.S | re.I)
_encoder = msgspec.json.Encoder()


class BundleError(ValueError):
    """A static module the bundler cannot join faithfully (a form of import or export it does not rewrite)."""


def static_files() -> dict[str, str]:
    """The page's text files by name (the same files the dashboard serves)."""
    root = resources.files("trainmeter_web") / "static"
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in root.iterdir()
        if entry.is_file() and Path(entry.name).suffix in (".js", ".css", ".html", ".svg")
    }


def _module_name(file_name: str) -> str:
    return "__tm_" + re.sub(r"\W", "_", file_name[: -len(".js")])


def _imports(source: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(file, [(exported name, local name)]) for each import of a module, in order."""
    out = []
    for match in _IMPORT.finditer(source):
        names = []
        for part in match.group(1).split(","):
            words = part.split()
            if not words:
                continue
            if len(words) == 1:
                names.append((words[0], words[0]))
            elif len(words) == 3 and words[1] == "as":
                names.append((words[0], words[2]))
            else:
                raise BundleError(f"cannot read the import of {part.strip()!r} from {match.group(2)}")
        out.append((match.group(2), names))
    return out


def _order(files: dict[str, str], entry: str) -> list[str]:
    """The modules ``entry`` needs, each after the ones it imports."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise BundleError(f"{name} imports itself through other modules: the bundle needs an order")
        if name not in files:
            raise BundleError(f"no static module {name}")
        visiting.add(name)
        for dependency, _ in _imports(files[name]):
            visit(dependency)
        visiting.discard(name)
        order.append(name)

    visit(entry)
    return order


def _wrap(name: str, source: str) -> str:
    """One module as a function of the modules before it: its imports become constants, its exports the result."""
    imports = _imports(source)
    body = _IMPORT.sub("", source)
    if _ANY_IMPORT.search(body):
        raise BundleError(f'{name}: only `import {{ ... }} from "./x.js";` can be bundled')
    exported = []
    for match in _EXPORT.finditer(body):
        if match.group(1) in ("let", "var"):
            # A rebound `let` would be seen by importers as it was when the module ran: not what a module does.
            raise BundleError(
                f"{name}: `export {match.group(1)} {match.group(2)}` cannot be bundled (use const)"
            )
        exported.append(match.group(2))
    body = _EXPORT.sub(lambda m: f"{m.group(1)} {m.group(2)}", body)
    if _OTHER_EXPORT.search(body):
        raise BundleError(f"{name}: only `export function|class|const NAME` can be bundled")
    head = "".join(
        f"const {{ {', '.join(e if e == local else f'{e}: {local}' for e, local in names)} }} = "
        f"{_module_name(dependency)};\n"
        for dependency, names in imports
    )
    return (
        f"// ---- {name}\nconst {_module_name(name)} = (() => {{\n{head}{body.strip()}\n"
        f"return {{ {', '.join(exported)} }};\n}})();\n"
    )


def bundle(files: dict[str, str], entry: str) -> str:
    """The entry module and every module it imports, as one script (for ``<script type="module">``)."""
    script = "".join(_wrap(name, files[name]) for name in _order(files, entry))
    if re.search(r"</script|<!--", script, re.I):
        raise BundleError("a static module holds `</script` or `<!--`, which would end the inline script")
    return script


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def carried_json(data: Any) -> str:
    """JSON for ``<script type="application/json">``: every ``<`` escaped, so no string of the run ends the element."""
    return _encoder.encode(data).decode().replace("<", "\\u003c")


def standalone_html(page: str, entry: str, data: Any, files: dict[str, str] | None = None) -> str:
    """``page`` (an HTML file of the static folder) with ``entry``'s bundle, the stylesheet and icons inline, and
    ``data`` carried for the page's scripts (``source.js`` reads it)."""
    files = static_files() if files is None else files
    html = files[page]
    script = bundle(files, entry)
    css = files["style.css"]
    csp = (
        f"default-src 'none'; script-src {_hash(script)}; style-src {_hash(css)}; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    html = re.sub(
        r'<link rel="stylesheet" href="/static/style.css">', lambda _: f"<style>{css}</style>", html
    )
    html = re.sub(
        r'<script type="module" src="/static/[A-Za-z0-9_.-]+\.js"></script>',
        lambda _: (
            f'<script type="application/json" id="tm-data">{carried_json(data)}</script>\n'
            f'<script type="module">{script}</script>'
        ),
        html,
    )

    def inline(match: re.Match) -> str:
        name = match.group(2)
        if not name.endswith(".svg") or name not in files:
            raise BundleError(f"{page} refers to /static/{name}, which a file cannot carry")
        encoded = base64.b64encode(files[name].encode()).decode()
        return f'{match.group(1)}="data:image/svg+xml;base64,{encoded}"'

    html = _STATIC_REF.sub(inline, html)
    html = html.replace(
        '<meta charset="utf-8">',
        f'<meta charset="utf-8">\n<meta http-equiv="Content-Security-Policy" content="{csp}">',
        1,
    )
    if 'id="tm-data"' not in html or "Content-Security-Policy" not in html:
        raise BundleError(f"{page} has no module script or no charset to replace")
    server_link = _SERVER_LINK.search(_EMBEDDED.sub("", html))
    if server_link:
        raise BundleError(
            f"{page} links {server_link.group(2)}, which needs a server: a file cannot follow it"
        )
    return html
