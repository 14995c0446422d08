#!/usr/bin/env bash
# The layering rule (docs/architecture.md), checked: no project file includes one from a layer
# above it, codec/ sees no gRPC, and the client's headers expose no gRPC types.
#   codec < proto < rpc < cluster < server, client < bench < tests
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
# allowed "..." include prefixes per folder (system <...> includes are checked separately)
declare -A allowed=(
  [codec]="codec/ absl/"
  [rpc]="rpc/ codec/ absl/ sluice/v1/"
  [cluster]="cluster/ rpc/ codec/ absl/ etcd/ spdlog/ nlohmann/"
  [server]="server/ cluster/ rpc/ codec/ absl/ sluice/v1/ spdlog/"
  [client]="client/ cluster/ rpc/ codec/ absl/ sluice/v1/ nlohmann/"
  [client/python]="client/ absl/"
  [bench]="bench/ client/ codec/ absl/"
)
for dir in "${!allowed[@]}"; do
  while IFS=: read -r file line inc; do
    ok=0
    for prefix in ${allowed[$dir]}; do
      [[ $inc == "$prefix"* ]] && ok=1
    done
    if ((ok == 0)); then
      echo "$file:$line includes \"$inc\", from outside the layers $dir/ may use"
      status=1
    fi
  done < <(grep -Hn '^#include "' "$dir"/*.h "$dir"/*.cc 2>/dev/null |
           sed -E 's/^([^:]+):([0-9]+):#include "([^"]+)".*/\1:\2:\3/')
done
# gRPC stays out of codec/ entirely, and out of the client's and server's headers except the
# service's own (included only by sluice_server.cc) and rpc/'s.
if grep -Hn -E '#include [<"](grpc|grpcpp|sluice/v1|etcd/)' codec/*.h codec/*.cc client/*.h cluster/*.h \
    client/python/*.h client/python/*.cc \
    $(ls server/*.h | grep -v shuffle_service.h); then
  echo "the lines above include gRPC or generated code where no gRPC may be seen"
  status=1
fi
((status == 0)) && echo "layers: ok"
exit $status
