#!/bin/bash
# The TLS tests' certificates, made fresh by each test with openssl (P-256 keys), in DIR:
#   ca.pem ca.key                      the test CA
#   server.pem server.key              CN=sluice-server, names localhost and 127.0.0.1 (by ca)
#   server2.pem server2.key            CN=sluice-server-2, the same names (a rotation's new one)
#   server-expired.pem .key            expired yesterday (by ca)
#   client-a.pem .key, client-b.pem .key   CN=tenant-a, CN=tenant-b (by ca)
#   client-expired.pem .key            CN=tenant-a, expired yesterday (by ca)
#   peer.pem peer.key                  CN=sluice-peer, a client certificate the servers show each
#                                      other (--peer_tls_cert) under mutual TLS (by ca)
#   other-ca.pem other-ca.key          another CA; other-client.pem .key (CN=tenant-a) by it
#   inter.pem inter.key                an intermediate CA signed by ca
#   chained.pem chained.key            CN=sluice-server-chained by inter; chained-full.pem is it
#                                      followed by inter.pem (the chain a server sends)
#
#   bash tests/harness/make_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
ca() {  # name CN [parent CA]
  key "$1"
  if [[ -z ${3:-} ]]; then
    openssl req -x509 -new -key "$1.key" -out "$1.pem" -subj "/CN=$2" -days 30 \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
    return
  fi
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -out "$1.pem" \
    -days 30 -extfile <(printf 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n') \
    2>/dev/null
  rm -f "$1.csr"
}
cert() {  # name CN ca days [server]
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2"
  local ext="basicConstraints=CA:FALSE"
  if [[ ${5:-} == server ]]; then
    ext+=$'\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth'
  else
    ext+=$'\nextendedKeyUsage=clientAuth'
  fi
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -out "$1.pem" \
    -days "$4" -extfile <(printf '%s\n' "$ext") 2>/dev/null
  rm -f "$1.csr"
}
ca ca "Sluice test CA"
ca other-ca "Another CA"
cert server sluice-server ca 30 server
cert server2 sluice-server-2 ca 30 server
cert server-expired sluice-server ca -1 server
cert client-a tenant-a ca 30
cert client-b tenant-b ca 30
cert client-expired tenant-a ca -1
cert peer sluice-peer ca 30
cert other-client tenant-a other-ca 30
ca inter "Sluice test intermediate" ca
cert chained sluice-server-chained inter 30 server
cat chained.pem inter.pem >chained-full.pem
chmod 600 ./*.key
