#!/usr/bin/env bash
# Sluice's one entry point for people and CI. Idempotent: installs only what is missing
# (Debian 12 packages, as root or through sudo), reuses the build directory and ccache.
#
#   bash deploy/dev.sh main        # install, build, run the main job
#   bash deploy/dev.sh test        # install, build, run every test (ctest)
#   bash deploy/dev.sh asan        # every test under AddressSanitizer + UBSan
#   bash deploy/dev.sh fuzz [SEC]  # libFuzzer runs of the frame decoder and encoder and the
#                                  # Python client's Arrow reader, SEC each (60)
#   bash deploy/dev.sh stress      # the heavy campaigns (ctest label stress)
#   bash deploy/dev.sh soak [SEC]  # the codec soak (random frames, reused decoders) under ASan+UBSan
#   bash deploy/dev.sh compare     # codec benchmark beside Python pickle/msgpack (+zstd)
#   bash deploy/dev.sh image       # the container image (podman), then a smoke test and its size
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${JOBS:-2}

BUILD_PACKAGES=(build-essential cmake ninja-build ccache pkg-config libssl-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libmsgpack-cxx-dev libzstd-dev libabsl-dev libspdlog-dev libxxhash-dev libjemalloc-dev
  nlohmann-json3-dev prometheus-cpp-dev pybind11-dev python3-dev python3-numpy
  libcurl4-openssl-dev libxml2-dev
  libgtest-dev libgmock-dev libbenchmark-dev)
# etcd-server: cluster mode's coordination service, run for real by the cluster tests.
# python3-yaml: the deploy/ manifests' check. prometheus: scrapes a server in the metrics test.
# iproute2: network namespaces (another host for the remote admin test). python3-pytest: the
# Python client's tests. openssl: the TLS tests make their CA and certificates with it.
# python3-pandas: the columns tests give and take DataFrames (python3-numpy, the columns' one
# dependency, is a build package: the Python package's columns need it at run time).
# python3-dask, python3-distributed: sluice.dask's tests run a real distributed.LocalCluster.
TEST_PACKAGES=(python3 python3-msgpack python3-zstandard python3-yaml etcd-server prometheus iproute2
  python3-pytest openssl python3-pandas curl python3-dask python3-distributed)
FUZZ_PACKAGES=(clang libclang-rt-14-dev)

log() { printf '==> %s\n' "$*" >&2; }

install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  log "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# npm's s3rver: the real S3 server the object-store tests start (tests/harness/s3_server.h,
# docs/object-store.md), in .tools/ of the source tree. Node.js and npm from Debian unless the
# machine has them already (a Node.js from elsewhere brings its own npm).
install_s3rver() {
  [[ -x $ROOT/.tools/node_modules/.bin/s3rver ]] && return 0
  command -v npm >/dev/null || install_missing nodejs npm
  log "installing s3rver (npm) in $ROOT/.tools"
  mkdir -p "$ROOT/.tools"
  (cd "$ROOT/.tools" && npm install --no-audit --no-fund --loglevel=error s3rver@3.7.1 >/dev/null)
}

configure_and_build() {  # DIR [cmake args...]
  local dir=$1
  shift
  if [[ ! -f $dir/build.ninja ]]; then
    cmake -S "$ROOT" -B "$dir" -G Ninja "$@" >/dev/null
  fi
  cmake --build "$dir" -j "$JOBS"
}

build_main() {
  install_missing "${BUILD_PACKAGES[@]}"
  configure_and_build "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=ON
  # The Python client: Debian's /usr/bin/python3 imports `sluice` from the build (a .pth file in
  # its site-packages; docs/python.md).
  if [[ -d $ROOT/build/python/sluice ]]; then
    local site
    site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
    if ! { mkdir -p "$site" && echo "$ROOT/build/python" >"$site/sluice.pth"; } 2>/dev/null; then
      log "could not write $site/sluice.pth: use PYTHONPATH=$ROOT/build/python"
    fi
  fi
}

case ${1:-} in
  main)
    build_main
    log "end-to-end shuffle benchmark (sluice bench: a sluice-server child, fsync on)"
    "$ROOT/build/client/sluice" bench --order UNORDERED
    "$ROOT/build/client/sluice" bench --order KEY
    log "codec benchmark (one thread, zstd level 3)"
    "$ROOT/build/codec/sluice-codec-bench"
    ;;
  test)
    install_missing "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    install_s3rver
    build_main
    log "running the test suite"
    ctest --test-dir "$ROOT/build" --output-on-failure -j "$JOBS" -LE "soak|stress|asan"
    ;;
  asan)
    install_missing "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    install_s3rver
    configure_and_build "$ROOT/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_SANITIZE=ON \
      -DSLUICE_BUILD_TESTS=ON
    log "every test under ASan+UBSan"
    ctest --test-dir "$ROOT/build-asan" --output-on-failure -j "$JOBS" -LE "soak|stress"
    # The Python module is not in that build (Debian's python3 loads it uninstrumented): its own
    # C++ is built instrumented beside the release build, and the Python tests run against it.
    build_main
    cmake --build "$ROOT/build" -j "$JOBS" --target _sluice_asan
    log "the Python client's tests against its module under ASan+UBSan"
    ctest --test-dir "$ROOT/build" --output-on-failure -L asan
    ;;
  stress)
    install_missing "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    build_main
    log "the heavy campaigns (label stress): idle streams, idle connections, tiny frames"
    ctest --test-dir "$ROOT/build" --output-on-failure -j 1 -L stress
    ;;
  soak)
    secs=${2:-60}
    install_missing "${BUILD_PACKAGES[@]}"
    configure_and_build "$ROOT/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_SANITIZE=ON \
      -DSLUICE_BUILD_TESTS=ON
    log "codec soak under ASan+UBSan for ${secs}s"
    out=$(mktemp)
    status=0
    SLUICE_SOAK_SECONDS=$secs ctest --test-dir "$ROOT/build-asan" -L soak -V >"$out" 2>&1 ||
      status=$?
    grep -E ': soak:|tests passed|tests failed' "$out" || true
    ((status == 0)) || tail -60 "$out"
    rm -f "$out"
    exit "$status"
    ;;
  fuzz)
    secs=${2:-60}
    install_missing "${BUILD_PACKAGES[@]}" "${FUZZ_PACKAGES[@]}"
    configure_and_build "$ROOT/build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_FUZZ=ON \
      -DSLUICE_CODEC_ONLY=ON -DSLUICE_BUILD_TESTS=OFF
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/decoder" "$work/encoder"
    log "fuzzing the frame decoder for ${secs}s"
    "$ROOT/build-fuzz/tests/frame_decoder_fuzzer" -max_total_time="$secs" -rss_limit_mb=2048 \
      -print_final_stats=1 "$work/decoder" "$ROOT/tests/fuzz/corpus"
    log "fuzzing the frame encoder's round trip for ${secs}s"
    "$ROOT/build-fuzz/tests/frame_encoder_fuzzer" -max_total_time="$secs" -rss_limit_mb=2048 \
      -print_final_stats=1 "$work/encoder"
    log "fuzzing the Python client's Arrow C data reader for ${secs}s"
    mkdir -p "$work/arrow"
    "$ROOT/build-fuzz/tests/arrow_batch_fuzzer" -max_total_time="$secs" -rss_limit_mb=2048 \
      -print_final_stats=1 "$work/arrow"
    log "fuzzing a partition object's trailer and footer for ${secs}s"
    mkdir -p "$work/footer" "$work/xml"
    "$ROOT/build-fuzz/tests/object_footer_fuzzer" -max_total_time="$secs" -rss_limit_mb=2048 \
      -print_final_stats=1 "$work/footer"
    log "fuzzing the object store's XML answers for ${secs}s"
    "$ROOT/build-fuzz/tests/s3_xml_fuzzer" -max_total_time="$secs" -rss_limit_mb=2048 \
      -print_final_stats=1 "$work/xml" "$ROOT/tests/fuzz/corpus_xml"
    ;;
  compare)
    install_missing "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    build_main
    /usr/bin/python3 "$ROOT/tests/py/seed_compare.py" --bench "$ROOT/build/codec/sluice-codec-bench"
    ;;
  image)
    # No registry here: the Dockerfile's Debian base is made locally (debootstrap + podman
    # import) and tagged with the names its FROM lines use. podman builds with chroot
    # isolation; it cannot start containers on these machines, so the smoke test runs the
    # image's own binaries with chroot in its mounted filesystem.
    install_missing podman debootstrap curl
    IMAGE=${IMAGE:-localhost/sluice:dev}
    PODMAN=(podman --cgroup-manager=cgroupfs)
    if ! "${PODMAN[@]}" image exists docker.io/library/debian:bookworm; then
      base=$(mktemp -d /tmp/sluice-base.XXXXXX)
      log "making the Debian 12 base image (debootstrap --variant=minbase bookworm)"
      debootstrap --variant=minbase bookworm "$base" http://deb.debian.org/debian >/dev/null
      # What Docker Hub's slim image leaves out too: the downloaded packages and the lists.
      rm -rf "$base"/var/cache/apt/archives/*.deb "$base"/var/lib/apt/lists/* \
        "$base"/usr/share/doc/* "$base"/usr/share/man/* "$base"/usr/share/locale/*
      tar -C "$base" -c . | "${PODMAN[@]}" import - docker.io/library/debian:bookworm >/dev/null
      "${PODMAN[@]}" tag docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim
      rm -rf "$base"
    fi
    log "building $IMAGE"
    "${PODMAN[@]}" build --isolation=chroot --network=host --pull=never \
      -f deploy/Dockerfile -t "$IMAGE" .
    log "smoke test: the image's sluice-server, sluice bench against it, its metrics"
    cid=$("${PODMAN[@]}" create "$IMAGE")
    mnt=$("${PODMAN[@]}" mount "$cid")
    trap 'umount "$mnt/proc" "$mnt/dev" 2>/dev/null; "${PODMAN[@]}" umount "$cid" >/dev/null; "${PODMAN[@]}" rm "$cid" >/dev/null' EXIT
    mount --bind /dev "$mnt/dev"
    mount -t proc proc "$mnt/proc"
    mkdir -p "$mnt/tmp/smoke" && chown 10001:10001 "$mnt/tmp/smoke"
    mport=$((20000 + RANDOM % 20000))
    chroot --userspec=10001:10001 "$mnt" /usr/local/bin/sluice-server --data_dir=/tmp/smoke \
      --listen=127.0.0.1:0 --metrics_listen="127.0.0.1:$mport" --log_level=warn \
      >"$mnt/tmp/smoke.out" 2>&1 &
    server=$!
    for _ in $(seq 1 100); do grep -q "listening on port" "$mnt/tmp/smoke.out" && break; sleep 0.1; done
    port=$(sed -n 's/^listening on port //p' "$mnt/tmp/smoke.out")
    chroot --userspec=10001:10001 "$mnt" /usr/local/bin/sluice bench --server "127.0.0.1:$port"
    # The metrics endpoint answers from the image too (its runtime libraries included).
    curl -sf "http://127.0.0.1:$mport/metrics" | grep -E '^sluice_(commits|fetch_records)_total'
    kill -TERM "$server" && wait "$server"
    log "image size: $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE") bytes"
    "${PODMAN[@]}" images "$IMAGE"
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
