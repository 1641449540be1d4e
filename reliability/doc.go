// Package reliability holds llmgw's end-to-end fault suite and soak tool.
//
// The fault tests (build tag "faults"; run with `make test-faults`) start the
// llmgw binary as child processes — the gateway (`llmgw serve`) and engine
// simulators (`llmgw sim`) on 127.0.0.1 with kernel-chosen ports — inject one
// fault each (a worker killed mid-stream, a worker down and back, a KV event
// publisher restart or sequence gap, a second TRT-LLM event consumer, the
// gateway killed with SIGKILL, concurrent management writes, slow and
// vanishing clients, header and body floods, network partitions between
// Docker containers) and assert what the client sees and that nothing
// acknowledged is lost. RELIABILITY.md at the module root lists each fault,
// its test and its outcome.
//
// The soak tool is ./reliability/soak (`make soak`). Shared child-process
// plumbing is in ./reliability/harness.
package reliability
