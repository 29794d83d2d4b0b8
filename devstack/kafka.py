"""A single-node Apache Kafka broker in KRaft combined mode (broker + controller in one JVM).

The jars come from Maven Central through `pom.xml` into `<state>/kafka/libs` (fetched again only
when the pom changes); the configuration is generated from the Settings at every start; the storage
is formatted once with a cluster id kept in `<state>/kafka/cluster.id`.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from streams.kafka_config import confluent_config, secure
from streams.settings import Settings

from .process import StackError, log_path, log_tail, logs_dir, port_open

NAME = "kafka"
DEFAULT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0

POM = Path(__file__).resolve().with_name("pom.xml")
LIBS_MARKER = ".pom.sha256"
HEAP_OPTS = ["-Xmx768m", "-Xms256m"]
# the JVM flags of Kafka's own kafka-run-class.sh (KAFKA_JVM_PERFORMANCE_OPTS)
JVM_PERFORMANCE_OPTS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]

log = logging.getLogger("devstack")


# --- paths -----------------------------------------------------------------------------------


def kafka_dir(settings: Settings) -> Path:
    # the secured broker (kafka_secure.py) keeps its configuration and data apart
    return Path(settings.state_dir) / ("kafka-secure" if secure(settings) else "kafka")


def libs_dir(settings: Settings) -> Path:
    # one copy of the jars for both brokers
    return Path(settings.state_dir) / "kafka" / "libs"


def data_dir(settings: Settings) -> Path:
    return kafka_dir(settings) / "data"


def properties_path(settings: Settings) -> Path:
    return kafka_dir(settings) / "server.properties"


def log4j2_path(settings: Settings) -> Path:
    return kafka_dir(settings) / "log4j2.xml"


def cluster_id_path(settings: Settings) -> Path:
    return kafka_dir(settings) / "cluster.id"


def host(settings: Settings) -> str:
    return settings.kafka_host_port[0]


def ports(settings: Settings) -> tuple[int, ...]:
    return settings.kafka_host_port[1], settings.kafka_controller_port


# --- jars ------------------------------------------------------------------------------------


def pom_digest(pom: Path = POM) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def libs_current(libs: Path, digest: str) -> bool:
    """True when `libs` holds jars fetched from the pom whose sha256 is `digest`."""
    marker = libs / LIBS_MARKER
    try:
        if marker.read_text().strip() != digest:
            return False
    except OSError:
        return False
    return any(libs.glob("kafka_2.13-*.jar")) and any(libs.glob("kafka-clients-*.jar"))


def maven_command(pom: Path, output_dir: Path, *, offline: bool) -> list[str]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("Maven (`mvn`) is not on PATH; it fetches the Kafka jars (pom.xml)")
    cmd = [mvn, "-q", "-B", "-Dstyle.color=never"]
    if offline:
        cmd.append("-o")
    cmd += [
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={output_dir}",
        "-DincludeScope=runtime",
    ]
    return cmd


def ensure_libs(settings: Settings, pom: Path = POM) -> Path:
    """Fetch the broker's jars with Maven unless the ones in place match the pom."""
    libs = libs_dir(settings)
    digest = pom_digest(pom)
    if libs_current(libs, digest):
        return libs
    tmp = libs.with_name("libs.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    mvn_log = logs_dir(settings) / "maven.log"
    mvn_log.parent.mkdir(parents=True, exist_ok=True)
    log.info("kafka: fetching the broker jars with Maven (log: %s)", mvn_log)
    ok = False
    with mvn_log.open("ab") as fh:
        # offline first: quick when ~/.m2 already has everything, no network needed
        for offline in (True, False):
            fh.write(f"\n===== mvn {'offline' if offline else 'online'}\n".encode())
            fh.flush()
            rc = subprocess.run(
                maven_command(pom, tmp, offline=offline),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
            if rc == 0 and any(tmp.glob("kafka_2.13-*.jar")):
                ok = True
                break
            shutil.rmtree(tmp, ignore_errors=True)
    if not ok:
        raise StackError(
            f"Maven could not fetch the Kafka jars from {pom}; see {mvn_log}:\n"
            + log_tail(mvn_log, 15)
        )
    (tmp / LIBS_MARKER).write_text(digest + "\n")
    # replace the whole folder: stale jars of another version must not stay on the classpath
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)
    return libs


# --- configuration ---------------------------------------------------------------------------


def server_properties(settings: Settings) -> dict[str, str]:
    """The broker's server.properties for a single loopback-only KRaft node."""
    host, port = settings.kafka_host_port
    controller_port = settings.kafka_controller_port
    controller_host = "127.0.0.1"
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{controller_host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{controller_host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir(settings)),
        "num.partitions": str(settings.partitions),
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # internal topics on one node: replication 1, fewer partitions than the default 50
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Kafka 4.0 makes a restarted single-node cluster wait out the old broker session
        # (DUPLICATE_BROKER_REGISTRATION, KAFKA-19130) before the broker may register again:
        # a shorter session than the default 9 s makes a restart that much quicker
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # Faust creates its internal (changelog, repartition) topics on the fly
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "num.network.threads": "3",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.segment.bytes": str(16 * 1024 * 1024),
        "log.retention.hours": "24",
        "log.retention.check.interval.ms": "60000",
    }


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (mode 0600 from its creation, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def render_properties(props: dict[str, str]) -> str:
    lines = ["# generated by devstack from the Settings; edits are overwritten"]
    lines += [f"{key}={_escape(value)}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def parse_properties(text: str) -> dict[str, str]:
    """A minimal reader for `key=value` files (meta.properties, server.properties)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


# INFO overall, but the chattiest loggers at WARN
_QUIET_LOGGERS = (
    # the ~300-line configuration dumps (the broker's and its internal clients')
    "kafka.server.KafkaConfig",
    "org.apache.kafka.common.config.AbstractConfig",
    # per-partition lines: every topic Faust creates would add a dozen
    "kafka.cluster.Partition",
    "kafka.log.LogManager",
    "kafka.coordinator.transaction.TransactionStateManager",
    "org.apache.kafka.coordinator.common.runtime.CoordinatorRuntime",
    # "Starting"/"Stopped"/"Shutdown completed" of every internal thread and queue
    "org.apache.kafka.server.purgatory.DelayedOperationPurgatory$ExpiredOperationReaper",
    "kafka.server.ClientQuotaManager$ThrottledChannelReaper",
    "kafka.server.NodeToControllerRequestThread",
    "org.apache.kafka.server.util.timer.SystemTimerReaper$Reaper",
    "org.apache.kafka.coordinator.common.runtime.MultiThreadedEventProcessor$EventProcessorThread",
    "org.apache.kafka.queue.KafkaEventQueue",
    "kafka.request.logger",
    "kafka.network.RequestChannel$",
    "state.change.logger",
    "kafka.log.LogCleaner",
    "kafka.authorizer.logger",
    "org.apache.kafka.storage.internals.log",
    "org.apache.kafka.clients",
    "org.apache.kafka.common.utils.AppInfoParser",
    "org.apache.kafka.common.metrics",
)


def log4j2_xml() -> str:
    loggers = "\n".join(f'    <Logger name="{name}" level="WARN"/>' for name in _QUIET_LOGGERS)
    # shutdownHook="disable": keep logging while the broker's own shutdown hook runs
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by devstack: the broker logs to stdout, which goes to <state>/logs/ -->
<Configuration status="WARN" shutdownHook="disable">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO">
      <AppenderRef ref="stdout"/>
    </Root>
{loggers}
  </Loggers>
</Configuration>
"""


def new_cluster_id() -> str:
    """A random Kafka cluster id: a v4 UUID in URL-safe base64 without padding (22 chars)."""
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        # Kafka's Uuid.randomUuid() never hands out ids starting with '-' (they read as flags)
        if not text.startswith("-"):
            return text


def cluster_id(settings: Settings) -> str:
    """The cluster id of the state folder: the formatted storage's, else the kept, else new."""
    path = cluster_id_path(settings)
    meta = data_dir(settings) / "meta.properties"
    if meta.exists():
        formatted = parse_properties(meta.read_text()).get("cluster.id")
        if formatted:
            if not path.exists() or path.read_text().strip() != formatted:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(formatted + "\n")
            return formatted
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    value = new_cluster_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
    return value


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise StackError("Java (17 or newer) is not on PATH; the Kafka broker needs it")
    return java


def java_args(settings: Settings) -> list[str]:
    heap = os.environ.get("KAFKA_HEAP_OPTS", "").split() or HEAP_OPTS
    return [
        java_binary(),
        *heap,
        *JVM_PERFORMANCE_OPTS,
        f"-Dlog4j2.configurationFile={log4j2_path(settings)}",
        f"-Dkafka.logs.dir={logs_dir(settings)}",
        "-cp",
        f"{libs_dir(settings)}/*",
    ]


def write_config(settings: Settings, props: dict[str, str] | None = None) -> None:
    """Write the broker's properties: `props`, or the plain broker's own when None."""
    kafka_dir(settings).mkdir(parents=True, exist_ok=True)
    if props is None:
        props = server_properties(settings)
    # 0600: the secured broker's file holds its inter-broker and keystore passwords
    write_private(properties_path(settings), render_properties(props))
    log4j2_path(settings).write_text(log4j2_xml())


def ensure_formatted(settings: Settings, extra_args: Sequence[str] = ()) -> None:
    """Format the KRaft storage once (skipped when meta.properties exists).

    `extra_args` go to the StorageTool: the secured broker's SCRAM users.
    """
    if (data_dir(settings) / "meta.properties").exists():
        return
    cid = cluster_id(settings)
    fmt_log = logs_dir(settings) / "kafka-format.log"
    fmt_log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        *java_args(settings),
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cid,
        "-c",
        str(properties_path(settings)),
    ]
    cmd += extra_args
    log.info("kafka: formatting storage %s (cluster id %s)", data_dir(settings), cid)
    with fmt_log.open("ab") as fh:
        rc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, check=False
        ).returncode
    if rc != 0:
        raise StackError(
            f"formatting the Kafka storage failed (rc={rc}); see {fmt_log}:\n"
            + log_tail(fmt_log, 15)
        )


# --- part interface --------------------------------------------------------------------------


def prepare(settings: Settings) -> None:
    ensure_libs(settings)
    write_config(settings)
    ensure_formatted(settings)


def command(settings: Settings) -> tuple[list[str], dict[str, str] | None]:
    return [*java_args(settings), "kafka.Kafka", str(properties_path(settings))], None


def log_file(settings: Settings) -> Path:
    return log_path(settings, NAME)


def _client_config(settings: Settings) -> dict[str, object]:
    # log_level 0: librdkafka's connection-refused chatter while probing is not ours to print
    return confluent_config(settings, {"log_level": 0})


def healthy(settings: Settings, timeout_s: float = 3.0) -> bool:
    """True when the broker answers a metadata request."""
    host, port = settings.kafka_host_port
    if not port_open(host, port):
        return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient(_client_config(settings)).list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return bool(metadata.brokers)


def verify_transactions(settings: Settings, timeout_s: float = 60.0) -> None:
    """Commit one transaction (a record plus consumer offsets), as exactly-once producers do.

    This also creates `__transaction_state` and `__consumer_offsets`, so the first real
    exactly-once producer does not wait for them. A broker that has just restarted answers
    "coordinator load in progress" while it reloads its transaction log: asked again.
    """
    from confluent_kafka import KafkaError, KafkaException

    loading = {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.CONCURRENT_TRANSACTIONS,
    }
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _commit_one_transaction(settings, timeout_s)
            return
        except KafkaException as exc:
            err = exc.args[0]
            if time.monotonic() < deadline and (err.retriable() or err.code() in loading):
                time.sleep(1.0)
                continue
            raise StackError(f"a transactional producer could not commit on Kafka: {exc}") from exc


def _commit_one_transaction(settings: Settings, timeout_s: float) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"{settings.topic_prefix}ticketflow-stack-txn-check"
    group = f"{settings.topic_prefix}ticketflow-stack-txn-check"
    producer = Producer(
        {
            **_client_config(settings),
            "transactional.id": f"ticketflow-stack-txn-check-{os.getpid()}",
            "enable.idempotence": True,
        }
    )
    consumer = Consumer(
        {**_client_config(settings), "group.id": group, "enable.auto.commit": False}
    )
    try:
        producer.init_transactions(timeout_s)
        producer.begin_transaction()
        producer.produce(topic, key=b"stack", value=b"transaction check", partition=0)
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 1)], consumer.consumer_group_metadata(), timeout_s
        )
        producer.commit_transaction(timeout_s)
    finally:
        consumer.close()


def after_start(settings: Settings, timeout_s: float) -> None:
    # its own budget: a restarted broker with many partitions reloads its coordinators slowly
    verify_transactions(settings, timeout_s=max(60.0, timeout_s))
