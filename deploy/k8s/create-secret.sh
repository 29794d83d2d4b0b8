#!/bin/sh
# Creates (or replaces) the Secret `ticketflow` that every pod reads, from files, so that no
# value appears on a command line or in a manifest. Defaults: the files of
# deploy/compose-secrets.sh (run it first), and a Redis URL from $TICKETFLOW_REDIS_URL_FILE
# (a file holding e.g. rediss://worker:<password>@redis.example:6380/0).
#   deploy/k8s/create-secret.sh [namespace]        # default namespace: ticketflow
# The Kafka CA and passwords must be those of the cluster's Kafka (its SCRAM users
# `worker` and `ingest`), not the compose ones, when Kafka runs elsewhere: set
# TICKETFLOW_SECRETS_DIR to a folder with the same file names.
set -eu
ns="${1:-ticketflow}"
dir="${TICKETFLOW_SECRETS_DIR:-$(dirname "$0")/../secrets}"
redis_url_file="${TICKETFLOW_REDIS_URL_FILE:-$dir/redis_url}"
for f in kafka_ca.pem kafka_worker_password kafka_ingest_password gateway_token audit_key; do
  [ -s "$dir/$f" ] || { echo "missing $dir/$f (deploy/compose-secrets.sh makes it)" >&2; exit 1; }
done
[ -s "$redis_url_file" ] || { echo "missing $redis_url_file (the Redis URL, a secret)" >&2; exit 1; }
# values read into an environment variable (token, Redis URL) lose their final newline
umask 077
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for f in kafka_worker_password kafka_ingest_password gateway_token audit_key; do
  tr -d '\r\n' < "$dir/$f" > "$tmp/$f"
done
tr -d '\r\n' < "$redis_url_file" > "$tmp/redis_url"
kubectl create secret generic ticketflow --namespace "$ns" \
  --from-file=kafka_ca="$dir/kafka_ca.pem" \
  --from-file=kafka_worker_password="$tmp/kafka_worker_password" \
  --from-file=kafka_ingest_password="$tmp/kafka_ingest_password" \
  --from-file=gateway_token="$tmp/gateway_token" \
  --from-file=audit_key="$tmp/audit_key" \
  --from-file=redis_url="$tmp/redis_url" \
  --dry-run=client -o yaml | kubectl apply -f -
echo "secret ticketflow in namespace $ns (values not shown)"
