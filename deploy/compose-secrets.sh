#!/bin/sh
# Makes the files docker-compose.yml mounts as secrets, once, in deploy/secrets/ (0700 folder,
# 0600 files, never committed): a CA and the broker's PEM key and certificate for Kafka's
# SASL_SSL listener (names: kafka, localhost), one SCRAM password per Kafka principal, the
# gateway's bearer token, the audit key and Grafana's admin password. Run it again to make only what is missing.
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 700 secrets
cd secrets

for name in kafka_admin_password kafka_worker_password kafka_ingest_password gateway_token audit_key \
  grafana_admin_password; do
  [ -s "$name" ] || openssl rand -hex 32 > "$name"
done

if [ ! -s kafka_ca.pem ] || [ ! -s kafka_ca.key ]; then
  rm -f kafka_broker.pem
  openssl req -x509 -newkey rsa:3072 -sha256 -nodes -days 825 \
    -subj "/CN=ticketflow compose CA" -keyout kafka_ca.key -out kafka_ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
if [ ! -s kafka_broker.pem ]; then
  printf 'subjectAltName=DNS:kafka,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > broker.ext
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kafka" -keyout broker.key -out broker.csr 2>/dev/null
  openssl x509 -req -in broker.csr -CA kafka_ca.pem -CAkey kafka_ca.key -CAcreateserial \
    -days 825 -sha256 -extfile broker.ext -out broker.crt 2>/dev/null
  # Kafka's PEM keystore: the unencrypted PKCS#8 key, then the certificate, in one file
  openssl pkcs8 -topk8 -nocrypt -in broker.key > kafka_broker.pem
  cat broker.crt >> kafka_broker.pem
  rm -f broker.key broker.csr broker.crt broker.ext
fi
# containers run the services as other users than the one that made these: readable by them
# inside their container only (compose bind-mounts each file read-only at /run/secrets/<name>)
chmod 644 kafka_ca.pem
chmod 600 kafka_ca.key
chmod 644 kafka_broker.pem kafka_admin_password kafka_worker_password kafka_ingest_password gateway_token audit_key
chmod 644 grafana_admin_password
echo "compose secrets in $(pwd) (values not shown)"
