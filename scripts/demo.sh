#!/usr/bin/env bash
# make demo: start the dev servers, prove both serve through kazoo and pika, stop them.
set -euo pipefail
dir=.latchwork/demo
zk_port=${LATCHWORK_DEMO_ZK_PORT:-22181}
amqp_port=${LATCHWORK_DEMO_AMQP_PORT:-25673}

cleanup() { latchwork dev down --dir "$dir" || true; }
trap cleanup EXIT

echo "== latchwork dev up (ZooKeeper ensemble of 3 + RabbitMQ, bound to 127.0.0.1)"
eval "$(latchwork dev up --dir "$dir" --zk-ensemble 3 --zk-port "$zk_port" --amqp-port "$amqp_port")"
echo "LATCHWORK_ZK_HOSTS=$LATCHWORK_ZK_HOSTS"
echo "LATCHWORK_AMQP_URL=$LATCHWORK_AMQP_URL"
echo "== latchwork dev status"
latchwork dev status --dir "$dir"
echo "== latchwork dev check (kazoo ephemeral node, pika confirmed publish)"
latchwork dev check
echo "== latchwork dev down"
