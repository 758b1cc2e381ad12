"""Node configuration: a TOML file plus ``LATCHWORK_*`` environment variables (pydantic-settings).

Precedence, highest first: keyword arguments, the environment, the TOML file, the defaults.
An unknown key in the file or an invalid value raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from messaging.envelope import summary
from runner.errors import ConfigError

ENV_PREFIX = "LATCHWORK_"

#: the TOML file of the :meth:`Settings.load` call in progress (pydantic-settings reads it)
_TOML_FILE: ContextVar[Path | None] = ContextVar("latchwork_toml_file", default=None)


# The ports `latchwork dev up` uses by default, so a default Settings reaches its servers.
DEFAULT_ZK_PORT = 22181
DEFAULT_AMQP_PORT = 25673
DEFAULT_SPARK_PORT = 27077
DEFAULT_GRAPH_PORT = 28182

class Settings(BaseSettings):
    """Everything a latchwork node or client needs to find its cluster."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    cluster: str = Field("default", pattern=r"^[A-Za-z0-9_.-]+$",
                         description="cluster name; the ZooKeeper root is /latchwork/<cluster>")
    zk_hosts: str = Field(f"127.0.0.1:{DEFAULT_ZK_PORT}",
                          description="ZooKeeper connection string, host:port[,host:port...]")
    session_timeout: float = Field(10.0, gt=0, description="ZooKeeper session timeout, seconds")
    zk_auth: SecretStr | None = Field(
        None, description="digest credentials user:password: every znode gets an ACL for that "
                          "user alone (never printed)")
    zk_tls_ca: str | None = Field(
        None, description="PEM file of the CA ZooKeeper's certificate is checked against; set, "
                          "the client connects over TLS (to the servers' secureClientPort)")
    zk_tls_cert: str | None = Field(None, description="PEM client certificate for ZooKeeper")
    zk_tls_key: str | None = Field(None, description="PEM private key of zk_tls_cert")
    amqp_url: SecretStr = Field(
        SecretStr(f"amqp://guest:guest@127.0.0.1:{DEFAULT_AMQP_PORT}/%2F"),
        description="RabbitMQ URL, amqp:// or amqps:// (it holds the password: never printed)")
    amqp_tls_ca: str | None = Field(
        None, description="PEM file of the CA the broker's certificate is checked against "
                          "(amqps://; default: the system's CAs)")
    amqp_tls_cert: str | None = Field(None, description="PEM client certificate for RabbitMQ")
    amqp_tls_key: str | None = Field(None, description="PEM private key of amqp_tls_cert")
    graph: str = Field(".latchwork/graph.db",
                       description="graph store: a SQLite path (gremlite) or "
                                   "ws://host:8182/gremlin, wss:// with TLS")
    graph_username: str | None = Field(None, description="Gremlin Server user (SASL plain)")
    graph_password: SecretStr | None = Field(None, description="Gremlin Server password")
    graph_tls_ca: str | None = Field(
        None, description="PEM file of the CA a wss:// server's certificate is checked against")
    graph_serial_server: bool = Field(
        False, description="the remote graph has no transactions but runs one traversal at a "
                           "time (a Gremlin Server with gremlinPool: 1, as 'latchwork dev up "
                           "--graph-server' starts): each guarded write is one traversal, "
                           "atomic there (docs/graph.md)")
    graph_timeout: float = Field(
        30.0, gt=0, description="seconds a request to a remote graph may take before the "
                                "graph counts as unreachable")
    graph_retry_for: float = Field(
        60.0, gt=0, description="seconds a node keeps trying to write the end of an attempt "
                                "while the graph is unreachable (holding the task's lock); "
                                "then the task is left open and runs again")
    allow_untransactional_graph: bool = Field(
        False, description="run against a remote graph without transactions (guarded writes "
                           "become check-then-act: see docs/graph.md); logged at every start")
    workers: int = Field(4, ge=1, le=256, description="task worker threads per node")
    switch_interval: float | None = Field(
        None, gt=0, le=1,
        description="seconds a node's thread runs Python before a waiting one may take over "
                    "(sys.setswitchinterval); unset: 0.0005 with an embedded graph, whose "
                    "writes run Python for milliseconds while the ZooKeeper and broker threads "
                    "wait, else Python's own 0.005")
    prefetch: float = Field(
        8.0, ge=0, le=64,
        description="tasks a node claims ahead of its free workers, in workers, of a type "
                    "whose handlers are short here (under 50 ms on average): batches grow past "
                    "the workers; such a task shows RUNNING while it waits a few ms for a "
                    "worker; 0: never")
    scan_interval: float = Field(5.0, gt=0, description="seconds between task scans")
    reap_interval: float = Field(2.0, gt=0,
                                 description="seconds between the master's dead-owner lock scans")
    processed_retention: float = Field(
        7 * 86400.0, gt=0,
        description="seconds a MASTER message's processed record is kept (the master prunes "
                    "older ones); keep it beyond the longest redelivery horizon")
    max_message_bytes: int = Field(256 * 1024, ge=1024,
                                   description="larger message bodies are dead-lettered")
    shutdown_timeout: float = Field(20.0, gt=0,
                                    description="seconds SIGTERM waits for cancelled tasks")
    ontology_source: str | None = Field(
        None, description="ontology source: a directory of OWL/Turtle files or an OLS URL")
    data_dir: str = Field(".latchwork/data",
                          description="pipeline data (snapshots, batch outputs): a path or a "
                                      "Hadoop URI every node reaches (file://, hdfs://, s3a://)")
    spark_master: str = Field("local[*]", description="Spark master URL for pipeline tasks")
    spark_driver_memory: str = Field("1g", description="Spark driver memory, e.g. 2g")
    spark_driver_host: str | None = Field(
        None, description="the address executors reach this node's Spark driver at (unset: "
                          "127.0.0.1 with a local master, else this host's name as it "
                          "resolves)")
    spark_driver_bind_address: str | None = Field(
        None, description="the address the driver listens on (unset: 127.0.0.1 with a local "
                          "master, else 0.0.0.0)")
    spark_conf: dict[str, str] = Field(default_factory=dict,
                                       description="extra Spark settings (JSON object in the "
                                                   "environment)")
    batch_rows: int = Field(100_000, ge=1, description="avatars per pipeline batch")
    batch_timeout: float = Field(120.0, gt=0,
                                 description="seconds a pipeline batch lives without renewal")
    batch_workers: int = Field(2, ge=0, le=64,
                               description="helper tasks per aspect creation (besides its own)")
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve Prometheus metrics on this port (off: unset)")
    metrics_host: str = Field("127.0.0.1", description="address the metrics port binds to "
                                                      "(0.0.0.0 to be scraped from elsewhere)")
    stream_retention: float = Field(
        7 * 86400.0, ge=0,
        description="seconds a stream's queue elements are kept (consumed inputs, outputs, dead "
                    "letters; the master prunes older ones, never an input not read yet); "
                    "0: kept for ever (ZooKeeper holds them all in memory)")
    stream_retention_interval: float = Field(
        600.0, gt=0, description="seconds between the master's passes over the stream queues")
    stream_liveness_host: str | None = Field(
        "127.0.0.1", description="address the beacon of each stream copy on this node listens "
                                 "on; the other copies connect to it and step in at once when "
                                 "this node's process ends. Across hosts, an address they can "
                                 "reach; empty: no beacon (they wait their patience)")
    tasks: list[str] = Field(
        default_factory=list,
        description="modules of your own task types (@task), loaded at start besides the "
                    "entry points of the latchwork.tasks group (JSON list in the environment)")
    aspects: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="aspect definitions: name -> {kind, classes, compute}")
    retention_days: float | None = Field(
        None, gt=0, description="archive (or remove) finished tasks older than this many "
                                "days (unset: keep everything)")
    retention_mode: Literal["archive", "delete"] = Field(
        "archive", description="archive: to Parquet under data_dir/archive, then remove; "
                               "delete: only remove")
    retention_batch: int = Field(50, ge=1, le=1000,
                                 description="finished tasks the master handles per round")
    retention_interval: float = Field(60.0, gt=0,
                                      description="seconds between the master's retention rounds")
    incident_webhook: str | None = Field(
        None, description="POST every incident raised and resolved here (JSON), with retries")
    incident_hooks: list[str] = Field(
        default_factory=list,
        description='Python callables "module:function" called with every incident event '
                    "(JSON list in the environment)")
    web_username: str | None = Field(
        None, description="user name of the web console's basic authentication "
                          "(latchwork web; with web_password)")
    web_password: SecretStr | None = Field(
        None, description="password of the web console's basic authentication")
    web_token: SecretStr | None = Field(
        None, description="bearer token the web console accepts (Authorization: Bearer ...)")
    web_tls_cert: Path | None = Field(
        None, description="PEM certificate (chain) the web console serves TLS with "
                          "(with web_tls_key)")
    web_tls_key: Path | None = Field(None, description="PEM private key of web_tls_cert")
    web_behind_proxy: bool = Field(
        False, description="the web console sits behind a TLS-terminating proxy: it may "
                           "listen beyond loopback without TLS of its own, and honours "
                           "X-Forwarded-Proto/-For from web_proxies only")
    web_proxies: list[str] = Field(
        default_factory=lambda: ["127.0.0.1"],
        description="addresses (or networks) of the proxies whose X-Forwarded-* headers the "
                    "web console honours with web_behind_proxy (JSON list in the environment)")
    concurrency: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description="cluster-wide limits per task type or group of types: a group is a "
                    'dotted prefix, {"aspect": 2, "aspect.create": 1} (JSON object in the '
                    "environment)")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then ``LATCHWORK_*``, then the TOML file :meth:`load` was given
        (pydantic-settings' own TOML source)."""
        path = _TOML_FILE.get()
        if path is None:
            return init_settings, env_settings
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, path)

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> Settings:
        """Read ``path`` (TOML, optional), let the environment override it, then ``overrides``.

        Everything wrong raises :class:`ConfigError` naming the setting: a file that cannot be
        read or is not TOML, an unknown key, an invalid value, bad JSON in a ``LATCHWORK_*``
        variable that holds a list or a table (``LATCHWORK_SPARK_CONF``, ``LATCHWORK_TASKS``,
        ``LATCHWORK_ASPECTS``)."""
        if path is not None:
            try:
                tomllib.loads(Path(path).read_text())
            except OSError as exc:
                raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        token = _TOML_FILE.set(None if path is None else Path(path))
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise ConfigError(f"invalid configuration: {summary(exc, limit=20)}") from exc
        except SettingsError as exc:  # e.g. a LATCHWORK_* variable that is not valid JSON
            raise ConfigError(f"invalid configuration: {exc}"
                              f"{': ' + str(exc.__cause__) if exc.__cause__ else ''}") from exc
        finally:
            _TOML_FILE.reset(token)

    @classmethod
    def env_names(cls) -> set[str]:
        """The environment variable of every setting, e.g. ``LATCHWORK_ZK_HOSTS``."""
        return {f"{ENV_PREFIX}{name.upper()}" for name in cls.model_fields}
