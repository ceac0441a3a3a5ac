"""The spec's Document QA trace (Module 1 exit task), the report's default input and its template.

All timings are the spec's synthetic illustration, not a measurement. `attnscope report --print-trace`
prints this text; edit a copy and pass it as TRACE.
"""

DEFAULT_TRACE_YAML = """\
# attnscope report trace: one request's serial critical path (all timings synthetic: spec exit task).
title: Document QA endpoint, latency attribution
workload:
  model: nominal 8B dense (untied LM head)
  params: 8.0e+9           # parameter count: dense FLOPs per prompt token = 2 * params
  dtype: fp16
  layers: 32
  heads: 32                # query heads
  d: 128                   # head dimension
  kv_heads: 32             # optional: K/V heads (GQA: fewer; default heads)
  device: h200             # optional: the device of the decode DRAM ceiling (a100, h100, h200)
  concurrency: 8           # closed-loop clients
  prompt_tokens: 4096
  output_tokens: 128
targets:
  p95_ttft_ms: 350.0       # client p95 time to first token
  tokens_per_s: 25.0       # decode per user; or tpot_ms: 40.0
segments:                  # strictly serial, non-overlapping; client TTFT = their sum
  - name: Client ↔ server network
    ms: 15.0
    source: Synchronized socket ingress delta
    note: Synthetic transport estimate
  - name: Server admission queue
    ms: 65.0
    source: Server enqueue → dequeue timestamps
    note: Dwell waiting for batch slot
  - name: GPU prefill execution
    ms: 290.0
    source: Hypothetical CUDA profiler span
    note: 40% attention (116.0 ms), 60% MLP/norms (174.0 ms)
  - name: Serialization & stream
    ms: 10.0
    source: First SSE chunk serialization
    note: Emitting first streamed chunk
ttft:
  ms: 380.0                # optional: the client timer; must not be less than the segments' sum
  source: Client socket timer
prefill:
  segment: GPU prefill execution
  attention_ms: 116.0      # or attention_share: 0.40
  source: Hypothetical CUDA profiler span
decode:
  tpot_ms: 32.0
  source: Client inter-chunk timer
change:
  description: Enable the FlashAttention-2 causal kernel in prefill
  segment: GPU prefill execution   # the speedup applies to this segment's attention part
  speedup: 3.0
  source: Assumed kernel speedup on matching shapes (not measured)
"""
