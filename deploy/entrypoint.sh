#!/bin/sh
# The image's entrypoint: sluice-server with its data in /data, listening on every address at
# port 7070 (so it needs --tls_cert and --tls_key, or --plaintext: docs/security.md), plus a flag for every SLUICE_FLAG_<NAME> environment variable (SLUICE_FLAG_NODE_ID=n0
# becomes --node_id=n0; SLUICE_FLAG_ETCD, SLUICE_FLAG_MEMORY_BUDGET_MB, ... the same), then the
# arguments, which win over both. (Not plain SLUICE_: Kubernetes itself sets SLUICE_PORT and
# SLUICE_SERVICE_HOST for a Service named sluice.) Values must not contain spaces. With a first argument that is not a flag, it runs that command instead (the
# sluice CLI for probes and debugging: `sluice nodes --server 127.0.0.1:7070`).
set -eu
case "${1:-}" in
  ""|-*) ;;
  *) exec "$@" ;;
esac
set -- --data_dir=/data --listen=0.0.0.0:7070 $(env | sed -n 's/^SLUICE_FLAG_\([A-Z0-9_]*\)=\(.*\)$/\1 \2/p' |
  while read -r name value; do
    printf ' --%s=%s' "$(echo "$name" | tr 'A-Z' 'a-z')" "$value"
  done) "$@"
exec /usr/local/bin/sluice-server "$@"
