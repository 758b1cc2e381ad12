"""The runner's one exception root, and the stable error codes API replies carry.

Every error the runner raises on purpose derives from :class:`RunnerError` and has an
``error_code``: a short snake_case string that is part of the API (a reply's
``error.code``, the CLI's exit code, a client's ``except``), so renaming or moving a class never
changes what a client sees. A code is declared once; declaring it twice fails at import.

::

    RunnerError                        runner_error
    ├── ConfigError                    config_invalid            runner.config
    ├── TaskError                      task_error                runner.tasks.registry
    │   ├── UnknownTaskType            task_type_unknown
    │   └── InvalidPayload             payload_invalid
    ├── StoreError                     store_error               runner.store.errors
    │   ├── StoreUnavailable           store_unavailable
    │   ├── TaskNotFound               task_not_found
    │   ├── CommitConflict             commit_conflict
    │   ├── StaleFencingToken          stale_fencing_token
    │   ├── AttemptAlreadyFinished     attempt_already_finished
    │   ├── InvalidValue               invalid_value
    │   └── UnknownStoreFormat         unknown_store_format
    ├── OntologyError                  ontology_invalid          runner.ontology.parse
    ├── SourceError                    ontology_source_failed    runner.ontology.sources
    ├── AspectError                    aspect_error              runner.pipeline.aspects
    │   ├── UnknownAspect              aspect_unknown
    │   ├── InvalidAspect              aspect_invalid
    │   └── AspectBusy                 aspect_busy
    ├── InvalidAvatars                 avatars_invalid           runner.pipeline.avatars_io
    ├── PipelineError                  pipeline_failed           runner.pipeline.job
    └── SmokeCheckFailed               smoke_check_failed        runner.devenv.smoke

Control flow is not an error and stays outside the tree: a handler's
:class:`~runner.tasks.context.TaskCancelled` (the attempt ends CANCELLED_BY_SYSTEM) and
:class:`~runner.tasks.context.TaskConflict` (the attempt is retried after a backoff) and
:class:`~runner.tasks.context.TaskDeclined` (another node runs the task).

An API reply for an exception outside the tree (a bug) carries ``internal_error``; a request
the node's messaging layer refused carries the dead-letter reason as its code (``invalid``,
``unknown-command``, ``too-large``).
"""

from __future__ import annotations

from typing import ClassVar

from messaging.errors import INTERNAL_ERROR

#: every declared code and the class that declared it
ERROR_CODES: dict[str, type[RunnerError]] = {}



class RunnerError(Exception):
    """Root of every error the runner raises on purpose."""

    error_code: ClassVar[str] = "runner_error"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("error_code")
        if not isinstance(code, str):
            raise TypeError(f"{cls.__qualname__} must declare its own error_code")
        other = ERROR_CODES.get(code)
        if other is not None and (other.__module__, other.__qualname__) != (
                cls.__module__, cls.__qualname__):
            raise TypeError(f"error code {code!r} of {cls.__qualname__} is already "
                            f"{other.__qualname__}'s")
        ERROR_CODES[code] = cls


ERROR_CODES[RunnerError.error_code] = RunnerError


def error_code(exc: BaseException) -> str:
    """The stable code of ``exc`` for an API reply."""
    code = getattr(exc, "error_code", None)
    return code if isinstance(code, str) else INTERNAL_ERROR
