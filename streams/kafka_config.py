"""The one place that turns Settings into a Kafka client's configuration, for each client kind.

    confluent_config(settings, extra)  librdkafka's dict (producers, consumers, AdminClient)
    aiokafka_kwargs(settings)          keyword arguments of AIOKafkaProducer/AIOKafkaConsumer
    faust_credentials(settings)        Faust's `broker_credentials` (None for PLAINTEXT)

Faust hands its credentials to aiokafka through `credentials_to_aiokafka_auth`
(faust/transport/drivers/aiokafka.py): a `SASLCredentials` with an `ssl_context` becomes
`security_protocol=SASL_SSL`, `sasl_mechanism`, `sasl_plain_username/password` and that
context, the same keywords `aiokafka_kwargs` gives our own aiokafka clients. aiokafka
speaks SCRAM itself (aiokafka/conn.py, ScramAuthenticator) and only takes TLS as an
`ssl.SSLContext`, hence `create_ssl_context(cafile=...)`.

The password is read from the SecretStr or the password file only here. The dicts returned
hold it in clear, because the clients need it so: they are `KafkaConfig`/`AiokafkaKwargs`,
whose repr masks it, so a dict that reaches a log line or a traceback shows `**********`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from streams.settings import Settings

MASK = "**********"
# the keys whose values never appear in a repr (librdkafka's and aiokafka's names)
SECRET_KEYS = frozenset({"sasl.password", "sasl_plain_password", "ssl.key.password"})


class KafkaSecurityError(ValueError):
    """The security settings cannot make a working client (unreadable password file...)."""


class _Masked(dict):
    def __repr__(self) -> str:
        shown = {k: (MASK if k in SECRET_KEYS else v) for k, v in self.items()}
        return f"{type(self).__name__}({shown!r})"

    __str__ = __repr__


class KafkaConfig(_Masked):
    """A librdkafka configuration dict whose repr masks the password."""


class AiokafkaKwargs(_Masked):
    """aiokafka keyword arguments whose repr masks the password."""


def secure(settings: Settings) -> bool:
    return settings.kafka_security_protocol == "SASL_SSL"


def password(settings: Settings) -> str:
    """The SASL password: the setting, else the file's first line (read at every call, so a
    rotated file is picked up by the next client built)."""
    if settings.kafka_password is not None:
        return settings.kafka_password.get_secret_value()
    if settings.kafka_password_file is None:
        raise KafkaSecurityError("no Kafka password: set TICKETFLOW_KAFKA_PASSWORD(_FILE)")
    try:
        text = settings.kafka_password_file.read_text()
    except OSError as exc:
        # the path is no secret; the exception text could be nothing else
        raise KafkaSecurityError(
            f"TICKETFLOW_KAFKA_PASSWORD_FILE {settings.kafka_password_file}: {exc.strerror}"
        ) from None
    value = text.splitlines()[0] if text.strip() else ""
    if not value:
        raise KafkaSecurityError(f"{settings.kafka_password_file} is empty")
    return value


def confluent_config(settings: Settings, extra: Mapping[str, Any] | None = None) -> KafkaConfig:
    """librdkafka's configuration: bootstrap, security, then `extra` (which wins)."""
    config = KafkaConfig({"bootstrap.servers": settings.kafka_bootstrap})
    if secure(settings):
        config.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": settings.kafka_sasl_mechanism,
                "sasl.username": settings.kafka_username,
                "sasl.password": password(settings),
            }
        )
        if settings.kafka_ca_file is not None:
            config["ssl.ca.location"] = str(settings.kafka_ca_file)
    if extra:
        config.update(extra)
    return config


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """The TLS context of aiokafka and Faust: the CA file (or the system's), hostname checked."""
    from aiokafka.helpers import create_ssl_context

    cafile = str(settings.kafka_ca_file) if settings.kafka_ca_file is not None else None
    return create_ssl_context(cafile=cafile)


def aiokafka_kwargs(settings: Settings) -> AiokafkaKwargs:
    """Keyword arguments for AIOKafkaProducer/AIOKafkaConsumer: bootstrap and security."""
    kwargs = AiokafkaKwargs({"bootstrap_servers": settings.kafka_bootstrap})
    if secure(settings):
        kwargs.update(
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": settings.kafka_sasl_mechanism,
                "sasl_plain_username": settings.kafka_username,
                "sasl_plain_password": password(settings),
                "ssl_context": ssl_context(settings),
            }
        )
    return kwargs


def faust_credentials(settings: Settings) -> Any:
    """Faust's `broker_credentials`: a SASLCredentials over TLS, or None for PLAINTEXT.

    faust.SASLCredentials' own repr names the user only.
    """
    if not secure(settings):
        return None
    import faust

    return faust.SASLCredentials(
        username=settings.kafka_username,
        password=password(settings),
        ssl_context=ssl_context(settings),
        mechanism=settings.kafka_sasl_mechanism,
    )


def describe(settings: Settings) -> str:
    """One line for logs and status output: where and as whom, never the password."""
    if not secure(settings):
        return f"{settings.kafka_bootstrap} (PLAINTEXT)"
    ca = settings.kafka_ca_file or "system trust store"
    return (
        f"{settings.kafka_bootstrap} (SASL_SSL {settings.kafka_sasl_mechanism} as "
        f"{settings.kafka_username}, CA {ca})"
    )
