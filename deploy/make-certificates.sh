#!/usr/bin/env bash
# Make a private CA and a SuperLink server certificate for TLS between meancache devices
# (SuperNodes) and the FL server (SuperLink), plus a key pair per SuperNode for SuperNode
# authentication.
#
#   deploy/make-certificates.sh OUT_DIR [HOST_OR_IP ...] [--supernodes N]
#
# OUT_DIR/ca.crt goes to every device (--root-certificate); OUT_DIR is what
# `meancache fl server --certificates OUT_DIR` reads (ca.crt, server.pem, server.key).
# localhost and 127.0.0.1 are always in the certificate's names.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [HOST_OR_IP ...] [--supernodes N]" >&2
  exit 2
fi
out=$1; shift
names=(localhost 127.0.0.1)
supernodes=0
while [ $# -gt 0 ]; do
  case "$1" in
    --supernodes) supernodes=$2; shift 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
mkdir -p "$out"
cd "$out"

san=""
for name in "${names[@]}"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+="IP:$name,"; else san+="DNS:$name,"; fi
done
san=${san%,}

# ECDSA P-256 keys: as strong as RSA-3072 (NIST SP 800-57), and made in milliseconds where
# an RSA-4096 key takes seconds of CPU.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
openssl req -x509 -new -nodes -key ca.key -sha256 -days 825 -subj "/CN=meancache FL CA" \
  -out ca.crt
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out server.key
openssl req -new -key server.key -subj "/CN=${names[0]}" -out server.csr
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' \
  "$san" > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
  -sha256 -extfile server.ext -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl
chmod 600 ca.key server.key

for i in $(seq 1 "$supernodes"); do
  # SuperNode authentication: an EC key pair per device; register the public key with
  # `flwr supernode register supernode-$i.pub <connection>`.
  ssh-keygen -q -t ecdsa -b 384 -N "" -f "supernode-$i" -C "meancache supernode $i"
done

echo "made in $out: ca.crt (give to devices), server.pem + server.key (SuperLink)" \
  "${supernodes:+and $supernodes SuperNode key pair(s)}" >&2
