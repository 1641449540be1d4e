#!/bin/sh
# trt-idle-cost.sh BIN TOKENIZER [SECONDS]: the idle cost of TensorRT-LLM
# event polling. One `BIN sim --engine trtllm`, one `BIN serve` with a
# KV-exact rule on it, no traffic. After a 3 s settle it reports, over
# SECONDS (default 30): the CPU time of the gateway and of the simulator
# (from /proc/PID/stat), the sockets on the worker's port in TIME-WAIT and
# established, and the drains the gateway sent (llmgw_kv_event_polls_total,
# where BIN has it). TOKENIZER is a tokenizer.json (with its
# tokenizer_config.json beside it) or a models directory.
set -e
BIN=$1 TOK=$2 IDLE=${3:-30}
D=$(mktemp -d)
trap 'kill $GW $SIM 2>/dev/null; rm -rf $D' EXIT
$BIN sim --engine trtllm --listen 127.0.0.1:0 --receipts=false >$D/sim.json 2>$D/sim.err &
SIM=$!
until grep -q '"http"' $D/sim.json 2>/dev/null; do sleep 0.1; done
PORT=$(sed -n 's/.*"http":"127.0.0.1:\([0-9]*\)".*/\1/p' $D/sim.json | head -1)
ADMIN=127.0.0.1:$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
cat >$D/rule.yaml <<R
name: trt
model_name: m
sel: 8
kvEngineType: trtllm
kvExactMode: 3
kvBlockSize: 32
kvTokenizer: $TOK
probe: {disabled: true}
endpoints:
  - {id: w1, endpointIP: 127.0.0.1, targetPort: $PORT}
R
$BIN serve --listen 127.0.0.1:0 --admin $ADMIN --state-dir $D/state --rules $D/rule.yaml >$D/gw.out 2>$D/gw.err &
GW=$!
sleep 3
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
polls() { curl -s http://$ADMIN/metrics | awk '/^llmgw_kv_event_polls_total/ {print $2}'; }
G0=$(cpu $GW) S0=$(cpu $SIM) P0=$(polls)
sleep $IDLE
G1=$(cpu $GW) S1=$(cpu $SIM) P1=$(polls)
TW=$(ss -tan state time-wait "( dport = :$PORT or sport = :$PORT )" | tail -n +2 | wc -l)
EST=$(ss -tan state established "( dport = :$PORT )" | tail -n +2 | wc -l)
awk -v g=$((G1-G0)) -v s=$((S1-S0)) -v t=$(getconf CLK_TCK) -v d=$IDLE -v p0="$P0" -v p1="$P1" -v tw=$TW -v est=$EST 'BEGIN {
	printf "idle %d s: gateway CPU %.0f ms (%.2f%% of a core), simulator CPU %.0f ms (%.2f%%), sockets on the worker port: %d TIME-WAIT, %d established", d, 1000*g/t, 100*g/t/d, 1000*s/t, 100*s/t/d, tw, est
	if (p1 != "") printf ", drains %.1f a second", (p1-p0)/d
	printf "\n" }'
