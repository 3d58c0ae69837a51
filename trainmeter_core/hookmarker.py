"""The one marker of hook implementations, ``hookimpl``, shared by tm's own processes, every plugin and the tracker
taps that load inside the training process.

It sets on a function exactly the attribute pluggy's ``HookimplMarker("trainmeter")`` would, so pluggy registers
what it marked, but it imports nothing at all: a training process must never pay for pluggy. Never import here.
"""

from __future__ import annotations

#: The pluggy project name: hooks are ``trainmeter_*`` and a marked function carries ``trainmeter_impl``.
PROJECT = "trainmeter"
_ATTRIBUTE = PROJECT + "_impl"


def hookimpl(
    function=None,
    *,
    hookwrapper: bool = False,
    optionalhook: bool = False,
    tryfirst: bool = False,
    trylast: bool = False,
    specname: str | None = None,
    wrapper: bool = False,
):
    """Mark ``function`` as the implementation of the hook of the same name (or of ``specname``).

    ``@hookimpl`` alone or ``@hookimpl(tryfirst=True)``; the options mean what they mean to pluggy's marker
    (``tryfirst``/``trylast`` order this implementation among the others, ``wrapper``/``hookwrapper`` make it wrap
    them, ``optionalhook`` lets it name a hook tm does not have). The options are pluggy's ``HookimplOpts``, set as
    the function's ``trainmeter_impl`` attribute, which is how pluggy finds an implementation when a plugin is
    registered. The agent calls ``trainmeter_trackers`` itself, without pluggy, and reads no option.
    """

    def mark(func):
        # The same keys pluggy's HookimplOpts has (pluggy 1.3 to 1.x); tests compare the two markers key by key.
        setattr(
            func,
            _ATTRIBUTE,
            {
                "wrapper": wrapper,
                "hookwrapper": hookwrapper,
                "optionalhook": optionalhook,
                "tryfirst": tryfirst,
                "trylast": trylast,
                "specname": specname,
            },
        )
        return func

    return mark if function is None else mark(function)
