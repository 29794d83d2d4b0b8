"""Pure parts of devstack.kafka: configuration, cluster id, jar marker. No broker."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from devstack import kafka
from streams.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path / "state",
        kafka_bootstrap="127.0.0.1:29092",
        kafka_controller_port=29093,
        partitions=6,
    )


def test_server_properties_single_node_kraft(settings: Settings) -> None:
    props = kafka.server_properties(settings)
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(settings.state_dir / "kafka" / "data")
    assert props["num.partitions"] == "6"


def test_server_properties_allow_transactions_on_one_node(settings: Settings) -> None:
    props = kafka.server_properties(settings)
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "true"
    assert int(props["broker.heartbeat.interval.ms"]) < int(props["broker.session.timeout.ms"])


def test_listeners_follow_bootstrap_host(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, kafka_bootstrap="localhost:19092,other:1")
    props = kafka.server_properties(s)
    assert props["listeners"].startswith("PLAINTEXT://localhost:19092,")
    assert props["advertised.listeners"] == "PLAINTEXT://localhost:19092"


def test_render_and_parse_round_trip(settings: Settings) -> None:
    props = kafka.server_properties(settings)
    text = kafka.render_properties(props)
    assert text.startswith("#")
    assert kafka.parse_properties(text) == props


def test_render_escapes_backslashes() -> None:
    assert "a=C:\\\\x\n" in kafka.render_properties({"a": "C:\\x"})


def test_parse_properties_skips_comments_and_blank_lines() -> None:
    text = "# c\n! c\n\ncluster.id = abc\nversion=1\nnoequals\n"
    assert kafka.parse_properties(text) == {"cluster.id": "abc", "version": "1"}


def test_new_cluster_id_is_kafka_uuid_shaped() -> None:
    for _ in range(200):
        cid = kafka.new_cluster_id()
        assert len(cid) == 22
        assert not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_cluster_id_is_kept(settings: Settings) -> None:
    first = kafka.cluster_id(settings)
    assert kafka.cluster_id(settings) == first
    assert kafka.cluster_id_path(settings).read_text().strip() == first


def test_cluster_id_follows_formatted_storage(settings: Settings) -> None:
    kafka.cluster_id(settings)
    data = kafka.data_dir(settings)
    data.mkdir(parents=True)
    (data / "meta.properties").write_text(
        "version=1\ncluster.id=FORMATTEDxxxxxxxxxxxxx\nnode.id=1\n"
    )
    assert kafka.cluster_id(settings) == "FORMATTEDxxxxxxxxxxxxx"
    assert kafka.cluster_id_path(settings).read_text().strip() == "FORMATTEDxxxxxxxxxxxxx"


def test_libs_current_needs_matching_marker_and_jars(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    assert not kafka.libs_current(libs, "abc")
    libs.mkdir()
    (libs / kafka.LIBS_MARKER).write_text("abc\n")
    assert not kafka.libs_current(libs, "abc")  # no jars
    (libs / "kafka_2.13-4.0.1.jar").write_bytes(b"")
    (libs / "kafka-clients-4.0.1.jar").write_bytes(b"")
    assert kafka.libs_current(libs, "abc")
    assert not kafka.libs_current(libs, "def")  # the pom changed


def test_pom_digest_is_sha256_of_the_pom() -> None:
    assert kafka.POM.exists()
    assert len(kafka.pom_digest()) == 64


def test_ensure_libs_skips_maven_when_current(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = kafka.libs_dir(settings)
    libs.mkdir(parents=True)
    for jar in ("kafka_2.13-4.0.1.jar", "kafka-clients-4.0.1.jar"):
        (libs / jar).write_bytes(b"")
    (libs / kafka.LIBS_MARKER).write_text(kafka.pom_digest())

    def no_maven(*args: object, **kwargs: object) -> None:
        raise AssertionError("Maven must not run")

    monkeypatch.setattr(kafka.subprocess, "run", no_maven)
    assert kafka.ensure_libs(settings) == libs


def test_maven_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(kafka.shutil, "which", lambda name: f"/usr/bin/{name}")
    offline = kafka.maven_command(Path("pom.xml"), tmp_path, offline=True)
    online = kafka.maven_command(Path("pom.xml"), tmp_path, offline=False)
    assert offline[0] == "/usr/bin/mvn"
    assert {"-q", "-B", "-o"} <= set(offline)
    assert "-o" not in online
    assert "dependency:copy-dependencies" in online
    assert f"-DoutputDirectory={tmp_path}" in online
    assert "-DincludeScope=runtime" in online


def test_maven_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(kafka.shutil, "which", lambda name: None)
    with pytest.raises(kafka.StackError, match="mvn"):
        kafka.maven_command(Path("pom.xml"), tmp_path, offline=True)


def test_log4j2_config_is_xml_at_info() -> None:
    root = ET.fromstring(kafka.log4j2_xml())
    assert root.tag == "Configuration"
    assert root.find("./Loggers/Root").get("level") == "INFO"
    quiet = {e.get("name") for e in root.findall("./Loggers/Logger")}
    assert "kafka.request.logger" in quiet
    assert root.find("./Appenders/Console").get("target") == "SYSTEM_OUT"


def test_broker_command(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_HEAP_OPTS", raising=False)
    monkeypatch.setattr(kafka, "java_binary", lambda: "/usr/bin/java")
    argv, env = kafka.command(settings)
    assert argv[0] == "/usr/bin/java"
    assert "-Xmx768m" in argv
    assert argv[argv.index("-cp") + 1] == f"{kafka.libs_dir(settings)}/*"
    assert f"-Dlog4j2.configurationFile={kafka.log4j2_path(settings)}" in argv
    assert argv[-2:] == ["kafka.Kafka", str(kafka.properties_path(settings))]
    assert env is None


def test_heap_can_be_overridden(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_HEAP_OPTS", "-Xmx1g")
    monkeypatch.setattr(kafka, "java_binary", lambda: "java")
    argv = kafka.java_args(settings)
    assert "-Xmx1g" in argv
    assert "-Xmx768m" not in argv


def test_write_config(settings: Settings) -> None:
    kafka.write_config(settings)
    text = kafka.properties_path(settings).read_text()
    assert kafka.parse_properties(text) == kafka.server_properties(settings)
    assert kafka.log4j2_path(settings).read_text() == kafka.log4j2_xml()


def test_ports(settings: Settings) -> None:
    assert kafka.ports(settings) == (29092, 29093)
