"""The task types a node runs: the built-in ones (diagnostics, ontology loads, the aspect
pipeline, stream copies), then those of the ``latchwork.tasks`` entry points, then the modules
the settings name (``--tasks``), with their streams, commands and broadcasts. A bad module or
a duplicate name raises :class:`~runner.errors.TaskLoadError`."""

from __future__ import annotations

from runner.config import Settings
from runner.node import commands as builtin_commands
from runner.ontology import register_ontology_tasks
from runner.pipeline.handlers import register_pipeline_tasks
from runner.tasks import TaskRegistry
from runner.tasks.authoring import load_entry_points, load_modules, register_commands
from runner.tasks.commands import CommandRegistry
from runner.tasks.features.diag import register_diagnostics
from runner.tasks.features.streams import StreamRegistry, register_stream_tasks


def default_registry() -> TaskRegistry:
    """The built-in task types: diagnostics, ontology loads, the aspect pipeline."""
    registry = TaskRegistry()
    register_diagnostics(registry)
    register_ontology_tasks(registry)
    register_pipeline_tasks(registry)
    register_stream_tasks(registry)
    return registry


def node_registry(settings: Settings, streams: StreamRegistry | None = None,
                  commands: CommandRegistry | None = None) -> TaskRegistry:
    """The built-in types, then the entry points of ``latchwork.tasks``, then the modules the
    settings name (``--tasks``); their ``@stream`` definitions go to ``streams``, their
    ``@command`` and ``@broadcast`` ones to ``commands`` (after the built-in ones). A bad
    module or a duplicate name raises TaskLoadError."""
    registry = default_registry()
    if commands is not None:
        register_commands(commands, builtin_commands, builtin=True)
    load_entry_points(registry, streams=streams, commands=commands)
    load_modules(registry, settings.tasks, streams, commands)
    return registry
