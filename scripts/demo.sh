#!/usr/bin/env bash
# Demo: two simulated vLLM workers behind llmgw, a few requests, read-back.
# Uses ports 8001, 8002 (workers), 8080 (gateway) and 8081 (admin).
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/llmgw ./cmd/llmgw
state=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT INT TERM

for port in 8001 8002 8080 8081; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "port $port is in use; stop what listens there and retry" >&2
    exit 1
  fi
done

bin/llmgw sim --engine vllm --listen 127.0.0.1:8001 >"$state/w1.json" & pids+=($!)
bin/llmgw sim --engine vllm --listen 127.0.0.1:8002 >"$state/w2.json" & pids+=($!)
bin/llmgw serve --state-dir "$state/gw" --rules examples/two-workers.yaml 2>"$state/gw.log" & pids+=($!)

wait_ready() { # url
  for _ in $(seq 1 200); do
    curl -fsS "$1" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "timed out waiting for $1" >&2; cat "$state/gw.log" >&2; exit 1
}
wait_ready http://127.0.0.1:8001/health
wait_ready http://127.0.0.1:8002/health
wait_ready http://127.0.0.1:8081/readyz

echo "== the same conversation three times: CHWBL keeps it on one worker"
for i in 1 2 3; do
  curl -sS -o /dev/null -D - http://127.0.0.1:8080/v1/chat/completions \
    -d '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."}]}' \
    | grep -i -E '^(HTTP|x-llmgw|x-request-id)'
done
echo "== a streamed completion"
curl -sSN http://127.0.0.1:8080/v1/completions \
  -d '{"model":"Qwen/Qwen3-0.6B","prompt":"Once upon a time","max_tokens":5,"stream":true}'
echo "== the rule as the gateway runs it"
bin/llmgw rule list
echo "== gateway metrics (excerpt)"
curl -sS http://127.0.0.1:8081/metrics | grep -E '^llmgw_(requests_total|inflight)' | head
