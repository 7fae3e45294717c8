"""The seed's load test: a workload from the inventory, `vllm bench serve` against the gateway or one
instance, the instances' /metrics before and after, and a report judged against SLOs (P99 TTFT, failures,
prefix-cache hit rate, speculative acceptance)."""
