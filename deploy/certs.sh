#!/bin/sh
# A throwaway CA and the certificates of the compose deployment (docker-compose.yml), made once
# into the `certs` volume: a server certificate for every service name and a client certificate
# for the latchwork nodes. Keys are PKCS#8 ("BEGIN PRIVATE KEY"), which ZooKeeper's PEM reader
# needs. Replace them with your own CA's for anything but a first look.
set -eu
out="${1:-/certs}"
[ -f "$out/ca.pem" ] && { echo "certificates already in $out"; exit 0; }
command -v openssl >/dev/null || apk add --no-cache openssl >/dev/null
mkdir -p "$out" && cd "$out"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 825 \
    -subj "/CN=latchwork compose CA"
printf "subjectAltName=DNS:zk1,DNS:zk2,DNS:zk3,DNS:rabbitmq,DNS:gremlin,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n" > server.ext
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=latchwork servers"
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile server.ext -out server.crt
cat server.key server.crt > server.pem
printf "extendedKeyUsage=clientAuth\n" > client.ext
openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=latchwork-node"
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile client.ext -out client.crt
rm -f ./*.csr ./*.ext ca.key
chmod 0644 ./*.pem ./*.crt ./*.key  # read by the servers' own users inside their images
echo "certificates written to $out"
