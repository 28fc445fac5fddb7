"""The whole extension contract of prefzoo, and nothing else.

A plugin is a module (or object) with functions named after these specs,
decorated with ``prefzoo.hookimpl``.  Third-party plugins are found through
the ``prefzoo`` entry-point group::

    [project.entry-points.prefzoo]
    my_losses = "my_package.plugin"

Built-in losses register through exactly the same hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from prefzoo.spec import LossSpec, ModifierSpec

hookspec = pluggy.HookspecMarker("prefzoo")
hookimpl = pluggy.HookimplMarker("prefzoo")


@hookspec
def prefzoo_register_losses() -> list[LossSpec]:
    """Return the losses this plugin provides.

    Called once, when the registry is first built (the first ``get_loss``,
    ``list_losses`` or ``loss_spec`` call).  Return a list of
    :class:`prefzoo.LossSpec`; each name must be unique across all plugins, or
    the registry raises an error naming both plugins.
    """


@hookspec
def prefzoo_register_judges() -> list[Any]:
    """Return the win-rate judges this plugin provides.

    Called once, when the judge registry is first built.  Return a list of
    ``prefzoo.eval.JudgeSpec``; names must be unique across all plugins.
    """


@hookspec
def prefzoo_register_modifiers() -> list[ModifierSpec]:
    """Return the loss modifiers this plugin provides.

    Called once, when the modifier registry is first built (the first ``get_modifier``, ``list_modifiers``
    or ``modify`` call).  Return a list of :class:`prefzoo.ModifierSpec`; each name must be unique across all
    plugins, or the registry raises an error naming both plugins.  Built-in modifiers register through this
    same hook.
    """
